"""Cross-validation estimators on warm-started paths (issue 48).

    LassoCV:                    the Lasso, alpha chosen by the least mean held-out MSE
    ElasticNetCV:               the elastic net, (alpha, l1_ratio) chosen by the least
                                mean held-out MSE over a grid of each
    SparseLogisticRegressionCV: L1 logistic regression, alpha chosen by the best mean
                                held-out score (accuracy unless ``scoring`` says otherwise)

Every fold's path over the grid (for each l1_ratio) is one :func:`asyncopt.lasso_path`
call: each alpha's solve starts from the previous solution, so its first gap-safe test
already screens out most features. The chosen alpha is refitted on all the data by the
base estimator.

``fit(X, y, sample_weight=s)`` splits the weights with the folds, as scikit-learn's
LassoCV does: the grid's alpha_max is the weighted ``lam_max`` of all the data, each
fold's path is fitted with s[train] (rescaled to sum to the fold's rows), its held-out
error or score is weighted by s[test], and the refit takes s.
"""
import numbers
import warnings

import numpy as np
from joblib import Parallel, delayed
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model._base import LinearClassifierMixin
from sklearn.metrics import check_scoring
from sklearn.model_selection import check_cv
from sklearn.utils.validation import validate_data

from .estimators import (_ATTRIBUTE_DOCS, _PARAMETER_DOCS, ElasticNet, Lasso,
                         SparseLogisticRegression, _check_choice, lasso_path)
from .penalties import L1, check_l1_ratio
from .problem import check_sample_weight, encode_binary_labels, lam_max

_CV_PARAMETER_DOCS = {
    "l1_ratio_cv": """
    l1_ratio : float or array-like of floats, default=0.5
        The elastic-net mixing (:class:`ElasticNet`), each in (0, 1]; a list: every
        value is cross-validated on its own grid of alphas, on the same folds, and the
        best (alpha, l1_ratio) pair is chosen. Put values near 1 (the Lasso) and near
        0.1 in the list, as scikit-learn suggests ([.1, .5, .7, .9, .95, .99, 1]).""",
    "alphas_enet": """
    alphas : int or array-like of shape (n_alphas,), default=100
        An int n: for each l1_ratio, n alphas log-spaced from its alpha_max
        (:func:`lam_max` of all the data divided by l1_ratio, scikit-learn's
        convention) down to ``eps * alpha_max``, the same grid for every fold; an
        array: the alphas themselves, finite and > 0, in any order (sorted decreasing),
        for every l1_ratio.""",
    "eps": """
    eps : float, default=1e-3
        The ratio alpha_min / alpha_max of the default grid.""",
    "alphas": """
    alphas : int or array-like of shape (n_alphas,), default=100
        An int n: n alphas log-spaced from alpha_max (:func:`lam_max` of all the data,
        scikit-learn's convention) down to ``eps * alpha_max``, the same grid for every
        fold; an array: the alphas themselves, finite and > 0, in any order (they are
        sorted decreasing).""",
    "cv": """
    cv : int, cross-validation generator or iterable, default=None
        The folds, as scikit-learn's ``check_cv`` reads them: None, 5 folds; an int k,
        k folds; a splitter; or an iterable of (train, test) index arrays. The int
        and None mean ``{folds}``.""",
    "scoring": """
    scoring : str, callable or None, default=None
        The held-out score, higher is better: None, accuracy (the estimator's
        ``score``); a scikit-learn scorer name such as "neg_log_loss" or "roc_auc"; or
        a callable ``scorer(estimator, X, y)``.""",
    "n_jobs": """
    n_jobs : int or None, default=None
        The parallelism: with the "serial" backend, folds whose paths run at once on
        joblib threads (None: 1, -1: all cores); with the "threads" backend, the
        threads of every solve (None or -1: all cores), the folds running one after
        another.""",
    "backend": """
    backend : {"serial", "threads"}, default="serial"
        "serial": each solve on one thread. "threads": Sha-DDSS, lock-free threads
        sharing w, in every solve.""",
}


def _cv_doc(head, parameters, attributes, tail):
    """The numpydoc docstring of a CV estimator, as ``estimators._estimator_doc``
    assembles the base estimators' (the CV entries first, then the shared ones)."""
    entries = {**_PARAMETER_DOCS, **_CV_PARAMETER_DOCS}
    return (head + "\n\n    Parameters\n    ----------"
            + "".join(entries[name] for name in parameters)
            + "\n\n    Attributes\n    ----------" + attributes + _ATTRIBUTE_DOCS
            + "\n" + tail)


