"""Cross-validated paths against the peers: 100 alphas, 5 folds, the refit (issue 48).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_path.py                  # ~30 minutes
    PYTHONPATH=. .venv/bin/python benchmarks/bench_path.py --data dexter rcv1s  # no CTR
    PYTHONPATH=. .venv/bin/python benchmarks/bench_path.py --data dexter --loss squared \\
        --n-alphas 10 --cap 30 --repeat 1 --output /tmp/bench_path.json   # a quick try

What it measures: the wall time of one cross-validated fit as a user calls it, every
fold's path over the grid plus the refit on all the data at the chosen alpha, for the
Lasso and L1 logistic regression (both with an intercept) on dexter and rcv1s
(``../shared/data/real``, ``bench_real.load``; more with ``--data``) and CTR 200,000 x
100,000 (``load("ctr")``; ``--data dexter rcv1s`` leaves it out). Labels in {-1, +1} are
the Lasso's response as they are. Per solver and row: the seconds, the alpha it chose
(its index on the grid, and whether asyncopt chose the same), that alpha's mean held-out
error (MSE; log-loss and misclassification for logistic) and its refit's suboptimality.

Solvers, each serial (one thread: ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
``MKL_NUM_THREADS`` are 1, no ``n_jobs``), each in a process of its own:
  - asyncopt: ``asyncopt.LassoCV`` / ``SparseLogisticRegressionCV(alphas=grid,
    cv=folds, tol=1e-4)`` (warm-started paths, gap-safe screening along them);
  - skglm: ``skglm.cv.GeneralizedLinearEstimatorCV`` with ``Quadratic`` and
    ``AndersonCD`` (the Lasso) or ``Logistic`` and ``ProxNewton`` (the solvers of its
    ``Lasso`` and ``SparseLogisticRegression``), ``L1``, ``fit_intercept=True``,
    ``warm_start=True`` (so that its path is warm-started, as its CV means it to be),
    ``tol=1e-4``, ``alphas=grid, cv=5, random_state=0``;
  - scikit-learn: ``LassoCV(alphas=grid, cv=folds, tol=1e-4, max_iter=100_000)`` and
    ``LogisticRegressionCV(l1_ratios=(1,), solver="liblinear", Cs=1 / (n_train * grid),
    cv=folds, tol=1e-4, intercept_scaling=100, max_iter=100_000, scoring="accuracy")``
    (scikit-learn 1.9 spells ``penalty="l1"`` as ``l1_ratios=(1,)``; liblinear penalises
    the intercept, the scaling making that negligible; ``--sklearn-solver saga`` for
    saga). Its C multiplies a sum of losses, so C = 1 / (n_train alpha) is the grid's
    alpha on a fold's 4/5 of the rows; its refit on all the rows, with the same C, is
    at alpha n_train / n (0.8 alpha), the alpha its suboptimality is measured at;
  - glmnet (python-glmnet): its ``ElasticNet`` / ``LogitNet(alpha=1,
    lambda_path=grid, standardize=False, n_splits=0)`` fitted here on each fold's
    training rows (its own CV, ``n_splits=5``, draws folds of its own and picks by r^2
    or accuracy; fitting it per fold gives it our folds and our rule), alpha picked as
    its ``lambda_max_`` would be (the best mean score, not the 1-SE ``lambda_best_``),
    the refit a glmnet path on all the rows down the grid to that alpha (glmnet's way
    to one lambda: a cold fit at a small lambda is slower); its default tol (1e-7).

Fairness:
  - one grid for all: 100 alphas log-spaced from ``asyncopt.lam_max(X, y, loss=...)`` of
    all the data (with an intercept) down to 1e-3 lam_max for the Lasso (scikit-learn's
    ``eps``) and 1e-2 lam_max for logistic (glmnet's ``lambda.min.ratio`` where n < p:
    below it dexter's and rcv1s' training folds are nearly separable, the fits long and
    the held-out error only worse);
  - one set of folds: ``KFold(5, shuffle=True, random_state=0)`` on the rows, the list
    passed as ``cv=`` to asyncopt and scikit-learn; skglm's CV takes an int and splits
    with ``KFold(5, shuffle=True, random_state=0)`` itself, the same folds (checked);
    for logistic it splits with ``StratifiedKFold``, replaced here by ``KFold`` with
    the same arguments for the fit (``skglm_folds``); glmnet is fitted per fold here;
  - one rule: the least mean held-out MSE (the Lasso) or the best mean held-out
    accuracy (logistic; every peer's default, and skglm's only score), the largest alpha
    on a tie (each solver's own way; the same for all four);
  - tolerances of one accuracy: each solver starts at its default, 1e-4 (asyncopt:
    relative duality gap G <= 1e-4 P(0) per solve, which bounds its refit's
    suboptimality by 1e-4 P(0); scikit-learn: its duality gap / liblinear's criterion;
    skglm: its KKT violation, absolute) and glmnet's 1e-7. The criteria differ, so the
    accuracy is measured, as (P - P*) / P(0) (P* asyncopt's certified 1e-10 solution,
    the intercept refitted exactly, as in bench_real): "subopt refit", of the refit,
    and "subopt last", of a fit on all the rows at the grid's last alpha at the same
    tol, reached as the solver's CV reaches it (glmnet's and skglm's warm-started paths
    down the grid), untimed (``last_alpha_fit``: where an absolute criterion is
    loosest, and where a path whose solves stop at their warm start shows it; skglm's
    at 1e-4 falls behind near the end of the grid). A peer with either above 1e-4
    (``--tol``) is run again at tol / 10, up to ``--tol-steps`` (3) times; the table
    gives its last run, the JSON every one ("attempts"). The peers' fold paths are not
    all exposed: these two fits stand for them;
  - each process fits once untimed on its data's first 400 rows first (imports, numba
    compilation: skglm compiles in every process), then the timed fits, the best of
    ``--repeat`` (repeats only for fits under 30 s);
  - ``--cap``: a fit still running after that many seconds is killed ("> cap").
The held-out error of a chosen alpha is computed here, the same way for every solver:
the mean over the folds of the held-out MSE (log-loss, misclassification) of the exact
fit at that alpha on the fold's training rows (asyncopt's at a relative gap of 1e-8, one
per fold: the fitted values are unique, so any solver's exact fit gives the same); the
JSON also holds each solver's own mean held-out curve ("own_mean_metric": MSE, or
accuracy for logistic), the one it chose by.

Output: a table (one line per row and solver; "/ asyncopt" the seconds over asyncopt's),
``results/bench_path.json`` (the machine, the date, the grid, every fit) and
``results/bench_path.png`` (seconds per row, log scale, one bar per solver; hatched at
the cap: over it).
"""
import argparse
import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.bench_real import load  # noqa: E402
from benchmarks.common import (RESULTS_DIR, format_table, machine_info,  # noqa: E402
                               write_json)

