"""A path's solves of the L1 squared loss in one compiled loop each
(``kernels.lasso_loop``): what ``lasso_path`` and the CV estimators run for the Lasso
and the elastic net on the serial backend.

A warm-started solve on a path needs one or two working-set steps (tens of microseconds
of passes on small data); the Driver's set-up, certificates, screening and compactions
in Python cost about a millisecond around them. ``CompiledPath`` keeps the state a path
carries from one alpha to the next (w, b, the residual, the full set's columns) and
solves each alpha with ``lasso_ddss_solve``: the Driver's loop with the working-set
step, the same certificate, safe test and inner solver, compiled."""
import time
from types import SimpleNamespace

import numpy as np

from ..kernels.lasso_loop import lasso_ddss_solve
from . import working_set as ws
from .ddss import SolverResult, history_record


def compiled_path_applies(problem, method, backend, verbose):
    """Whether ``CompiledPath`` solves a path of ``problem`` with ``method`` on
    ``backend``: the squared loss with the L1 penalty (weighted, positive, elastic net),
    the methods whose inner step is the working set's or chosen by "auto" (which takes
    it on a warm start), serially, without the live line (``verbose`` 0: the Driver's
    solves print it)."""
    return (problem.loss.quadratic and problem.penalty.kernels == "l1" and
            backend == "serial" and method in ("auto", "working_set") and not verbose)


class CompiledPath:
    """The solves of one path on ``problem``'s data (its loss, penalty, intercept and
    sample weights; lam given per solve), each warm-started from the one before (the
    first from w = 0).

    ``solve(lam, tol, max_epochs, screening)`` -> SolverResult: G <= tol P(0) (P(0) with
    the optimal intercept, as every DDSS solve's relative gap), at most ``max_epochs``
    outer iterations; its history holds one record, the last certificate's."""

    def __init__(self, problem):
        full = problem.full_active_set()
        columns = problem.full_columns()
        self.problem = problem
        self.columns = (columns.indptr, columns.rows, columns.data)
        self.rows = (full.indptr, full.indices, full.data)
        self.features = full.features
        self.y, self.sample_weight = full.y, full.sample_weight
        self.sq_norms, self.weights = full.column_sq_norms, full.weights
        self.reference = problem.null_objective()
        self.w = np.zeros(full.n_features)
        self.r = full.y.copy()
        self.b = 0.0
        self.kept = np.empty(full.n_features, dtype=np.int64)

    def solve(self, lam, tol, max_epochs, screening=True):
        problem, penalty = self.problem, self.problem.penalty
        n = problem.n_samples
        began = time.perf_counter()
        self.b, primal, dual, outer, passes, kept = lasso_ddss_solve(
            *self.columns, self.rows, self.kept, self.y, self.sample_weight,
            self.sq_norms, self.weights, float(lam), penalty.positive, penalty.l2,
            problem.fit_intercept, self.w, self.r, float(self.b),
            tol * n * self.reference, max_epochs, bool(screening), ws.FIRST_SIZE,
            ws.INNER_FRACTION, ws.ANDERSON, ws.CHECK_EVERY, ws.ORTHANT_EVERY,
            ws.ORTHANT_CG, ws.MAX_INNER_EPOCHS)
        primal, dual = primal / n, dual / n
        kept = self.kept[:kept]
        coef = np.zeros(problem.n_features)
        coef[self.features] = self.w
        cert = SimpleNamespace(primal=primal, dual=dual)
        record = history_record(outer, time.perf_counter() - began, cert, self.reference,
                                SimpleNamespace(nnz=None, problem=problem), self.w[kept],
                                int(passes))
        return SolverResult(coef, float(self.b), int(outer), primal, dual, record["gap"],
                            self.features[kept], record["gap"] <= tol * self.reference,
                            [record])
