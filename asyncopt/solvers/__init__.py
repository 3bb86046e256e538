"""Solvers: the DDSS outer loop (shared by every backend) and the per-backend inner loops."""
from .ddss import SolverResult, solve_ddss

__all__ = ["SolverResult", "solve_ddss"]
