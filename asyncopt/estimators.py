"""scikit-learn style estimators on the DDSS solver.

    Lasso:                    (1/2n) ||y - X w - b||^2 + alpha sum_j w_j |x_j|
    GroupLasso:               (1/2n) ||y - X w - b||^2 + alpha sum_g w_g ||x_g||_2
    SparseLogisticRegression: (1/n) sum_i log(1 + exp(-y_i (x_i^T w + b))) + alpha Omega(w)

The optimisation stops when the duality gap G <= tol * P(0); ``dual_gap_`` is that
certificate (an upper bound on P(coef_) - P*).
"""
import warnings

import numpy as np
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model._base import LinearClassifierMixin
from sklearn.utils.extmath import safe_sparse_dot
from sklearn.utils.validation import check_is_fitted, validate_data

from .penalties import L1, GroupL1
from .problem import Problem, check_lam, encode_binary_labels
from .solvers.methods import (BACKENDS, METHODS, MPI_METHODS, solve_method,  # noqa: F401
                              solver_flags)
from .solvers.threads import ThreadsInnerLoop, effective_n_jobs


def _check_choice(value, choices, what):
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}: expected one of {sorted(choices)}")


class _DDSSModel(BaseEstimator):
    """Shared fit logic: validation, problem set-up, solve, fitted attributes."""

    _loss = "squared"

    def __init__(self, alpha=1.0, *, fit_intercept=True, tol=1e-4, max_epochs=200,
                 method="auto", backend="serial", n_jobs=None, kernel="auto",
                 screening=True, weights=None, warm_start=False, step_scale=1.0,
                 random_state=None, verbose=0, checkpoint=None):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_epochs = max_epochs
        self.method = method
        self.backend = backend
        self.n_jobs = n_jobs
        self.kernel = kernel
        self.screening = screening
        self.weights = weights
        self.warm_start = warm_start
        self.step_scale = step_scale
        self.random_state = random_state
        self.verbose = verbose
        self.checkpoint = checkpoint

    def _penalty(self, n_features):
        groups = getattr(self, "groups", None)
        if groups is None:
            return L1(n_features, self.weights)
        return GroupL1(n_features, groups, self.weights)

    def _check_params(self):
        check_lam(self.alpha)
        _check_choice(self.method, METHODS, "method")
        _check_choice(self.backend, BACKENDS, "backend")
        if not (np.isfinite(self.tol) and self.tol > 0):
            raise ValueError(f"tol must be > 0, got {self.tol}")
        if int(self.max_epochs) < 0:
            raise ValueError(f"max_epochs must be >= 0, got {self.max_epochs}")
        if not (np.isfinite(self.step_scale) and self.step_scale > 0):
            raise ValueError(f"step_scale must be > 0, got {self.step_scale}")
        effective_n_jobs(self.n_jobs)
        if self.backend == "threads":
            ThreadsInnerLoop(self.n_jobs, self.kernel)

    def _solve(self, X, y):
        self._check_params()
        problem = Problem(X, y, self._loss, self._penalty(X.shape[1]), self.alpha,
                          self.fit_intercept)
        warm = self.warm_start and hasattr(self, "coef_") and \
            np.ravel(self.coef_).shape[0] == X.shape[1]
        coef_init = np.ravel(self.coef_) if warm else None
        intercept_init = float(np.ravel(self.intercept_)[0]) if warm else 0.0
        if self.backend == "mpi":
            result = self._solve_mpi(X, problem, coef_init, intercept_init)
        else:
            result = self._solve_here(problem, coef_init, intercept_init)
        if not result.converged and self.max_epochs > 0 and result.history:
            warnings.warn(
                f"{type(self).__name__} did not reach tol={self.tol:g} in {self.max_epochs} "
                f"epochs (relative gap {result.history[-1]['rel_gap']:.2e}); increase "
                "max_epochs", ConvergenceWarning, stacklevel=3)
        self.n_iter_ = result.n_iter
        self.dual_gap_ = result.gap
        self.objective_ = result.primal
        self.active_set_ = np.sort(result.active_features)
        self.history_ = result.history
        return result

    def _solve_here(self, problem, coef_init, intercept_init):
        return solve_method(
            problem, self.method, tol=self.tol, max_epochs=int(self.max_epochs),
            screening=self.screening, coef_init=coef_init, intercept_init=intercept_init,
            step_scale=self.step_scale, random_state=self.random_state,
            verbose=self.verbose, checkpoint=self.checkpoint,
            inner_loop=ThreadsInnerLoop(self.n_jobs, self.kernel)
            if self.backend == "threads" else None)

    def _solve_mpi(self, X, problem, coef_init, intercept_init):
        """Dis-DDSS in an SPMD script started by mpirun: every rank calls fit with the
        same data; rank 0 serves, rank k >= 1 keeps its contiguous k-th shard of the rows
        and drops the rest. Every rank ends with the same coef_ / intercept_; history_ is
        kept by rank 0 (empty elsewhere). A warm start and the checkpoint are the
        server's (``solve_mpi``; the checkpoint is written every outer iteration).

        A user's mistake (the method, too few ranks, more workers than rows, a checkpoint
        the server cannot read) raises ValueError on every rank alike; any other error,
        which may strike some ranks only (a worker out of memory, a checkpoint the
        server cannot write), prints one message with its traceback and ends every rank
        (``wire.ending_every_rank_on_error``): the others would wait for the failed one
        forever."""
        from mpi4py import MPI

        from .solvers.mpi import solve_mpi
        from .comm.wire import ending_every_rank_on_error

        if self.method not in MPI_METHODS:
            raise ValueError(f"method {self.method!r} is not available on the mpi backend "
                             f"(yet): use one of {MPI_METHODS}")
        comm = MPI.COMM_WORLD
        if comm.Get_size() < 2:
            raise ValueError("backend='mpi' needs at least 2 MPI ranks (1 server + workers): "
                             "start the script with mpirun -n K, K >= 2")
        if X.shape[0] < comm.Get_size() - 1:    # an empty shard fails on its rank alone
            raise ValueError(f"backend='mpi': {comm.Get_size() - 1} workers for "
                             f"{X.shape[0]} rows: start at most one worker a row")
        with ending_every_rank_on_error(
                comm, f"asyncopt {type(self).__name__}.fit (backend='mpi')"):
            shard = None
            if comm.Get_rank() > 0:
                rows = np.array_split(np.arange(X.shape[0]), comm.Get_size() - 1)[
                    comm.Get_rank() - 1]
                X_rows = X[rows] if hasattr(X, "tocsr") else np.asarray(X)[rows]
                # X_rows is a copy: its arrays may serve as the first epoch view
                shard = Problem(X_rows, problem.y[rows], problem.loss, problem.penalty,
                                problem.lam, problem.fit_intercept, overwrite_X=True)
            return solve_mpi(comm, shard, problem.penalty, X.shape[1], problem.loss.code,
                             problem.lam, problem.fit_intercept, tol=self.tol,
                             max_epochs=int(self.max_epochs),
                             **solver_flags(self.method, self.screening),
                             step_scale=self.step_scale, random_state=self.random_state,
                             verbose=self.verbose, label=self.method,
                             checkpoint=self.checkpoint, coef_init=coef_init,
                             intercept_init=intercept_init)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


