"""scikit-learn style estimators on the DDSS solver (problem 3-1, docs/design.md §1).

    Lasso:                    (1/2n) ||y - X w - b||^2 + alpha sum_j weights_j |w_j|
    ElasticNet:               (1/2n) ||y - X w - b||^2 + alpha l1_ratio ||w||_1
                              + alpha (1 - l1_ratio) / 2 ||w||_2^2
    GroupLasso:               (1/2n) ||y - X w - b||^2 + alpha sum_g weights_g ||w_g||_2
    SparseLogisticRegression: (1/n) sum_i log(1 + exp(-y_i (x_i^T w + b))) + alpha Omega(w)

``fit(X, y, sample_weight=s)`` weights row i's loss by c_i = s_i n / sum s
(scikit-learn's convention: the weights rescaled to sum to n), so that the datafit is
(1 / sum s) sum_i s_i f_i: scikit-learn's Lasso with the same ``sample_weight``, and
its LogisticRegression with C = 1 / (alpha sum s).

``positive=True`` (the L1 penalty) constrains w >= 0, as scikit-learn's Lasso does; the
intercept stays free. ``l1_ratio`` in (0, 1] (ElasticNet, SparseLogisticRegression) is
scikit-learn's elastic-net mixing: the solver's lam = alpha l1_ratio and L2 strength
mu = alpha (1 - l1_ratio) (``penalties.elastic_net_strengths``); l1_ratio = 1 is the L1
model, bit for bit.

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

from .penalties import L1, GroupL1, check_l1_ratio, elastic_net_strengths
from .problem import Problem, check_lam, encode_binary_labels, rescaled_sample_weight
from .runtime import blas_threads
from .solvers.choice import InnerChoice
from .solvers.local import blas_limit
from .solvers.path import CompiledPath, compiled_path_applies
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
        # ``positive``, ``l1_ratio``: parameters of the estimators of the L1 penalty (not
        # GroupLasso)
        return make_penalty(n_features, getattr(self, "groups", None), self.weights,
                            getattr(self, "positive", False), self._l1_ratio())

    def _l1_ratio(self):
        """The estimator's l1_ratio (1.0 where it has none: the L1 or group penalty)."""
        return getattr(self, "l1_ratio", 1.0)

    def _check_params(self):
        check_lam(self.alpha)
        check_l1_ratio(self._l1_ratio())
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

    def _solve(self, X, y, sample_weight=None):
        self._check_params()
        # the L1 part's lam = alpha l1_ratio (alpha itself at l1_ratio = 1); the L2
        # part's strength is the penalty's (``make_penalty``)
        lam, _ = elastic_net_strengths(self.alpha, self._l1_ratio())
        problem = Problem(X, y, self._loss, self._penalty(X.shape[1]), lam,
                          self.fit_intercept,
                          sample_weight=rescaled_sample_weight(sample_weight, X.shape[0]))
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
        from .comm import mpi_module
        from .solvers.mpi import solve_mpi
        from .comm.wire import ending_every_rank_on_error

        MPI = mpi_module()

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
                # X_rows is a copy: its arrays may serve as the first epoch view; the
                # weights, rescaled over all the rows, are the shard's as they are
                weights = problem.sample_weight
                shard = Problem(X_rows, problem.y[rows], problem.loss, problem.penalty,
                                problem.lam, problem.fit_intercept, overwrite_X=True,
                                sample_weight=None if weights is None else weights[rows])
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


def make_penalty(n_features, groups, weights, positive=False, l1_ratio=1.0):
    """The estimators' and ``lasso_path``'s penalty: L1 (``groups`` None; with
    ``positive``, plus the constraint w >= 0; with ``l1_ratio`` < 1, the elastic net's
    L2 part, l2 = (1 - l1_ratio) / l1_ratio relative to lam) or the group penalty of
    ``groups``; ValueError for ``positive`` or l1_ratio < 1 with groups, which the group
    penalty does not define, and for l1_ratio outside (0, 1]."""
    _, l2 = elastic_net_strengths(1.0, l1_ratio)
    if groups is None:
        return L1(n_features, weights, positive=positive, l2=l2)
    if positive:
        raise ValueError("positive=True constrains the coefficients of the L1 penalty; "
                         "the group penalty (groups) has no positive option: use "
                         "groups=None")
    if l2:
        raise ValueError("l1_ratio < 1 (the elastic net) is defined for the L1 penalty; "
                         "the group penalty (groups) has no L2 part: use groups=None or "
                         "l1_ratio=1")
    return GroupL1(n_features, groups, weights)


# The estimators' numpydoc docstrings are assembled from these pieces, one parameter
# entry per constructor argument, in each constructor's order.
_PARAMETER_DOCS = {
    "alpha": """
    alpha : float, default=1.0
        Regularization strength lam > 0 of the penalty term.""",
    "alpha_enet": """
    alpha : float, default=1.0
        Regularization strength > 0 of the whole penalty, scikit-learn's: the L1 part
        is alpha l1_ratio, the L2 part alpha (1 - l1_ratio).""",
    "l1_ratio": """
    l1_ratio : float, default=0.5
        The elastic-net mixing, in (0, 1] as scikit-learn's: the penalty is
        ``alpha l1_ratio sum_j weights_j |w_j| + alpha (1 - l1_ratio) / 2
        sum_j weights_j w_j^2``. 1 is the Lasso (the same fit, bit for bit); 0 (ridge) is
        refused with a ValueError, as nothing is sparse to screen. The L2 part enters
        the dual, the gap and the gap-safe test (docs/design.md §1) and every method's
        prox; the baselines ("prox_asaga", "prox_asvrg", "pse_*") refuse l1_ratio < 1,
        and the support Newton step is not taken.""",
    "l1_ratio_logistic": """
    l1_ratio : float, default=1.0
        The elastic-net mixing of the L1 penalty, in (0, 1] as scikit-learn's
        ``LogisticRegression(penalty="elasticnet")``: the penalty is ``alpha l1_ratio
        sum_j weights_j |w_j| + alpha (1 - l1_ratio) / 2 sum_j weights_j w_j^2`` (so
        ``C = 1 / (n alpha)`` matches scikit-learn's). 1: the L1 model; the group
        penalty takes only 1. As :class:`ElasticNet` for the methods.""",
    "groups_lasso": """
    groups : int or list of array-like, default=1
        An int g: consecutive groups of g features (the last one may be shorter); a list
        of index arrays: a partition of the features into groups.""",
    "groups_logistic": """
    groups : None, int or list of array-like, default=None
        None for the L1 penalty; else the groups of the group penalty, as in
        :class:`GroupLasso`.""",
    "fit_intercept": """
    fit_intercept : bool, default=True
        Fit an unpenalized intercept b; it is set to its exact optimum for the current w
        before every certificate.""",
    "tol": """
    tol : float, default=1e-4
        Relative duality-gap target: the fit stops when G <= tol * P(0), P(0) the objective
        at w = 0 with the optimal intercept.""",
    "max_epochs": """
    max_epochs : int, default=200
        Maximum number of outer iterations (certificates), each followed by an inner step
        of about one pass over the rows.""",
    "method": """
    method : str, default="auto"
        The inner step between two certificates. "auto": per outer iteration, the inner
        step of "ddss" or "working_set" that has cut the duality gap fastest per unit of
        work so far (``asyncopt.solvers.choice``; "ddss" for the group logistic model and,
        on the mpi backend, for group penalties). "ddss": sparse prox-SVRG. "working_set":
        the problem on a working set of the support and the worst violators, by (block)
        coordinate descent with Anderson extrapolation for the squared loss, by proximal
        Newton steps for the L1 logistic loss (not the group logistic model; on the mpi
        backend the L1 penalty only, by coordinate descent on the Gram or Hessian matrix
        the workers reduce). "ddss_naive": plain stochastic prox steps. The baselines:
        "prox_asaga" (sparse proximal SAGA, no screening), "prox_asvrg" (proximal SVRG
        with dense steps, no screening), "pse_safe" and "pse_strong" (one static screening
        pass, safe sphere or strong rule with a KKT check, then asynchronous block
        coordinate descent; no checkpoints).""",
    "backend": """
    backend : {"serial", "threads", "mpi"}, default="serial"
        "serial": one thread. "threads": Sha-DDSS, lock-free threads sharing w. "mpi":
        Dis-DDSS, in a script started by mpirun: rank 0 the parameter server, the other
        ranks workers on contiguous row shards (not the PSE methods).""",
    "n_jobs": """
    n_jobs : int or None, default=None
        Threads of the "threads" backend; None or -1: all cores, -k: cores + 1 - k.""",
    "kernel": """
    kernel : {"auto", "numba", "native"}, default="auto"
        Inner loop of the "threads" backend: "numba" (nogil kernels, racing plain stores),
        "native" (C/OpenMP, compare-and-swap stores; needs the built extension) or "auto"
        (numba, the default for its speed: benchmarks/notes/frontends.md).""",
    "screening": """
    screening : bool, default=True
        Apply the gap-safe screening test every outer iteration.""",
    "weights_l1": """
    weights : array-like of shape (n_features,), default=None
        Positive per-feature weights w_j of the weighted L1 norm; None: all 1.""",
    "weights_group": """
    weights : array-like of shape (n_groups,), default=None
        Positive per-group weights w_g; None: sqrt(group size), the usual choice (Yuan and
        Lin 2006) that penalizes groups of different sizes comparably.""",
    "weights_logistic": """
    weights : array-like, default=None
        Positive per-feature (L1) or per-group weights; None: 1 per feature, sqrt(group
        size) per group.""",
    "positive": """
    positive : bool, default=False
        Constrain the coefficients to w >= 0 (the intercept stays free), as
        scikit-learn's ``Lasso(positive=True)``: the penalty becomes alpha sum_j
        weights_j w_j on w >= 0, its prox max(u - t, 0), and the dual constraint, the
        gap-safe test and lam_max one-sided (docs/design.md §1). The L1 penalty only: a
        ValueError with ``groups``.""",
    "warm_start": """
    warm_start : bool, default=False
        Start from the previous ``coef_`` and ``intercept_`` when their shape fits.""",
    "step_scale": """
    step_scale : float, default=1.0
        Multiplier of the default step eta = 1 / (3 L_max), L_max = L_f max_i ||a_i||^2
        (max_i c_i ||a_i||^2 with sample weights c).""",
    "random_state": """
    random_state : int, numpy.random.Generator or None, default=None
        Seed of the row sampling of the inner loop.""",
    "verbose": """
    verbose : int, default=0
        0: silent; 1: a live progress line; 2: one line per outer iteration.""",
    "checkpoint": """
    checkpoint : str or path-like, default=None
        Optional .npz path: the solution so far and the history are written there every
        minute (every outer iteration on the "mpi" backend, by rank 0) and at the end; a
        fit that finds it resumes from it (a warm start takes precedence).""",
}