_REFIT_ATTRIBUTES = ("coef_", "intercept_", "n_iter_", "dual_gap_", "objective_",
                     "active_set_", "history_")

_CV_NOTES = """
    Notes
    -----
    Each fold's path is one :func:`lasso_path` call on the fold's training rows: the
    solve at alpha_k starts from the solution at alpha_(k-1), so its first gap-safe
    test, at that warm start, already deletes most features (screening carried along
    the path). ``n_iter_``, ``dual_gap_``, ``objective_``, ``active_set_`` and
    ``history_`` are those of the refit on all the data at ``alpha_``. A
    ``ConvergenceWarning`` says how many of the paths' solves stopped at
    ``max_epochs`` before ``tol``."""


class _PathCV(BaseEstimator):
    """Shared CV logic: parameter checks, the grid, the folds' paths, the refit."""

    _loss = "squared"
    _estimator = None

    def __init__(self, *, eps=1e-3, alphas=100, fit_intercept=True, tol=1e-4,
                 max_epochs=200, cv=None, n_jobs=None, method="auto", backend="serial",
                 kernel="auto", screening=True, positive=False, random_state=None,
                 verbose=0):
        self.eps = eps
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_epochs = max_epochs
        self.cv = cv
        self.n_jobs = n_jobs
        self.method = method
        self.backend = backend
        self.kernel = kernel
        self.screening = screening
        self.positive = positive
        self.random_state = random_state
        self.verbose = verbose

    def _solver_params(self):
        return dict(fit_intercept=self.fit_intercept, tol=self.tol,
                    max_epochs=self.max_epochs, method=self.method, backend=self.backend,
                    n_jobs=self.n_jobs, kernel=self.kernel, screening=self.screening,
                    positive=self.positive, random_state=self.random_state,
                    verbose=self.verbose)

    def _check_grid(self):
        """The explicit grid sorted decreasing, or None for the default one; ValueError
        for a bad ``eps`` or ``alphas``."""
        if not (isinstance(self.eps, numbers.Real) and np.isfinite(self.eps)
                and self.eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {self.eps!r}")
        if isinstance(self.alphas, numbers.Integral) and not isinstance(self.alphas, bool):
            if self.alphas < 1:
                raise ValueError("alphas, as an int (the number of alphas of the grid), "
                                 f"must be >= 1, got {self.alphas}")
            return None
        try:
            grid = np.asarray(self.alphas, dtype=np.float64)
        except (TypeError, ValueError):
            grid = None
        if grid is None or grid.ndim != 1 or grid.size == 0 or \
                not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise ValueError("alphas must be an int >= 1 or a non-empty 1-d array of "
                             f"finite alphas > 0, got {self.alphas!r}")
        return np.sort(grid)[::-1]

    def _check_params(self):
        _check_choice(self.backend, ("serial", "threads"), "backend of a CV estimator")
        # the base estimator checks the solver's parameters before any fold is solved
        self._estimator(alpha=1.0, **self._solver_params())._check_params()
        return self._check_grid()

    def _targets(self, y):
        """(y for the solver, y for the held-out error) of the validated y."""
        return y, y

    def _held_out(self, X_test, y_test, coefs, intercepts, sample_weight=None):
        """The held-out metric of each alpha (lower is better for the errors of
        LassoCV, higher for the scores of SparseLogisticRegressionCV), weighted by the
        test rows' ``sample_weight`` where given."""
        raise NotImplementedError

    def _fold(self, X, y_fit, y_eval, train, test, alphas, sample_weight=None,
              l1_ratio=1.0):
        weights = (None, None) if sample_weight is None else \
            (sample_weight[train], sample_weight[test])
        if weights[1] is not None and not np.sum(weights[1]) > 0:
            raise ValueError("a test fold holds only rows of sample_weight 0: its held-out "
                             "error has no weight; use other folds (cv)")
        _, coefs, _, results = lasso_path(
            X[train], y_fit[train], alphas=alphas, loss=self._loss, l1_ratio=l1_ratio,
            return_results=True, sample_weight=weights[0], **self._solver_params())
        intercepts = np.array([result.intercept for result in results])
        return (self._held_out(X[test], y_eval[test], coefs, intercepts, weights[1]),
                sum(not result.converged for result in results))

    def _grid(self, X, y_fit, grid, l1_ratio, sample_weight=None):
        """The explicit ``grid``, or the default one of ``l1_ratio``: alpha_max =
        lam_max / l1_ratio (scikit-learn's, the L1 part's lam = alpha l1_ratio reaching
        lam_max; the weighted lam_max with ``sample_weight``) down to eps alpha_max."""
        if grid is not None:
            return grid
        top = lam_max(X, y_fit, loss=self._loss, fit_intercept=self.fit_intercept,
                      penalty=L1(X.shape[1], positive=self.positive),
                      sample_weight=sample_weight) / l1_ratio
        # as scikit-learn's grid: alpha_max = 0 (y constant; with positive, no feature
        # correlating positively) leaves w = 0 at any alpha
        return np.full(self.alphas, np.finfo(np.float64).resolution) if top <= 0 \
            else np.geomspace(top, top * self.eps, self.alphas)

    def _fit_paths(self, X, y, sample_weight=None, l1_ratios=(1.0,)):
        """(the grids, shape (n_l1_ratios, n_alphas), the held-out metric of every
        (l1_ratio, alpha, fold), shape (n_l1_ratios, n_alphas, n_folds)): one path per
        l1_ratio and fold, on the same folds (and ``sample_weight``) for every
        l1_ratio."""
        grid = self._check_params()
        y_fit, y_eval = self._targets(y)
        grids = [self._grid(X, y_fit, grid, l1_ratio, sample_weight)
                 for l1_ratio in l1_ratios]
        folds = list(check_cv(self.cv, y_eval, classifier=is_classifier(self)).split(
            X, y_eval))
        parallel = Parallel(n_jobs=1 if self.backend == "threads" else self.n_jobs,
                            prefer="threads")
        paths = parallel(delayed(self._fold)(X, y_fit, y_eval, train, test, alphas,
                                             sample_weight, l1_ratio)
                         for l1_ratio, alphas in zip(l1_ratios, grids)
                         for train, test in folds)
        unconverged = sum(count for _, count in paths)
        if unconverged and self.max_epochs > 0:
            total = len(grids[0]) * len(folds) * len(l1_ratios)
            warnings.warn(
                f"{type(self).__name__}: {unconverged} of {total} path "
                f"solves did not reach tol={self.tol:g} in {self.max_epochs} epochs; "
                "increase max_epochs", ConvergenceWarning, stacklevel=4)
        metrics = np.array([metric for metric, _ in paths]).reshape(
            len(l1_ratios), len(folds), -1)
        return np.array(grids), np.swapaxes(metrics, 1, 2)

    def _fit_path(self, X, y, sample_weight=None):
        """The one grid (``alphas_``) and its (n_alphas, n_folds) metric."""
        grids, metrics = self._fit_paths(X, y, sample_weight)
        self.alphas_ = grids[0]
        return metrics[0]

    def fit(self, X, y, sample_weight=None):
        """Choose alpha by cross-validation, then refit on all the data.

        ElasticNetCV chooses the pair (alpha, l1_ratio).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data, dense or sparse (CSR or CSC).
        y : array-like of shape (n_samples,)
            Targets (LassoCV, ElasticNetCV), or labels with exactly two distinct values
            (SparseLogisticRegressionCV).
        sample_weight : float or array-like of shape (n_samples,), default=None
            Weights of the rows (>= 0, not all zero), split with the folds as
            scikit-learn's LassoCV splits them: alpha_max of the default grid is the
            weighted :func:`lam_max` of all the data, each fold's path is fitted with
            its training rows' weights (rescaled to sum to their count, as
            :meth:`Lasso.fit` rescales), its held-out error (score) is the mean over
            the test rows weighted by theirs, and the refit takes them all. None:
            unweighted.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], dtype=np.float64,
                             y_numeric=not is_classifier(self))
        sample_weight = check_sample_weight(sample_weight, X.shape[0])
        if sample_weight is not None and not np.any(sample_weight > 0):
            raise ValueError("sample_weight is zero for every row: nothing to fit")
        self.best_estimator_ = self._estimator(**self._choose(X, y, sample_weight),
                                               **self._solver_params()).fit(
            X, y, sample_weight=sample_weight)
        for name in _REFIT_ATTRIBUTES:
            setattr(self, name, getattr(self.best_estimator_, name))
        return self

    def _choose(self, X, y, sample_weight=None):
        """Cross-validate the grid: the path attribute, ``alphas_`` and ``alpha_`` set;
        returns the refit's parameters ({"alpha": alpha_})."""
        path = self._fit_path(X, y, sample_weight)
        setattr(self, self._path_attribute, path)
        mean = path.mean(axis=1)
        best = np.argmax(mean) if is_classifier(self) else np.argmin(mean)
        self.alpha_ = float(self.alphas_[best])
        return {"alpha": self.alpha_}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


_SOLVER_PARAMETERS = ["fit_intercept", "tol", "max_epochs", "cv", "n_jobs", "method",
                      "backend", "kernel", "screening", "positive", "random_state",
                      "verbose"]


class LassoCV(RegressorMixin, _PathCV):
    __doc__ = _cv_doc(
        """Lasso with alpha chosen by cross-validation on warm-started paths.

    For each fold, the Lasso

        P(w, b) = (1/2n) ||y - X w - b||^2 + alpha ||w||_1

    is solved on the fold's training rows along a decreasing grid of alphas, each
    solve warm-started from the previous one; ``alpha_`` is the alpha of least mean
    squared error on the held-out rows, averaged over the folds, and the model is
    refitted on all the data at ``alpha_`` by :class:`Lasso`. Parameters and
    attributes are those of scikit-learn's ``LassoCV``.""",
        ["eps", "alphas"] + _SOLVER_PARAMETERS,
        """
    alpha_ : float
        The alpha chosen: the least mean held-out MSE (the largest such alpha on a tie).
    alphas_ : ndarray of shape (n_alphas,)
        The grid, decreasing.
    mse_path_ : ndarray of shape (n_alphas, n_folds)
        The held-out mean squared error of each alpha on each fold (weighted by the
        test rows' ``sample_weight`` where fit was given one).
    coef_ : ndarray of shape (n_features,)
        The coefficients w of the refit.
    intercept_ : float
        The intercept b of the refit (0.0 when ``fit_intercept`` is false).
    best_estimator_ : Lasso
        The refit on all the data at ``alpha_``.""",
        """
    See Also
    --------
    Lasso : One alpha.
    lasso_path : The warm-started path each fold runs.
    SparseLogisticRegressionCV : The same for L1 logistic regression.
""" + _CV_NOTES + """

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import LassoCV
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((60, 10))
    >>> y = X[:, 0] - 2 * X[:, 1] + 0.1 * rng.standard_normal(60)
    >>> model = LassoCV(alphas=20, cv=3).fit(X, y)
    >>> model.mse_path_.shape
    (20, 3)
    >>> bool(model.alpha_ in model.alphas_)
    True
""").replace("{folds}", "KFold")

    _estimator = Lasso
    _path_attribute = "mse_path_"
    predict = Lasso.predict

    def _held_out(self, X_test, y_test, coefs, intercepts, sample_weight=None):
        residuals = X_test @ coefs + intercepts - y_test[:, np.newaxis]
        return np.average(residuals ** 2, axis=0, weights=sample_weight)


class ElasticNetCV(LassoCV):
    __doc__ = _cv_doc(
        """Elastic net with alpha and l1_ratio chosen by cross-validation on paths.

    For each l1_ratio and each fold, the elastic net

        P(w, b) = (1/2n) ||y - X w - b||^2 + alpha l1_ratio ||w||_1
                  + alpha (1 - l1_ratio) / 2 ||w||_2^2

    is solved on the fold's training rows along a decreasing grid of alphas, each
    solve warm-started from the previous one (:func:`lasso_path` with ``l1_ratio``);
    (``alpha_``, ``l1_ratio_``) is the pair of least mean squared error on the held-out
    rows, averaged over the folds, and the model is refitted on all the data at it by
    :class:`ElasticNet`. Parameters and attributes are those of scikit-learn's
    ``ElasticNetCV`` (its ``precompute``, ``copy_X`` and ``selection`` have no
    counterpart here).""",
        ["l1_ratio_cv", "eps", "alphas_enet"] + _SOLVER_PARAMETERS,
        """
    alpha_ : float
        The alpha chosen.
    l1_ratio_ : float
        The l1_ratio chosen: the pair (``alpha_``, ``l1_ratio_``) of least mean
        held-out MSE (on a tie, the first l1_ratio in the order given, then the largest
        alpha, as scikit-learn's).
    alphas_ : ndarray of shape (n_l1_ratio, n_alphas) or (n_alphas,)
        The grid of each l1_ratio, decreasing (one row, squeezed, for a single
        l1_ratio).
    mse_path_ : ndarray of shape (n_l1_ratio, n_alphas, n_folds) or (n_alphas, n_folds)
        The held-out mean squared error of each (l1_ratio, alpha) on each fold
        (weighted by the test rows' ``sample_weight`` where fit was given one;
        squeezed for a single l1_ratio).
    coef_ : ndarray of shape (n_features,)
        The coefficients w of the refit.
    intercept_ : float
        The intercept b of the refit (0.0 when ``fit_intercept`` is false).
    best_estimator_ : ElasticNet
        The refit on all the data at (``alpha_``, ``l1_ratio_``).""",
        """
    See Also
    --------
    ElasticNet : One alpha and l1_ratio.
    LassoCV : l1_ratio = 1.
    lasso_path : The warm-started path each fold runs (with ``l1_ratio``).
""" + _CV_NOTES.replace("``alpha_``. A", "(``alpha_``, ``l1_ratio_``). A") + """

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import ElasticNetCV
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((60, 10))
    >>> y = X[:, 0] - 2 * X[:, 1] + 0.1 * rng.standard_normal(60)
    >>> model = ElasticNetCV(l1_ratio=[0.5, 0.9], alphas=10, cv=3).fit(X, y)
    >>> model.mse_path_.shape
    (2, 10, 3)
    >>> bool(model.l1_ratio_ in (0.5, 0.9))
    True
""").replace("{folds}", "KFold")

    _estimator = ElasticNet       # LassoCV's held-out MSE, path attribute and predict

    def __init__(self, *, l1_ratio=0.5, eps=1e-3, alphas=100, fit_intercept=True,
                 tol=1e-4, max_epochs=200, cv=None, n_jobs=None, method="auto",
                 backend="serial", kernel="auto", screening=True, positive=False,
                 random_state=None, verbose=0):
        super().__init__(eps=eps, alphas=alphas, fit_intercept=fit_intercept, tol=tol,
                         max_epochs=max_epochs, cv=cv, n_jobs=n_jobs, method=method,
                         backend=backend, kernel=kernel, screening=screening,
                         positive=positive, random_state=random_state, verbose=verbose)
        self.l1_ratio = l1_ratio

    def _l1_ratios(self):
        """The l1_ratios as a list of floats in (0, 1] (a float: one); ValueError for
        an empty list or a value outside."""
        ratios = np.atleast_1d(np.asarray(self.l1_ratio, dtype=object))
        if ratios.ndim != 1 or ratios.size == 0:
            raise ValueError("l1_ratio must be a float in (0, 1] or a non-empty list of "
                             f"them, got {self.l1_ratio!r}")
        return [check_l1_ratio(ratio) for ratio in ratios]

    def _check_params(self):
        ratios = self._l1_ratios()
        grid = super()._check_params()
        self._estimator(alpha=1.0, l1_ratio=ratios[0],
                        **self._solver_params())._check_params()
        return grid

    def _choose(self, X, y, sample_weight=None):
        """Cross-validate every l1_ratio's grid: ``alphas_``, ``mse_path_``, ``alpha_``
        and ``l1_ratio_`` set (the first l1_ratio holding the least mean MSE, then its
        largest such alpha, as scikit-learn's); returns the refit's parameters."""
        ratios = self._l1_ratios()
        grids, path = self._fit_paths(X, y, sample_weight, ratios)
        mean = path.mean(axis=2)
        ratio = int(np.argmin(mean.min(axis=1)))
        best = int(np.argmin(mean[ratio]))
        single = np.ndim(self.l1_ratio) == 0
        self.alphas_ = grids[0] if single else grids
        self.mse_path_ = path[0] if single else path
        self.alpha_ = float(grids[ratio, best])
        self.l1_ratio_ = ratios[ratio]
        return {"alpha": self.alpha_, "l1_ratio": self.l1_ratio_}


class SparseLogisticRegressionCV(LinearClassifierMixin, ClassifierMixin, _PathCV):
    __doc__ = _cv_doc(
        """L1 logistic regression with alpha chosen by cross-validation on paths.

    For each fold, the binary logistic regression

        P(w, b) = (1/n) sum_i log(1 + exp(-y_i (x_i^T w + b))) + alpha ||w||_1

    is solved on the fold's training rows along a decreasing grid of alphas, each
    solve warm-started from the previous one; ``alpha_`` is the alpha of the best mean
    held-out score (``scoring``), and the model is refitted on all the data at
    ``alpha_`` by :class:`SparseLogisticRegression`. The model is parametrized by
    alpha, as :class:`SparseLogisticRegression` is, not by scikit-learn's
    ``C = 1 / (n alpha)``: the grid is ``alphas`` (an int, or the alphas), not
    ``Cs``.""",
        ["eps", "alphas", "fit_intercept", "tol", "max_epochs", "cv", "scoring",
         "n_jobs", "method", "backend", "kernel", "screening", "positive", "random_state",
         "verbose"],
        """
    alpha_ : float
        The alpha chosen: the best mean held-out score (the largest such alpha on a
        tie).
    alphas_ : ndarray of shape (n_alphas,)
        The grid, decreasing.
    scores_ : ndarray of shape (n_alphas, n_folds)
        The held-out score of each alpha on each fold, higher is better (with the
        test rows' ``sample_weight`` where fit was given one; one array,
        laid out as LassoCV's ``mse_path_``, not scikit-learn's dict of
        (n_folds, n_Cs) arrays: the model is binary).
    classes_ : ndarray of shape (2,)
        The two labels, sorted.
    coef_ : ndarray of shape (1, n_features)
        The coefficients w of the refit.
    intercept_ : ndarray of shape (1,)
        The intercept b of the refit (0.0 when ``fit_intercept`` is false).
    best_estimator_ : SparseLogisticRegression
        The refit on all the data at ``alpha_``.""",
        """
    See Also
    --------
    SparseLogisticRegression : One alpha.
    lasso_path : The warm-started path each fold runs (``loss="logistic"``).
    LassoCV : The same for the Lasso.
""" + _CV_NOTES + """

    Examples
    --------
    >>> import numpy as np
    >>> from asyncopt import SparseLogisticRegressionCV
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((80, 10))
    >>> y = (X[:, 0] - X[:, 1] > 0).astype(int)
    >>> model = SparseLogisticRegressionCV(alphas=10, cv=3).fit(X, y)
    >>> model.scores_.shape
    (10, 3)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
""").replace("{folds}", "StratifiedKFold")

    _loss = "logistic"
    _estimator = SparseLogisticRegression
    _path_attribute = "scores_"
    predict_proba = SparseLogisticRegression.predict_proba
    predict_log_proba = SparseLogisticRegression.predict_log_proba

    def __init__(self, *, eps=1e-3, alphas=100, fit_intercept=True, tol=1e-4,
                 max_epochs=200, cv=None, scoring=None, n_jobs=None, method="auto",
                 backend="serial", kernel="auto", screening=True, positive=False,
                 random_state=None, verbose=0):
        super().__init__(eps=eps, alphas=alphas, fit_intercept=fit_intercept, tol=tol,
                         max_epochs=max_epochs, cv=cv, n_jobs=n_jobs, method=method,
                         backend=backend, kernel=kernel, screening=screening,
                         positive=positive, random_state=random_state, verbose=verbose)
        self.scoring = scoring

    def _check_params(self):
        grid = super()._check_params()
        check_scoring(SparseLogisticRegression(), scoring=self.scoring)
        return grid

    def _targets(self, y):
        y_pm, self.classes_ = encode_binary_labels(y)
        return y_pm, y

    def _held_out(self, X_test, y_test, coefs, intercepts, sample_weight=None):
        if self.scoring in (None, "accuracy"):
            # the default score, accuracy, of every alpha at once: the class of the
            # decision's sign, as LinearClassifierMixin.predict gives it
            predicted = self.classes_[(X_test @ coefs + intercepts > 0).astype(int)]
            return np.average(predicted == np.asarray(y_test)[:, np.newaxis], axis=0,
                              weights=sample_weight)
        scorer = check_scoring(SparseLogisticRegression(), scoring=self.scoring)
        weighted = {} if sample_weight is None else {"sample_weight": sample_weight}
        model = SparseLogisticRegression()       # a fitted shell for the scorer
        model.classes_, model.n_features_in_ = self.classes_, coefs.shape[0]
        scores = np.empty(coefs.shape[1])
        for k in range(coefs.shape[1]):
            model.coef_ = coefs[np.newaxis, :, k]
            model.intercept_ = intercepts[k:k + 1]
            scores[k] = scorer(model, X_test, y_test, **weighted)
        return scores

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags
