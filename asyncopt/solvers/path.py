"""A path's solves of an L1 problem in one compiled loop each (``kernels.ws_loop``):
what ``lasso_path`` and the CV estimators run for the Lasso, the elastic net and L1
logistic regression on the serial backend.

A warm-started solve on a path needs one or two working-set steps (tens of microseconds
of passes on small data); the Driver's set-up, certificates, screening and compactions
in Python cost about a millisecond around them. ``CompiledPath`` keeps the state a path
carries from one alpha to the next (w, b, the margins, the full set's columns) and
solves each alpha with ``working_set_ddss_solve``: the Driver's loop with the
working-set step, the same certificate, safe test and inner solvers, compiled."""
import time
from types import SimpleNamespace

import numpy as np

from ..kernels.ws_loop import working_set_ddss_solve
from . import working_set as ws
from .ddss import SolverResult, history_record


def compiled_path_applies(problem, method, backend, verbose):
    """Whether ``CompiledPath`` solves a path of ``problem`` with ``method`` on
    ``backend``: the L1 penalty (weighted, positive, elastic net), the methods whose
    inner step is the working set's or chosen by "auto" (which takes it on a warm
    start), serially, without the live line (``verbose`` 0: the Driver's solves print
    it); for a loss that is not quadratic, on data with at most as many rows as
    features: on taller data the Driver's Newton directions from the Hessian on W,
    which the compiled loop leaves out, end its sets in fewer outer iterations
    (benchmarks/notes/path_overhead.md)."""
    return (problem.penalty.kernels == "l1" and backend == "serial" and
            method in ("auto", "working_set") and not verbose and
            (problem.loss.quadratic or problem.n_samples <= problem.n_features))


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
        self.z = np.zeros(full.y.shape[0])        # the margins A w + b
        self.b = 0.0
        self.kept = np.empty(full.n_features, dtype=np.int64)
        # A^T rho at (w, b) by feature, valid where ``fresh``: the next alpha's first
        # certificate, at the same point, reuses it
        self.raw = np.zeros(full.n_features)
        self.fresh = False

    def solve(self, lam, tol, max_epochs, screening=True):
        problem, penalty = self.problem, self.problem.penalty
        n = problem.n_samples
        began = time.perf_counter()
        self.b, primal, dual, outer, steps, kept, self.fresh = working_set_ddss_solve(
            problem.loss.code, problem.loss.quadratic, problem.loss.lipschitz,
            *self.columns, self.rows, self.kept, self.raw, self.fresh, self.y,
            self.sample_weight, self.sq_norms, self.weights, float(lam),
            penalty.positive, penalty.l2, problem.fit_intercept, self.w, self.z,
            float(self.b),
            tol * n * self.reference, max_epochs, bool(screening), ws.FIRST_SIZE,
            ws.INNER_FRACTION, ws.ANDERSON, ws.CHECK_EVERY, ws.ORTHANT_EVERY,
            ws.ORTHANT_CG, ws.MAX_INNER_EPOCHS, ws.MAX_NEWTON_STEPS, ws.MAX_CD_PASSES)
        primal, dual = primal / n, dual / n
        kept = self.kept[:kept]
        coef = np.zeros(problem.n_features)
        coef[self.features] = self.w
        cert = SimpleNamespace(primal=primal, dual=dual)
        record = history_record(outer, time.perf_counter() - began, cert, self.reference,
                                SimpleNamespace(nnz=None, problem=problem), self.w[kept],
                                int(steps))
        return SolverResult(coef, float(self.b), int(outer), primal, dual, record["gap"],
                            self.features[kept], record["gap"] <= tol * self.reference,
                            [record])