DATA = ("dexter", "rcv1s", "ctr")
LOSSES = ("squared", "logistic")
SOLVERS = ("asyncopt", "skglm", "sklearn", "glmnet")
MODEL = {"squared": "Lasso", "logistic": "L1 logistic"}
EPS = {"squared": 1e-3, "logistic": 1e-2}
N_FOLDS = 5
WARM_UP_ROWS = 400
REPEAT_BELOW = 30.0           # seconds: longer fits are not repeated
SETUP_LIMIT = 900.0           # seconds a child may take to load and warm up
REFERENCE_TOL = 1e-8          # the reference fits of the held-out errors
OPTIMUM_TOL = 1e-10           # P* of the refits
MAX_ITER = 100_000            # scikit-learn's iterations: its tol, not this, stops it
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                               "MKL_NUM_THREADS")}


def make_grid(X, y, loss, n_alphas):
    """``n_alphas`` alphas log-spaced from lam_max of (X, y) down to EPS[loss] lam_max."""
    from asyncopt import lam_max
    top = lam_max(X, y, loss=loss)
    return np.geomspace(top, EPS[loss] * top, n_alphas)


def make_folds(n):
    """The (train, test) index pairs every solver gets."""
    from sklearn.model_selection import KFold
    return list(KFold(N_FOLDS, shuffle=True, random_state=0).split(np.arange(n)))


def own_metric(loss, margins, y):
    """The selection's held-out metric per column of ``margins`` (held-out rows x
    alphas): MSE (lower is better) or accuracy (higher), a margin > 0 predicting +1."""
    if loss == "squared":
        return np.mean((margins - y[:, np.newaxis]) ** 2, axis=0)
    return np.mean(np.where(margins > 0, 1.0, -1.0) == y[:, np.newaxis], axis=0)


def best_index(loss, metric):
    """The chosen alpha's index from a (alphas x folds) metric: the first (largest
    alpha) of the least mean MSE or of the best mean accuracy."""
    mean = np.mean(metric, axis=1)
    return int(np.argmin(mean) if loss == "squared" else np.argmax(mean))


def fitted(grid, alpha, metric, coef, intercept, lam_refit=None):
    """What a CV fit returns to the benchmark."""
    index = int(np.argmin(np.abs(np.log(grid / float(alpha)))))
    return {"index": index, "alpha": float(grid[index]), "metric": np.asarray(metric),
            "coef": np.ascontiguousarray(np.ravel(coef), dtype=np.float64),
            "intercept": float(np.ravel(intercept)[0]) if np.size(intercept) else 0.0,
            "lam_refit": float(grid[index] if lam_refit is None else lam_refit)}


# --------------------------------------------------------------------------- the solvers

def fit_asyncopt(X, y, loss, grid, folds, settings):
    from asyncopt import LassoCV, SparseLogisticRegressionCV
    model = LassoCV if loss == "squared" else SparseLogisticRegressionCV
    est = model(alphas=grid, cv=folds, tol=settings["tol"]).fit(X, y)
    metric = est.mse_path_ if loss == "squared" else est.scores_
    return fitted(grid, est.alpha_, metric, est.coef_, est.intercept_)


@contextlib.contextmanager
def skglm_folds(n, folds):
    """skglm's CV splits by ``KFold(cv, shuffle=True, random_state)`` for the Lasso and
    ``StratifiedKFold`` with the same arguments for logistic: with cv=5 and
    random_state=0 the first is ``folds``; the second is replaced by ``KFold`` while the
    block runs, so that logistic gets them too."""
    import skglm.cv
    from sklearn.model_selection import KFold
    mine = KFold(len(folds), shuffle=True, random_state=0).split(np.arange(n))
    if not all(np.array_equal(a, c) for (_, a), (_, c) in zip(mine, folds)):
        raise RuntimeError("skglm's KFold would not give the benchmark's folds")
    stratified, skglm.cv.StratifiedKFold = skglm.cv.StratifiedKFold, KFold
    try:
        yield
    finally:
        skglm.cv.StratifiedKFold = stratified


def skglm_parts(loss, tol):
    """(datafit, solver) of skglm's Lasso / SparseLogisticRegression, warm-started."""
    from skglm.datafits import Logistic, Quadratic
    from skglm.solvers import AndersonCD, ProxNewton
    if loss == "squared":
        return Quadratic(), AndersonCD(tol=tol, fit_intercept=True, warm_start=True)
    return Logistic(), ProxNewton(tol=tol, fit_intercept=True, warm_start=True)


def fit_skglm(X, y, loss, grid, folds, settings):
    from skglm.cv import GeneralizedLinearEstimatorCV
    from skglm.penalties import L1
    datafit, solver = skglm_parts(loss, settings["tol"])
    est = GeneralizedLinearEstimatorCV(datafit, L1(1.0), solver, alphas=grid,
                                       cv=len(folds), random_state=0)
    with skglm_folds(X.shape[0], folds):
        est.fit(X, y)
    metric = np.reshape(est.scores_path_, (len(grid), len(folds)))
    return fitted(grid, est.alpha_, -metric if loss == "squared" else metric,
                  est.coef_, est.intercept_)


def fit_sklearn(X, y, loss, grid, folds, settings):
    from sklearn.linear_model import LassoCV, LogisticRegressionCV
    if loss == "squared":
        est = LassoCV(alphas=grid, cv=folds, tol=settings["tol"],
                      max_iter=MAX_ITER).fit(X, y)
        return fitted(grid, est.alpha_, est.mse_path_, est.coef_, est.intercept_)
    n_train = np.mean([len(train) for train, _ in folds])
    Cs = 1.0 / (n_train * grid)
    est = LogisticRegressionCV(Cs=Cs, l1_ratios=(1.0,), solver=settings["sklearn_solver"],
                               cv=folds, tol=settings["tol"], intercept_scaling=100.0,
                               max_iter=MAX_ITER, scoring="accuracy",
                               use_legacy_attributes=False).fit(X, y)
    C = float(np.ravel(est.C_)[0])
    metric = np.reshape(est.scores_, (len(folds), len(grid))).T
    return fitted(grid, 1.0 / (n_train * C), metric, est.coef_, est.intercept_,
                  lam_refit=1.0 / (X.shape[0] * C))


def glmnet_path(X, y, loss, lambdas, settings):
    """(coefs (features x lambdas), intercepts) of one glmnet path."""
    import glmnet
    model = glmnet.ElasticNet if loss == "squared" else glmnet.LogitNet
    est = model(alpha=1.0, lambda_path=lambdas, standardize=False, n_splits=0,
                tol=settings["glmnet_tol"]).fit(X, y)
    coefs = np.reshape(est.coef_path_, (X.shape[1], -1))
    if coefs.shape[1] != len(lambdas):
        raise RuntimeError(f"glmnet stopped its path after {coefs.shape[1]} of "
                           f"{len(lambdas)} lambdas")
    return coefs, np.ravel(est.intercept_path_)


def fit_glmnet(X, y, loss, grid, folds, settings):
    metric = np.empty((len(grid), len(folds)))
    for k, (train, test) in enumerate(folds):
        coefs, intercepts = glmnet_path(X[train], y[train], loss, grid, settings)
        metric[:, k] = own_metric(loss, X[test] @ coefs + intercepts, y[test])
    best = best_index(loss, metric)
    coefs, intercepts = glmnet_path(X, y, loss, grid[:best + 1], settings)
    return fitted(grid, grid[best], metric, coefs[:, -1], intercepts[-1])


def last_alpha_fit(solver, X, y, loss, grid, folds, settings):
    """{coef, intercept, lam}: the solver's fit on all the rows at the grid's last
    alpha, at its tol (untimed: the accuracy check), reached as its CV's paths reach
    it. Its stopping rule is loosest relative to the solution there (skglm's KKT
    violation and scikit-learn's gap are absolute), and a warm-started path whose
    solves stop at their warm start shows it there: glmnet's and skglm's paths down
    the whole grid (skglm's as its CV runs one: a new estimator per alpha, given the
    last coefficients); asyncopt's and scikit-learn's estimators from zero (asyncopt
    certifies each solve of a path; scikit-learn's gap test does not depend on the
    start, and liblinear starts every C from zero)."""
    alpha, tol = grid[-1], settings["tol"]
    if solver == "glmnet":
        coefs, intercepts = glmnet_path(X, y, loss, grid, settings)
        return {"coef": coefs[:, -1], "intercept": intercepts[-1], "lam": alpha}
    if solver == "skglm":
        from skglm.estimators import GeneralizedLinearEstimator
        from skglm.penalties import L1
        datafit, inner = skglm_parts(loss, tol)
        est = None
        for lam in grid:
            warm, est = est, GeneralizedLinearEstimator(datafit, L1(lam), inner)
            if warm is not None:
                est.coef_, est.intercept_ = warm.coef_, warm.intercept_
            est.fit(X, y)
    elif solver == "asyncopt":
        from asyncopt import Lasso, SparseLogisticRegression
        est = (Lasso if loss == "squared" else SparseLogisticRegression)(alpha=alpha,
                                                                          tol=tol)
    elif loss == "squared":
        from sklearn.linear_model import Lasso
        est = Lasso(alpha=alpha, tol=tol, max_iter=MAX_ITER)
    else:
        from sklearn.linear_model import LogisticRegression
        C = 1.0 / (np.mean([len(train) for train, _ in folds]) * alpha)
        est = LogisticRegression(l1_ratio=1.0, solver=settings["sklearn_solver"], C=C,
                                 tol=tol, intercept_scaling=100.0, max_iter=MAX_ITER)
        alpha = 1.0 / (X.shape[0] * C)
    if solver != "skglm":
        est.fit(X, y)
    return {"coef": np.ravel(est.coef_), "lam": alpha,
            "intercept": float(np.ravel(est.intercept_)[0])}


FITS = {"asyncopt": fit_asyncopt, "skglm": fit_skglm, "sklearn": fit_sklearn,
        "glmnet": fit_glmnet}


# --------------------------------------------------------------------------- one process

def child(spec_path):
    """One solver on one row, in its own process: load, warm up, then the timed fits,
    each announced in the marker file (its start, for the parent's cap) and its result
    written after it (the best so far), then ``last_alpha_fit`` (under the cap too)."""
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    X, y = load(spec["data"])
    loss, settings, fit = spec["loss"], spec["settings"], FITS[spec["solver"]]
    grid, folds = make_grid(X, y, loss, spec["n_alphas"]), make_folds(X.shape[0])
    warm_up = None
    m = min(X.shape[0], WARM_UP_ROWS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit(X[:m], y[:m], loss, make_grid(X[:m], y[:m], loss, 5), make_folds(m),
                settings)
    except Exception as exc:  # noqa: BLE001 - the timed fit will say whether it matters
        warm_up = repr(exc)
    times, best = [], None
    for _ in range(max(1, spec["repeat"])):
        _mark(spec["marker"], f"{time.time()!r}")
        began = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fit(X, y, loss, grid, folds, settings)
        times.append(time.perf_counter() - began)
        _mark(spec["marker"], "")
        if best is None or times[-1] < best["seconds"]:
            kinds = sorted({w.category.__name__ for w in caught})
            best = dict(out, seconds=times[-1], warnings=len(caught), warning_kinds=kinds,
                        first_warning=str(caught[0].message)[:300] if caught else None)
        best.update(times=list(times), warm_up_error=warm_up)
        _save(spec["result"], best)
        if times[-1] > REPEAT_BELOW:
            break
    _mark(spec["marker"], f"{time.time()!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            best["check"] = last_alpha_fit(spec["solver"], X, y, loss, grid, folds,
                                           settings)
    except Exception as exc:  # noqa: BLE001 - reported, the timed fit stands
        best["check_error"] = repr(exc)
    _mark(spec["marker"], "")
    _save(spec["result"], best)


def _save(path, result):
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)


def _mark(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def run_solver(solver, data, loss, args, folder, scale=1.0):
    """The child's result (a dict, with "status": "ok", "over cap" or "error", and the
    tol it ran at), the tolerances ``scale`` times the defaults."""
    chosen = settings(args, scale)
    spec = {"solver": solver, "data": data, "loss": loss, "n_alphas": args.n_alphas,
            "repeat": args.repeat, "settings": chosen,
            "marker": os.path.join(folder, f"{solver}.mark"),
            "result": os.path.join(folder, f"{solver}.pkl")}
    spec_path = os.path.join(folder, f"{solver}.spec")
    with open(spec_path, "wb") as f:
        pickle.dump(spec, f)
    for path in (spec["marker"], spec["result"]):
        if os.path.exists(path):
            os.remove(path)
    env = dict(os.environ, **ONE_THREAD)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    log_path = os.path.join(folder, f"{solver}.log")
    began, killed = time.time(), None
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child",
                                 spec_path], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)
        while proc.poll() is None:
            time.sleep(0.2)
            started = _read_mark(spec["marker"])
            if started is not None and time.time() - started > args.cap:
                killed = "over cap"
            elif started is None and time.time() - began > SETUP_LIMIT:
                killed = f"no fit started in {SETUP_LIMIT:g} s"
            if killed:
                proc.kill()
                proc.wait()
    tol = chosen["glmnet_tol" if solver == "glmnet" else "tol"]
    if os.path.exists(spec["result"]):
        with open(spec["result"], "rb") as f:
            return dict(pickle.load(f), status="ok", tol=tol)
    if killed == "over cap":
        return {"status": "over cap", "seconds": None, "tol": tol}
    with open(log_path) as f:
        tail = f.read().strip().splitlines()[-1:]
    return {"status": "error", "seconds": None, "tol": tol,
            "error": killed or f"exit {proc.returncode}: {' '.join(tail)}"}


def _read_mark(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return float(text) if text else None


def settings(args, scale=1.0):
    return {"tol": args.tol * scale, "glmnet_tol": args.glmnet_tol * scale,
            "sklearn_solver": args.sklearn_solver}


# --------------------------------------------------------------------------- references

def reference_errors(X, y, loss, grid, folds, indices):
    """{index: {error name: its mean over the folds}} at the grid's ``indices``: the
    held-out errors of asyncopt's fits at a relative gap of REFERENCE_TOL, one per fold
    and index."""
    from asyncopt import Lasso, SparseLogisticRegression
    model = Lasso if loss == "squared" else SparseLogisticRegression
    errors = {}
    for index in sorted(set(indices)):
        per_fold = []
        for train, test in folds:
            est = model(alpha=grid[index], tol=REFERENCE_TOL, max_epochs=100_000).fit(
                X[train], y[train])
            margins = X[test] @ np.ravel(est.coef_) + float(np.ravel(est.intercept_)[0])
            if loss == "squared":
                per_fold.append({"mse": np.mean((margins - y[test]) ** 2)})
            else:
                per_fold.append({"log_loss": np.mean(np.logaddexp(0.0, -y[test] * margins)),
                                 "misclassification": np.mean(
                                     np.where(margins > 0, 1.0, -1.0) != y[test])})
        errors[index] = {name: float(np.mean([f[name] for f in per_fold]))
                         for name in per_fold[0]}
    return errors


class Optimum:
    """(P - P*) / P(0) of a fit at its lam, P* asyncopt's certified OPTIMUM_TOL fit
    there (or any lower P offered), the intercept refitted exactly."""

    def __init__(self, X, y, loss):
        from asyncopt.problem import Problem
        self.X, self.y, self.loss = X, y, loss
        self.problem = Problem(X, y, loss, None, 1.0, True)
        self.p0 = self.problem.null_objective()
        self.best = {}

    def _primal(self, lam, coef, intercept):
        return self.problem.with_lam(lam).certificate(coef, intercept).primal

    def offer(self, lam, coef, intercept):
        """P of a fit at ``lam``; P* there updated."""
        from asyncopt import Lasso, SparseLogisticRegression
        if lam not in self.best:
            model = Lasso if self.loss == "squared" else SparseLogisticRegression
            est = model(alpha=lam, tol=OPTIMUM_TOL, max_epochs=100_000).fit(self.X, self.y)
            self.best[lam] = self._primal(lam, np.ravel(est.coef_),
                                          float(np.ravel(est.intercept_)[0]))
        primal = self._primal(lam, coef, intercept)
        self.best[lam] = min(self.best[lam], primal)
        return primal

    def suboptimality(self, lam, primal):
        return max(0.0, primal - self.best[lam]) / self.p0

    def accuracy(self, run):
        """(refit's, last alpha's) suboptimality of a run whose P were offered (None
        where the check did not run)."""
        check = run.get("check")
        return (self.suboptimality(run["lam_refit"], run["primal"]),
                None if check is None else self.suboptimality(check["lam"],
                                                              check["primal"]))


# --------------------------------------------------------------------------- the benchmark

def measure_row(name, X, y, loss, args):
    grid, folds = make_grid(X, y, loss, args.n_alphas), make_folds(X.shape[0])
    runs, optimum = {}, Optimum(X, y, loss)
    with tempfile.TemporaryDirectory() as folder:
        for solver in args.solvers:
            attempts = []
            for step in range(1 if solver == "asyncopt" else args.tol_steps + 1):
                run = run_solver(solver, name, loss, args, folder, 10.0 ** -step)
                attempts.append(run)
                if run["status"] != "ok":
                    print(f"  {name} {MODEL[loss]} {solver} tol {run['tol']:g}: "
                          f"{run['status']} {run.get('error', '')}", flush=True)
                    break
                run["primal"] = optimum.offer(run["lam_refit"], run["coef"],
                                              run["intercept"])
                if "check" in run:
                    run["check"]["primal"] = optimum.offer(**{
                        k: run["check"][k] for k in ("lam", "coef", "intercept")})
                refit, last = optimum.accuracy(run)
                print(f"  {name} {MODEL[loss]} {solver} tol {run['tol']:g}: "
                      f"{run['seconds']:.3f} s, index {run['index']}, subopt "
                      f"{refit:.1e} (refit), {last or float('nan'):.1e} (last alpha)",
                      flush=True)
                if max(refit, last or 0.0) <= args.tol:
                    break
            runs[solver] = dict(attempts[-1], attempts=[
                {k: a.get(k) for k in ("tol", "status", "seconds", "index", "lam_refit",
                                        "primal", "check", "check_error")}
                for a in attempts])
    errors = reference_errors(X, y, loss, grid, folds,
                              [run["index"] for run in runs.values() if "index" in run])
    ours = runs.get("asyncopt", {})
    solvers = {}
    for solver, run in runs.items():
        for attempt in run["attempts"]:
            if attempt["status"] == "ok":
                attempt["refit_suboptimality"], attempt["last_alpha_suboptimality"] = \
                    optimum.accuracy(attempt)
            if attempt.get("check"):
                attempt["check"] = {k: v for k, v in attempt["check"].items()
                                    if k != "coef"}
        entry = {k: v for k, v in run.items() if k not in ("coef", "metric", "check")}
        if run["status"] == "ok":
            k = run["index"]
            entry.update(
                alpha_over_lam_max=grid[k] / grid[0],
                same_alpha_as_asyncopt=(k == ours["index"])
                if ours.get("status") == "ok" else None,
                held_out=errors[k],
                own_mean_metric=np.mean(run["metric"], axis=1),
                refit_suboptimality=run["attempts"][-1]["refit_suboptimality"],
                last_alpha_suboptimality=run["attempts"][-1]["last_alpha_suboptimality"],
                nonzeros=int(np.count_nonzero(run["coef"])),
                over_asyncopt=run["seconds"] / ours["seconds"]
                if ours.get("status") == "ok" else None)
        solvers[solver] = entry
    peers = [run["seconds"] for s, run in runs.items()
             if s != "asyncopt" and run["status"] == "ok"]
    fastest = min(peers) if peers else None
    return {"data": name, "loss": loss, "n": X.shape[0], "p": X.shape[1],
            "lam_max": grid[0], "grid": grid, "eps": EPS[loss], "n_folds": N_FOLDS,
            "fold_test_sizes": [len(test) for _, test in folds],
            "held_out_reference_tol": REFERENCE_TOL,
            "solvers": solvers, "fastest_peer_s": fastest,
            "asyncopt_over_fastest_peer": ours["seconds"] / fastest
            if fastest and ours.get("status") == "ok" else None}


HEADER = ["data", "model", "solver", "tol", "seconds", "/ asyncopt", "index",
          "alpha/lam_max", "same alpha", "held-out MSE / log-loss", "misclass.",
          "subopt refit", "subopt last"]


def table_lines(row, cap):
    """One table line per solver of a row."""
    lines = []
    for solver, run in row["solvers"].items():
        line = [row["data"], MODEL[row["loss"]], solver, f"{run['tol']:g}"]
        if run["status"] != "ok":
            lines.append(line + [f"> {cap:g}" if run["status"] == "over cap" else "error"]
                         + ["-"] * (len(HEADER) - 5))
            continue
        held = run["held_out"]
        same = run["same_alpha_as_asyncopt"]
        lines.append(line + [
            f"{run['seconds']:.2f}",
            "-" if run["over_asyncopt"] is None else f"{run['over_asyncopt']:.2f}",
            str(run["index"]), f"{run['alpha_over_lam_max']:.4g}",
            "-" if same is None else ("yes" if same else "no"),
            f"{held.get('mse', held.get('log_loss')):.4f}",
            f"{held['misclassification']:.4f}" if "misclassification" in held else "-",
            f"{run['refit_suboptimality']:.1e}",
            "-" if run["last_alpha_suboptimality"] is None
            else f"{run['last_alpha_suboptimality']:.1e}"])
    return lines


def main(argv=None):
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", default=list(DATA))
    ap.add_argument("--loss", nargs="+", default=list(LOSSES), choices=LOSSES)
    ap.add_argument("--solvers", nargs="+", default=list(SOLVERS), choices=SOLVERS)
    ap.add_argument("--n-alphas", type=int, default=100)
    ap.add_argument("--cap", type=float, default=180.0,
                    help="seconds one timed fit may run before it is killed")
    ap.add_argument("--repeat", type=int, default=3,
                    help="each time the best of this many fits (those under 30 s)")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="asyncopt's, skglm's and scikit-learn's tol")
    ap.add_argument("--glmnet-tol", type=float, default=1e-7)
    ap.add_argument("--tol-steps", type=int, default=3,
                    help="a peer whose refit is not within --tol P(0) of the optimum is "
                         "run again at tol / 10, this many times at most")
    ap.add_argument("--sklearn-solver", default="liblinear", choices=("liblinear", "saga"))
    ap.add_argument("--output", default=os.path.join(RESULTS_DIR, "bench_path.json"))
    args = ap.parse_args(argv)
    rows, table = [], []
    for name in args.data:
        X, y = load(name)
        for loss in args.loss:
            row = measure_row(name, X, y, loss, args)
            rows.append(row)
            table.extend(table_lines(row, args.cap))
            print(format_table(HEADER, table_lines(row, args.cap)), flush=True)
    print()
    print(format_table(HEADER, table))
    payload = {"benchmark": "bench_path",
               "machine": machine_info(("skglm", "sklearn", "glmnet")),
               "settings": dict(vars(args), n_folds=N_FOLDS, eps=EPS,
                                warm_up_rows=WARM_UP_ROWS, repeat_below_s=REPEAT_BELOW,
                                reference_tol=REFERENCE_TOL, optimum_tol=OPTIMUM_TOL,
                                sklearn_max_iter=MAX_ITER, threads=ONE_THREAD),
               "rows": rows}
    write_json(args.output, payload)
    plot(rows, args.solvers, args.cap, args.output.replace(".json", ".png"))
    print(f"wrote {args.output}")


def plot(rows, solvers, cap, path):
    """Seconds per row (log scale), one bar per solver; hatched at the cap: over it."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    fig, ax = pyplot.subplots(figsize=(max(7, 1.4 * len(rows)), 4.5))
    width = 0.8 / len(solvers)
    for k, solver in enumerate(solvers):
        color = f"C{k}"
        for i, row in enumerate(rows):
            run = row["solvers"].get(solver, {})
            if run.get("status") == "ok":
                ax.bar(i + k * width, run["seconds"], width, color=color)
            elif run.get("status") == "over cap":
                ax.bar(i + k * width, cap, width, color="none", edgecolor=color,
                       hatch="//")
        ax.bar(0, 0, 0, color=color, label=solver)
    ax.set(xticks=np.arange(len(rows)) + 0.4 - width / 2, yscale="log",
           ylabel=f"seconds: {N_FOLDS}-fold CV over the path + refit",
           title=f"bench_path, {time.strftime('%Y-%m-%d')}, {os.uname().nodename}")
    ax.set_xticklabels([f"{r['data']}\n{MODEL[r['loss']]}" for r in rows], fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)


if __name__ == "__main__":
    main()