_ATTRIBUTE_DOCS = """
    n_iter_ : int
        Outer iterations run.
    dual_gap_ : float
        The final duality gap G: a certified upper bound on ``P(coef_, intercept_) - P*``.
    objective_ : float
        The primal objective P at the solution.
    active_set_ : ndarray of int
        Sorted ids of the features left after screening (a superset of the support).
    history_ : list of dict
        One record per outer iteration, its keys including ``epoch``, ``time``,
        ``primal``, ``dual``, ``gap``, ``rel_gap``, ``n_active``, ``active_nnz``,
        ``coef_nnz``, ``inner_steps``, ``bytes_sent``, ``bytes_recv``,
        ``staleness_mean`` and ``staleness_max`` (on the mpi backend kept by rank 0,
        empty elsewhere).
    n_features_in_ : int
        Number of features seen by ``fit``.
    feature_names_in_ : ndarray of str
        Feature names seen by ``fit``, when X has string column names."""


# the attributes of the regressors' own (Lasso, ElasticNet, GroupLasso)
_REGRESSION_ATTRIBUTES = """
    coef_ : ndarray of shape (n_features,)
        The coefficients w.
    intercept_ : float
        The intercept b (0.0 when ``fit_intercept`` is false)."""


def _estimator_doc(head, parameters, attributes, tail):
    """The numpydoc docstring of an estimator: ``head`` (summary and extended summary),
    the entries of ``parameters`` (keys of _PARAMETER_DOCS), ``attributes`` before the
    shared attribute entries, then ``tail`` (See Also, Notes, Examples)."""
    return (head + "\n\n    Parameters\n    ----------"
            + "".join(_PARAMETER_DOCS[name] for name in parameters)
            + "\n\n    Attributes\n    ----------" + attributes + _ATTRIBUTE_DOCS
            + "\n" + tail)


_DDSS_NOTES = """
    Notes
    -----
    DDSS (Xidong Wu, PhD thesis, 2024, chapter 3, Algorithms 4-6) alternates a
    certificate and an inner step. The certificate refits b, forms the dual point
    theta = rho / max(1, Omega^D(X^T rho) / (n alpha)) from the generalized residual
    rho_i = -c_i f'(x_i^T w + b) (eq. 3-2; c_i the rescaled sample weights, 1 without
    them), the gap G = P - D with D(theta) = -(1/n) sum_i c_i f*(-theta_i / c_i)
    (eq. 3-4), and deletes every block g with
    ||X_g^T theta|| + sqrt(2 n L_f G) ||C^(1/2) X_g|| < n alpha w_g, which is zero at
    every optimum (the gap-safe test of eq. 3-3, with the radius corrected by the factor
    n: docs/design.md §1). With ``positive=True`` the norms are one-sided: Omega^D(u) =
    max(0, max_j u_j / w_j) and X_j^T theta in the test. The inner step runs on the
    surviving features only: sparse prox-SVRG (eq. 3-6 and 3-8; docs/design.md §2) or a
    working-set step (docs/design.md §2b)."""