_COMMON_DOC = """
    alpha : float > 0, the regularization lam.
    fit_intercept : fit an unpenalized intercept b.
    tol : relative duality gap target: stop when G <= tol * P(0).
    max_epochs : maximum number of outer iterations (each about one pass over the rows).
    method : "auto" (default: per outer iteration, the inner step of "ddss" or
        "working_set" that has cut the duality gap fastest per unit of work so far,
        ``asyncopt.solvers.choice``; "ddss" for the group logistic model and, on the
        mpi backend, for group penalties), "ddss" (sparse prox-SVRG), "working_set" (between two
        certificates, the problem on a working set of the support and the worst
        violators, by (block) coordinate descent with Anderson extrapolation for the
        squared loss, by proximal Newton steps for the L1 logistic loss; not the group
        logistic model; on the mpi backend the L1 penalty only, by coordinate descent
        on the Gram (or Hessian) matrix the workers reduce), "ddss_naive" (plain stochastic
        prox steps) or
        the baselines "prox_asaga" (sparse proximal SAGA, no screening),
        "prox_asvrg" (proximal SVRG with dense steps, no screening), "pse_safe" and
        "pse_strong" (one static screening pass, safe sphere or strong rule + KKT check,
        then asynchronous block coordinate descent; no checkpoints).
    backend : "serial" (one thread), "threads" (Sha-DDSS: lock-free threads sharing x) or
        "mpi" (Dis-DDSS: in a script started by mpirun, rank 0 the parameter server, the
        other ranks workers on contiguous row shards; not the PSE methods).
    n_jobs : threads of the "threads" backend (None or -1: all cores).
    kernel : inner loop of the "threads" backend: "numba" (nogil kernels, racing plain
        stores), "native" (C/OpenMP, compare-and-swap stores; needs the built extension)
        or "auto" (numba, the faster of the two where measured).
    screening : apply the gap-safe screening test every outer iteration.
    warm_start : start from the previous coef_ / intercept_.
    step_scale : multiplier of the default step 1 / (3 L_max).
    random_state : seed of the row sampling.
    verbose : 0 silent, 1 live progress line, 2 one line per outer iteration.
    checkpoint : optional .npz path: the solution so far and the history are written there
        every minute (every outer iteration on the "mpi" backend, by rank 0) and at the
        end; a fit that finds it resumes from it (a warm start takes precedence).
"""


