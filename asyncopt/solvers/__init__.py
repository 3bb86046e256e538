"""Solvers: the DDSS outer loop (shared by every backend) and the per-backend inner loops."""
from .ddss import SolverResult, solve_ddss
from .pse import solve_pse

__all__ = ["SolverResult", "solve_ddss", "solve_pse"]