_ELASTIC_NET_NOTES = """

    With l1_ratio < 1 (the elastic net: lam = alpha l1_ratio, mu = alpha (1 -
    l1_ratio)) the L2 term mu/2 sum_j weights_j w_j^2 is the squared loss of extra rows
    sqrt(n mu weights_j / L_f) e_j with target 0 (Ndiaye et al., JMLR 2017): alpha
    above reads lam, X^T rho becomes c = X^T rho - n mu weights * w, the dual scale is
    s = max(1, Omega^D(c) / (n lam)), D subtracts mu sum_j weights_j w_j^2 / (2 s^2),
    and the test is ``|c_j| / s + sqrt(2 n L_f G) sqrt(||X_j||^2 + n mu weights_j /
    L_f) < n lam weights_j`` (docs/design.md §1). Every step's prox is the soft
    threshold then the shrink 1 / (1 + t mu weights_j); the support Newton step, whose
    model is the loss's, is not taken."""

class Lasso(RegressorMixin, _DDSSModel):
    __doc__ = _estimator_doc(
        """Lasso: least squares with a (weighted) L1 penalty, solved by DDSS.

    Minimises, over the coefficients w and the intercept b::

        P(w, b) = (1/2n) ||y - X w - b||^2 + alpha sum_j weights_j |w_j|,

    problem (3-1) of the thesis with the squared loss f_i(z) = (y_i - z)^2 / 2 in
    scikit-learn's scaling (docs/design.md §1); ``fit(X, y, sample_weight=s)`` takes
    (1 / (2 sum s)) sum_i s_i (y_i - x_i^T w - b)^2 for the first term, as
    scikit-learn's Lasso does. The fit stops when the duality gap
    G <= tol * P(0); ``dual_gap_`` is that certificate.""",
        ["alpha", "fit_intercept", "tol", "max_epochs", "method", "backend", "n_jobs",
         "kernel", "screening", "weights_l1", "positive", "warm_start", "step_scale",
         "random_state", "verbose", "checkpoint"],
        _REGRESSION_ATTRIBUTES,
        """
    See Also
    --------
    GroupLasso : The same loss with a group penalty.
    lasso_path : Solutions along a grid of alphas, with screening carried along.
    lam_max : The smallest alpha whose solution is w = 0.
""" + _DDSS_NOTES + """

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import Lasso
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((50, 10))
    >>> y = X[:, 0] - 2 * X[:, 1]
    >>> model = Lasso(alpha=0.1, tol=1e-8).fit(X, y)
    >>> model.coef_.shape
    (10,)
    >>> bool(model.dual_gap_ <= 1e-8 * model.history_[0]["primal"])
    True
""")

    def __init__(self, alpha=1.0, *, fit_intercept=True, tol=1e-4, max_epochs=200,
                 method="auto", backend="serial", n_jobs=None, kernel="auto",
                 screening=True, weights=None, positive=False, warm_start=False,
                 step_scale=1.0, random_state=None, verbose=0, checkpoint=None):
        super().__init__(alpha, fit_intercept=fit_intercept, tol=tol,
                         max_epochs=max_epochs, method=method, backend=backend,
                         n_jobs=n_jobs, kernel=kernel, screening=screening,
                         weights=weights, warm_start=warm_start, step_scale=step_scale,
                         random_state=random_state, verbose=verbose,
                         checkpoint=checkpoint)
        self.positive = positive

    def fit(self, X, y, sample_weight=None):
        """Fit the model by DDSS.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data, dense or sparse (CSR or CSC).
        y : array-like of shape (n_samples,)
            Targets.
        sample_weight : float or array-like of shape (n_samples,), default=None
            Weights s_i >= 0 of the rows, not all zero; rescaled to sum to n_samples,
            as scikit-learn's Lasso does, so that the loss is
            (1 / (2 sum s)) sum_i s_i (y_i - x_i^T w - b)^2 (and the intercept the
            s-weighted optimum): scikit-learn's ``Lasso(alpha).fit(X, y, s)``. An
            integer weight k is k copies of the row, a zero weight drops it. None, a
            number or equal weights: the unweighted fit. ValueError for a wrong
            length, a negative, NaN or infinite weight, or all weights zero.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], dtype=np.float64,
                             y_numeric=True)
        result = self._solve(X, y, sample_weight)
        self.coef_ = result.coef
        self.intercept_ = result.intercept
        return self

    def predict(self, X):
        """Predict with the linear model.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,)
            X w + b.
        """
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse=["csr", "csc"], dtype=np.float64,
                          reset=False)
        return safe_sparse_dot(X, self.coef_) + self.intercept_


class ElasticNet(Lasso):
    __doc__ = _estimator_doc(
        """Elastic net: least squares with an L1 and an L2 penalty, solved by DDSS.

    Minimises, over the coefficients w and the intercept b::

        P(w, b) = (1/2n) ||y - X w - b||^2 + alpha l1_ratio sum_j weights_j |w_j|
                  + alpha (1 - l1_ratio) / 2 sum_j weights_j w_j^2,

    scikit-learn's ``ElasticNet`` (weights all 1) in its scaling: problem (3-1) of the
    thesis with lam = alpha l1_ratio and the L2 term mu ||w||_w^2 / 2, mu = alpha
    (1 - l1_ratio), in the penalty (docs/design.md §1). The weights multiply both parts,
    as glmnet's penalty factors do. The L2 part is smooth: it enters the dual through
    the correlation c = X^T rho - n mu (weights * w), the duality gap and the gap-safe
    test (the L2 term as extra rows of the data), and every method's prox, the soft
    threshold then the shrink 1 / (1 + t mu w_j). ``fit(X, y, sample_weight=s)`` takes
    (1 / (2 sum s)) sum_i s_i (y_i - x_i^T w - b)^2 for the first term, as
    scikit-learn's ElasticNet does (the L2 rows keep weight 1). The fit stops when the
    duality gap G <= tol * P(0); ``dual_gap_`` is that certificate.""",
        ["alpha_enet", "l1_ratio", "fit_intercept", "tol", "max_epochs", "method",
         "backend", "n_jobs", "kernel", "screening", "weights_l1", "positive",
         "warm_start", "step_scale", "random_state", "verbose", "checkpoint"],
        _REGRESSION_ATTRIBUTES,
        """
    See Also
    --------
    Lasso : l1_ratio = 1.
    ElasticNetCV : alpha and l1_ratio chosen by cross-validation.
    lasso_path : With ``l1_ratio``, solutions along a grid of alphas.