class Lasso(RegressorMixin, _DDSSModel):
    __doc__ = """Lasso: (1/2n) ||y - X w - b||^2 + alpha sum_j weights_j |w_j|, solved by DDSS.

    weights : optional positive per-feature weights (weighted L1).""" + _COMMON_DOC

    def fit(self, X, y):
        """Fit on X (n, p) dense or sparse and y (n,); returns self."""
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], dtype=np.float64,
                             y_numeric=True)
        result = self._solve(X, y)
        self.coef_ = result.coef
        self.intercept_ = result.intercept
        return self

    def predict(self, X):
        """X w + b."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse=["csr", "csc"], dtype=np.float64,
                          reset=False)
        return safe_sparse_dot(X, self.coef_) + self.intercept_


class GroupLasso(Lasso):
    __doc__ = """Group Lasso: (1/2n) ||y - X w - b||^2 + alpha sum_g weights_g ||w_g||_2.

    groups : int (consecutive groups of that size) or a list of index arrays partitioning
        the features.
    weights : optional positive per-group weights (default sqrt(group size)).""" + _COMMON_DOC

    def __init__(self, alpha=1.0, *, groups=1, fit_intercept=True, tol=1e-4,
                 max_epochs=200, method="auto", backend="serial", n_jobs=None,
                 kernel="auto", screening=True, weights=None, warm_start=False,
                 step_scale=1.0, random_state=None, verbose=0, checkpoint=None):
        super().__init__(alpha, fit_intercept=fit_intercept, tol=tol,
                         max_epochs=max_epochs, method=method, backend=backend,
                         n_jobs=n_jobs, kernel=kernel, screening=screening,
                         weights=weights,
                         warm_start=warm_start,
                         step_scale=step_scale, random_state=random_state, verbose=verbose,
                         checkpoint=checkpoint)
        self.groups = groups


class SparseLogisticRegression(LinearClassifierMixin, ClassifierMixin, _DDSSModel):
    __doc__ = """L1 (or group) penalized binary logistic regression solved by DDSS:
    (1/n) sum_i log(1 + exp(-y_i (x_i^T w + b))) + alpha Omega(w), labels of any two values.

    groups : None for L1, else as in GroupLasso.
    weights : optional positive per-feature (per-group) weights.""" + _COMMON_DOC

    _loss = "logistic"

    def __init__(self, alpha=1.0, *, fit_intercept=True, tol=1e-4, max_epochs=200,
                 method="auto", backend="serial", n_jobs=None, kernel="auto",
                 screening=True, groups=None, weights=None, warm_start=False,
                 step_scale=1.0, random_state=None, verbose=0, checkpoint=None):
        super().__init__(alpha, fit_intercept=fit_intercept, tol=tol,
                         max_epochs=max_epochs, method=method, backend=backend,
                         n_jobs=n_jobs, kernel=kernel, screening=screening,
                         weights=weights,
                         warm_start=warm_start,
                         step_scale=step_scale, random_state=random_state, verbose=verbose,
                         checkpoint=checkpoint)
        self.groups = groups

    def fit(self, X, y):
        """Fit on X (n, p) and binary labels y; returns self."""
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], dtype=np.float64)
        y_pm, self.classes_ = encode_binary_labels(y)
        result = self._solve(X, y_pm)
        self.coef_ = result.coef[np.newaxis, :]
        self.intercept_ = np.array([result.intercept])
        return self

    def predict_proba(self, X):
        """[P(classes_[0] | x), P(classes_[1] | x)] = [1 - s, s], s = sigmoid(x^T w + b)."""
        p1 = expit(self.decision_function(X))
        return np.column_stack([1.0 - p1, p1])

    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags


def lasso_path(X, y, *, alphas=None, n_alphas=100, eps=1e-3, fit_intercept=True,
               tol=1e-4, max_epochs=200, method="auto", backend="serial", n_jobs=None,
               kernel="auto", screening=True, groups=None, weights=None, loss="squared",
               random_state=None, verbose=0, return_results=False):
    """Solutions along decreasing alphas with warm starts (sklearn's lasso_path layout).

    Default grid: n_alphas values log-spaced from alpha_max down to eps * alpha_max.
    Each solve starts from the previous solution, so its first gap-safe test (at the warm
    start, with the dual point of the previous solution) already removes most features:
    screening is carried along the path. Returns (alphas, coefs (p, n_alphas),
    dual_gaps), plus the SolverResults when return_results.
    """
    _check_choice(method, METHODS, "method")
    _check_choice(backend, ("serial", "threads"), "backend of lasso_path")
    inner_loop = ThreadsInnerLoop(n_jobs, kernel) if backend == "threads" else None
    if loss == "logistic":
        y = encode_binary_labels(y)[0]
    n_features = np.shape(X)[1]
    penalty = L1(n_features, weights) if groups is None else \
        GroupL1(n_features, groups, weights)
    problem = Problem(X, y, loss, penalty, 1.0, fit_intercept)
    if alphas is None:
        top = problem.lam_max()
        if top <= 0:
            raise ValueError("alpha_max is 0 (y is constant or X is zero): nothing to fit")
        alphas = np.geomspace(top, top * eps, n_alphas)
    else:
        alphas = np.sort(np.asarray(alphas, dtype=np.float64))[::-1]
    coefs = np.zeros((n_features, len(alphas)))
    gaps = np.zeros(len(alphas))
    results = []
    coef, intercept = None, 0.0
    for k, alpha in enumerate(alphas):
        result = solve_method(problem.with_lam(alpha), method, tol=tol,
                              max_epochs=max_epochs, screening=screening, coef_init=coef,
                              intercept_init=intercept, random_state=random_state,
                              verbose=verbose, inner_loop=inner_loop)
        coef, intercept = result.coef, result.intercept
        coefs[:, k] = coef
        gaps[k] = result.gap
        results.append(result)
    if return_results:
        return alphas, coefs, gaps, results
    return alphas, coefs, gaps