""" + _DDSS_NOTES + _ELASTIC_NET_NOTES + """

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import ElasticNet
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((50, 10))
    >>> y = X[:, 0] - 2 * X[:, 1]
    >>> model = ElasticNet(alpha=0.1, l1_ratio=0.5, tol=1e-8).fit(X, y)
    >>> model.coef_.shape
    (10,)
    >>> bool(model.dual_gap_ <= 1e-8 * model.history_[0]["primal"])
    True
""")

    def __init__(self, alpha=1.0, *, l1_ratio=0.5, fit_intercept=True, tol=1e-4,
                 max_epochs=200, method="auto", backend="serial", n_jobs=None,
                 kernel="auto", screening=True, weights=None, positive=False,
                 warm_start=False, step_scale=1.0, random_state=None, verbose=0,
                 checkpoint=None):
        super().__init__(alpha, fit_intercept=fit_intercept, tol=tol,
                         max_epochs=max_epochs, method=method, backend=backend,
                         n_jobs=n_jobs, kernel=kernel, screening=screening,
                         weights=weights, positive=positive, warm_start=warm_start,
                         step_scale=step_scale, random_state=random_state,
                         verbose=verbose, checkpoint=checkpoint)
        self.l1_ratio = l1_ratio


class GroupLasso(Lasso):
    __doc__ = _estimator_doc(
        """Group Lasso: least squares with a group penalty, solved by DDSS.

    Minimises, over the coefficients w and the intercept b::

        P(w, b) = (1/2n) ||y - X w - b||^2 + alpha sum_g weights_g ||w_g||_2,

    problem (3-1) of the thesis with the squared loss and Omega the sum of the groups'
    Euclidean norms (docs/design.md §1); ``fit(X, y, sample_weight=s)`` weights the
    rows as :class:`Lasso` does. The fit stops when the duality gap
    G <= tol * P(0).""",
        ["alpha", "groups_lasso", "fit_intercept", "tol", "max_epochs", "method",
         "backend", "n_jobs", "kernel", "screening", "weights_group", "warm_start",
         "step_scale", "random_state", "verbose", "checkpoint"],
        _REGRESSION_ATTRIBUTES,
        """
    See Also
    --------
    Lasso : The same loss with an L1 penalty (groups of one feature).
    SparseLogisticRegression : The logistic loss, with an L1 or group penalty.
""" + _DDSS_NOTES + "\n")

    def __init__(self, alpha=1.0, *, groups=1, fit_intercept=True, tol=1e-4,
                 max_epochs=200, method="auto", backend="serial", n_jobs=None,
                 kernel="auto", screening=True, weights=None, warm_start=False,
                 step_scale=1.0, random_state=None, verbose=0, checkpoint=None):
        # _DDSSModel's, not Lasso's: the group penalty has no ``positive``
        _DDSSModel.__init__(self, alpha, fit_intercept=fit_intercept, tol=tol,
                            max_epochs=max_epochs, method=method, backend=backend,
                            n_jobs=n_jobs, kernel=kernel, screening=screening,
                            weights=weights, warm_start=warm_start,
                            step_scale=step_scale, random_state=random_state,
                            verbose=verbose, checkpoint=checkpoint)
        self.groups = groups


class SparseLogisticRegression(LinearClassifierMixin, ClassifierMixin, _DDSSModel):
    __doc__ = _estimator_doc(
        """Binary logistic regression with an L1 or group penalty, solved by DDSS.

    Minimises, over the coefficients w and the intercept b::

        P(w, b) = (1/n) sum_i log(1 + exp(-y_i (x_i^T w + b))) + alpha Omega(w),

    ``Omega(w) = sum_j weights_j |w_j|`` (L1) or ``sum_g weights_g ||w_g||_2`` (``groups``):
    problem (3-1) of the thesis with the logistic loss, L_f = 1/4 (docs/design.md §1).
    With ``l1_ratio`` < 1 the L1 penalty is the elastic net's, alpha (l1_ratio ||w||_1
    + (1 - l1_ratio) / 2 ||w||_2^2), weighted by ``weights`` in both parts
    (scikit-learn's ``LogisticRegression(penalty="elasticnet", C=1 / (n alpha))``).
    Labels may take any two values: ``classes_[1]`` is coded +1, ``classes_[0]`` -1.
    ``fit(X, y, sample_weight=s)`` takes (1 / sum s) sum_i s_i log(1 + exp(-y_i (x_i^T w
    + b))) for the first term: scikit-learn's LogisticRegression with
    C = 1 / (alpha sum s) (C = 1 / (n alpha) without weights).
    The fit stops when the duality gap G <= tol * P(0).""",
        ["alpha", "fit_intercept", "tol", "max_epochs", "method", "backend", "n_jobs",
         "kernel", "screening", "groups_logistic", "weights_logistic", "positive",
         "l1_ratio_logistic", "warm_start", "step_scale", "random_state", "verbose",
         "checkpoint"],
        """
    classes_ : ndarray of shape (2,)
        The two labels, sorted.
    coef_ : ndarray of shape (1, n_features)
        The coefficients w.
    intercept_ : ndarray of shape (1,)
        The intercept b (0.0 when ``fit_intercept`` is false).""",
        """
    See Also
    --------
    Lasso : The squared loss with an L1 penalty.
    lasso_path : With ``loss="logistic"``, solutions along a grid of alphas.
""" + _DDSS_NOTES + _ELASTIC_NET_NOTES + "\n")

    _loss = "logistic"

    def __init__(self, alpha=1.0, *, fit_intercept=True, tol=1e-4, max_epochs=200,
                 method="auto", backend="serial", n_jobs=None, kernel="auto",
                 screening=True, groups=None, weights=None, positive=False,
                 l1_ratio=1.0, warm_start=False, step_scale=1.0, random_state=None,
                 verbose=0, checkpoint=None):
        super().__init__(alpha, fit_intercept=fit_intercept, tol=tol,
                         max_epochs=max_epochs, method=method, backend=backend,
                         n_jobs=n_jobs, kernel=kernel, screening=screening,
                         weights=weights,
                         warm_start=warm_start,
                         step_scale=step_scale, random_state=random_state, verbose=verbose,
                         checkpoint=checkpoint)
        self.groups = groups
        self.positive = positive
        self.l1_ratio = l1_ratio

    def fit(self, X, y, sample_weight=None):
        """Fit the model by DDSS.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data, dense or sparse (CSR or CSC).
        y : array-like of shape (n_samples,)
            Labels with exactly two distinct values.
        sample_weight : float or array-like of shape (n_samples,), default=None
            Weights s_i >= 0 of the rows, not all zero; rescaled to sum to n_samples
            (scikit-learn's convention for its Lasso), so that the loss is
            (1 / sum s) sum_i s_i log(1 + exp(-y_i (x_i^T w + b))): scikit-learn's
            ``LogisticRegression(penalty="l1", C=1 / (alpha sum s))`` fitted with
            the same ``sample_weight`` (its "saga" solver: the intercept unpenalized).
            An integer weight k is k copies of the row, a zero weight drops it. None,
            a number or equal weights: the unweighted fit. ValueError for a wrong
            length, a negative, NaN or infinite weight, or all weights zero.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], dtype=np.float64)
        y_pm, self.classes_ = encode_binary_labels(y)
        result = self._solve(X, y_pm, sample_weight)
        self.coef_ = result.coef[np.newaxis, :]
        self.intercept_ = np.array([result.intercept])
        return self

    def predict_proba(self, X):
        """Class probabilities.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, 2)
            [P(classes_[0] | x), P(classes_[1] | x)] = [1 - s, s] per row,
            s = sigmoid(x^T w + b).
        """
        p1 = expit(self.decision_function(X))
        return np.column_stack([1.0 - p1, p1])

    def predict_log_proba(self, X):
        """Logarithm of the class probabilities.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, 2)
            The logarithm of :meth:`predict_proba`.
        """
        return np.log(self.predict_proba(X))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags


def lasso_path(X, y, *, alphas=None, n_alphas=100, eps=1e-3, fit_intercept=True,
               tol=1e-4, max_epochs=200, method="auto", backend="serial", n_jobs=None,
               kernel="auto", screening=True, groups=None, weights=None, positive=False,
               l1_ratio=1.0, loss="squared", random_state=None, verbose=0,
               return_results=False, sample_weight=None):
    """Compute solutions along a decreasing grid of alphas, with warm starts.

    At each alpha_k, the problem

        P_k(w, b) = (1/n) sum_i c_i f(x_i^T w + b, y_i) + alpha_k Omega(w)

    (squared loss (1/2n) ||y - X w - b||^2 or logistic loss; Omega the weighted L1 or group
    norm; with ``l1_ratio`` < 1 the elastic net's alpha_k (l1_ratio ||w||_1 +
    (1 - l1_ratio) / 2 ||w||^2), l1_ratio fixed along the path as in scikit-learn's
    ``enet_path``) is solved by DDSS from the solution at alpha_{k-1}, so its first
    gap-safe test (at the warm start, with the dual point of the previous solution)
    already removes most features: screening is carried along the path. The L1
    penalty, serially with method "auto" or "working_set" and ``verbose`` 0 (for the
    logistic loss, on data with at most as many rows as features), solves each alpha
    in one compiled call, the working-set DDSS loop (``solvers.path``); every other
    path runs ``solve_ddss`` per alpha. The layout is
    scikit-learn's ``lasso_path`` (``enet_path`` with ``l1_ratio``).

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        Training data.
    y : array-like of shape (n_samples,)
        Targets (squared loss) or labels with two distinct values (logistic loss).
    alphas : array-like, default=None
        The alphas, in any order (solved from the largest); None: ``n_alphas`` values
        log-spaced from alpha_max (:func:`lam_max` / ``l1_ratio``, scikit-learn's) down
        to ``eps * alpha_max``.
    n_alphas : int, default=100
        Length of the default grid.
    eps : float, default=1e-3
        The ratio alpha_min / alpha_max of the default grid.
    fit_intercept : bool, default=True
        Fit an unpenalized intercept.
    tol : float, default=1e-4
        Relative duality-gap target of each solve: G <= tol * P(0).
    max_epochs : int, default=200
        Maximum outer iterations of each solve.
    method : str, default="auto"
        The inner step, as in :class:`Lasso`.
    backend : {"serial", "threads"}, default="serial"
        One thread, or Sha-DDSS's lock-free threads.
    n_jobs : int or None, default=None
        Threads of the "threads" backend (None or -1: all cores).
    kernel : {"auto", "numba", "native"}, default="auto"
        Inner loop of the "threads" backend, as in :class:`Lasso`.
    screening : bool, default=True
        Apply the gap-safe screening test every outer iteration.
    groups : None, int or list of array-like, default=None
        None for the (weighted) L1 penalty; else the groups of the group penalty, as in
        :class:`GroupLasso`.
    weights : array-like, default=None
        Positive per-feature or per-group weights (None: 1 per feature, sqrt(size) per
        group).
    positive : bool, default=False
        Constrain the coefficients to w >= 0, as in :class:`Lasso` (the L1 penalty
        only); alpha_max is then the one-sided ``lam_max``.
    l1_ratio : float, default=1.0
        The elastic-net mixing in (0, 1], as in :class:`ElasticNet` (the L1 penalty
        only; 1: the Lasso path).
    loss : {"squared", "logistic"}, default="squared"
        The datafit.
    random_state : int, numpy.random.Generator or None, default=None
        Seed of the row sampling.
    verbose : int, default=0
        Verbosity of each solve, as in :class:`Lasso`.
    return_results : bool, default=False
        Also return each solve's ``SolverResult``.
    sample_weight : array-like of shape (n_samples,), default=None
        Weights of the rows, rescaled to c_i summing to n as in :meth:`Lasso.fit`
        (None: every c_i = 1); alpha_max is then the weighted :func:`lam_max`.

    Returns
    -------
    alphas : ndarray of shape (n_alphas,)
        The alphas, decreasing.
    coefs : ndarray of shape (n_features, n_alphas)
        The coefficients at each alpha.
    dual_gaps : ndarray of shape (n_alphas,)
        The final duality gap of each solve.
    results : list of SolverResult
        Each solve's result (coefficients, intercept, history); only with
        ``return_results``.

    See Also
    --------
    Lasso : One alpha, with the estimator interface.
    lam_max : The alpha_max at the start of the default grid.

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import lasso_path
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((40, 8))
    >>> y = X[:, 0] + 0.1 * rng.standard_normal(40)
    >>> alphas, coefs, gaps = lasso_path(X, y, n_alphas=5)
    >>> coefs.shape
    (8, 5)
    >>> bool(np.all(coefs[:, 0] == 0))
    True
    """
    _check_choice(method, METHODS, "method")
    _check_choice(backend, ("serial", "threads"), "backend of lasso_path")
    inner_loop = ThreadsInnerLoop(n_jobs, kernel) if backend == "threads" else None
    if loss == "logistic":
        y = encode_binary_labels(y)[0]
    n_features = np.shape(X)[1]
    penalty = make_penalty(n_features, groups, weights, positive, l1_ratio)
    l1_ratio = float(l1_ratio)
    problem = Problem(X, y, loss, penalty, 1.0, fit_intercept,
                      sample_weight=rescaled_sample_weight(sample_weight, np.shape(X)[0]))
    if alphas is None:
        # x = 0 is optimal iff lam = alpha l1_ratio >= lam_max (the L2 term's gradient
        # vanishes at 0): alpha_max = lam_max / l1_ratio, as scikit-learn's
        top = problem.lam_max() / l1_ratio
        if top <= 0:
            raise ValueError("alpha_max is 0 (y is constant or X is zero" +
                             (", or with positive=True no feature correlates positively "
                              "with y" if positive else "") + "): nothing to fit")
        alphas = np.geomspace(top, top * eps, n_alphas)
    else:
        alphas = np.sort(np.asarray(alphas, dtype=np.float64))[::-1]
    coefs = np.zeros((n_features, len(alphas)))
    gaps = np.zeros(len(alphas))
    results = []
    coef, intercept = None, 0.0
    if len(alphas) > 1:
        problem.full_columns()      # every solve of the path reads its columns
    # one InnerChoice for the path's solves (``solve_ddss``'s inner_choice)
    shared = {"inner_choice": InnerChoice()} if METHODS[method].get("inner") == "auto" \
        else {}
    compiled = CompiledPath(problem) if len(alphas) > 1 and \
        compiled_path_applies(problem, method, backend, verbose) else None
    # the solves' BLAS cap entered once for the path (``runtime.blas_threads``)
    with blas_threads(None if "pse" in METHODS[method] else blas_limit(inner_loop)):
        for k, alpha in enumerate(alphas):
            if compiled is not None:
                result = compiled.solve(alpha * l1_ratio, tol, max_epochs, screening)
            else:
                result = solve_method(problem.with_lam(alpha * l1_ratio), method, tol=tol,
                                      max_epochs=max_epochs, screening=screening,
                                      coef_init=coef, intercept_init=intercept,
                                      random_state=random_state, verbose=verbose,
                                      inner_loop=inner_loop, **shared)
            coef, intercept = result.coef, result.intercept
            coefs[:, k] = coef
            gaps[k] = result.gap
            results.append(result)
    if return_results:
        return alphas, coefs, gaps, results
    return alphas, coefs, gaps
