"""Serial benchmark: seconds to reach duality gap <= 1e-6 * P(0), asyncopt's serial DDSS
against scikit-learn, celer, skglm and copt's SAGA, every solver measured with our gap.

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_serial.py [--quick]
        [--time-cap S] [--repeat N] [--only NAME ...] [--target 1e-6]

Problems (full mode):
  ctr_lasso_1e-3 / _1e-4   make_ctr(200_000, 100_000, nnz_per_row=30, random_state=0),
                           Lasso with intercept, lam = 1e-3 / 1e-4 lam_max
  a9a_d2_lasso / _logreg   load_a9a(degree=2) (5,425 columns), lam = 1e-2 lam_max
  a9a_d3_lasso / _logreg   load_a9a(degree=3) (93,604 columns), lam = 1e-2 lam_max
The Lasso problems fit an intercept; the logistic ones do not (celer's sparse logistic
regression has none), for every solver. a9a's one-hot groups make a constant column a sum of
features, so the intercept is representable anyway.

--quick: CTR 20,000 x 10,000 and the first 5,000 rows of a9a degree 2, 1 s time cap: a
smoke test (about a minute, 15 s of it compiling skglm's numba kernels).

--group-size G: the same problems with the group penalty on consecutive groups of G
features (weights sqrt(G)) instead of L1, named ``*_group{G}``; the peers that have it:
celer.GroupLasso (squared loss), skglm.GroupLasso (squared) and skglm's LogisticGroup
datafit with its GroupProxNewton solver (logistic); scikit-learn and copt have none.
``ddss_nonewton`` (DDSS without the support Newton step) shows what the step does.

How each solver is timed (see benchmarks/README.md):
  asyncopt DDSS variants: one run with tol = target; time of the first history_ record
    whose rel_gap <= target (the record times come from the solver's own clock).
  scikit-learn, celer, skglm: fits from scratch at decreasing tolerances (decades, then one
    refinement between the last miss and the first hit); the time of the fastest fit whose
    gap, measured by ``problem.certificate``, is <= target.
  copt SAGA: one run, our gap evaluated after every epoch in copt's callback; the time spent
    in the callback (and copt's per-call JIT compilation) is excluded.
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

# the repository root, after PYTHONPATH (so PYTHONPATH can point at another asyncopt tree)
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (RESULTS_DIR, EpochClock, SolverRun, TargetReached,  # noqa: E402
                               TimeCapReached, format_seconds, format_table, from_history,
                               machine_info, plot_gap_curves, quiet_warnings, ratio,
                               tolerance_sequence, write_json)

from benchmarks._mpi_run import make_penalty  # noqa: E402

from asyncopt.data import load_a9a, make_ctr  # noqa: E402
from asyncopt.problem import Problem  # noqa: E402
from asyncopt.solvers import solve_ddss  # noqa: E402

SOLVERS = ("ddss", "ddss_noscreen", "ddss_nonewton", "ddss_naive", "sklearn", "celer",
           "skglm", "copt_saga")
SOLVER_LABELS = {
    "ddss": "asyncopt DDSS",
    "ddss_noscreen": "DDSS, no screening",
    "ddss_nonewton": "DDSS, no Newton step",
    "ddss_naive": "DDSS-Naive",
    "sklearn": "scikit-learn",
    "celer": "celer",
    "skglm": "skglm",
    "copt_saga": "copt SAGA",
}


# --------------------------------------------------------------------------- problems

def problem_specs(quick, group_size=1):
    """The problems (``group_size`` > 1: the group penalty on consecutive groups of that
    many features, ``*_group{G}``)."""
    ctr = "ctr_small" if quick else "ctr"
    a9a = "a9a_d2_small" if quick else "a9a_d2"
    specs = [
        dict(name="ctr_lasso_1e-3", data=ctr, loss="squared", lam_ratio=1e-3,
             fit_intercept=True),
        dict(name="ctr_lasso_1e-4", data=ctr, loss="squared", lam_ratio=1e-4,
             fit_intercept=True),
        dict(name="a9a_d2_lasso", data=a9a, loss="squared", lam_ratio=1e-2,
             fit_intercept=True),
        dict(name="a9a_d2_logreg", data=a9a, loss="logistic", lam_ratio=1e-2,
             fit_intercept=False),
    ]
    if not quick:
        specs += [
            dict(name="a9a_d3_lasso", data="a9a_d3", loss="squared", lam_ratio=1e-2,
                 fit_intercept=True),
            dict(name="a9a_d3_logreg", data="a9a_d3", loss="logistic", lam_ratio=1e-2,
                 fit_intercept=False),
        ]
    if group_size > 1:
        for spec in specs:
            spec["name"] += f"_group{group_size}"
    for spec in specs:
        spec["group_size"] = group_size
    return specs


def group_lists(penalty):
    """The groups of a GroupL1 as lists of feature ids (what celer and skglm take when the
    features are no multiple of the group size)."""
    return [penalty.ids[a:b].tolist() for a, b in zip(penalty.indptr[:-1],
                                                      penalty.indptr[1:])]


def not_offered(solver, spec):
    """Why ``solver`` does not solve ``spec`` (None when it does)."""
    if spec["group_size"] > 1:
        if solver in ("sklearn", "copt_saga"):
            return "no group penalty"
        if solver == "celer" and spec["loss"] != "squared":
            return "celer's GroupLasso has the squared loss only"
    return None


CTR_SIZES = {"ctr": (200_000, 100_000), "ctr_small": (20_000, 10_000),
             "ctr_tall": (1_600_000, 100_000)}    # (rows, features); 30 non-zeros a row
DATA_DESCRIPTION = {
    **{key: f"make_ctr({n:_}, {p:_}, nnz_per_row=30, random_state=0)"
       for key, (n, p) in CTR_SIZES.items()},
    "a9a_d2": "load_a9a(degree=2)",
    "a9a_d2_small": "load_a9a(degree=2), first 5,000 rows",
    "a9a_d3": "load_a9a(degree=3)",
}


def load_data(key):
    """(X, y) of a DATA_DESCRIPTION key: CSR float64 with sorted indices."""
    if key in CTR_SIZES:
        X, y, _ = make_ctr(*CTR_SIZES[key], nnz_per_row=30, random_state=0)
    elif key == "a9a_d2":
        X, y = load_a9a(degree=2)
    elif key == "a9a_d2_small":
        X, y = load_a9a(degree=2)
        X, y = X[:5000], y[:5000]
    elif key == "a9a_d3":
        X, y = load_a9a(degree=3)
    else:
        raise ValueError(key)
    X = sp.csr_matrix(X, dtype=np.float64)
    X.sort_indices()
    return X, np.ascontiguousarray(y, dtype=np.float64)


# --------------------------------------------------------------------------- asyncopt

def source_fingerprint():
    """Where the asyncopt package was imported from and a hash of its .py files."""
    import hashlib
    import asyncopt
    root = os.path.dirname(os.path.abspath(asyncopt.__file__))
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), "rb") as f:
                    digest.update(name.encode() + f.read())
    return {"path": root, "sha256_py": digest.hexdigest()[:16]}


DDSS_VARIANTS = {
    "ddss": dict(screening=True, variance_reduced=True),
    "ddss_noscreen": dict(screening=False, variance_reduced=True),
    "ddss_nonewton": dict(screening=True, variance_reduced=True, support_newton=False),
    "ddss_naive": dict(screening=True, variance_reduced=False, support_newton=False),
}


def run_ddss(name, problem, target, cap, repeat):
    """One DDSS variant to the target gap, stopped by the solver's own max_time at the cap."""
    best = None
    for rep in range(max(1, repeat)):
        result = solve_ddss(problem, tol=target, max_epochs=10 ** 7, random_state=rep,
                            max_time=cap, **DDSS_VARIANTS[name])
        run = from_history(name, result.history, target,
                           note="" if result.converged else "stopped at the time cap")
        run.extra["support"] = int(np.count_nonzero(result.coef)) if result.converged \
            else None
        if run.reached and run.time > cap:
            run.reached, run.note = False, "reached after the time cap"
        if best is None or (run.reached and (not best.reached or run.time < best.time)):
            best = run
    return best


def warm_up(group_size=1):
    """Compile every numba kernel (asyncopt, skglm) on tiny problems of the same dtypes;
    with ``group_size`` > 1 those of the group problems too, the group Newton step's
    included (solves to 1e-10 take it)."""
    X, y, _ = make_ctr(400, 300, nnz_per_row=5, random_state=1)
    ylog = np.where(y > np.median(y), 1.0, -1.0)
    for loss, yy in (("squared", y), ("logistic", ylog)):
        for fit_intercept in (True, False):
            prob = Problem(X, yy, loss, lam=1.0, fit_intercept=fit_intercept)
            prob = prob.with_lam(0.1 * prob.lam_max())
            for variant in DDSS_VARIANTS.values():
                solve_ddss(prob, tol=1e-4, max_epochs=5, random_state=0, **variant)
            prob.certificate(np.zeros(X.shape[1]), 0.0)
            if group_size > 1:
                prob = Problem(X, yy, loss, make_penalty(X.shape[1], group_size), 1.0,
                               fit_intercept)
                prob = prob.with_lam(0.1 * prob.lam_max())
                solve_ddss(prob, tol=1e-10, max_epochs=500, random_state=0)
    with quiet_warnings():
        try:
            import skglm
            skglm.Lasso(alpha=1e-3, tol=1e-4).fit(X, y)
            skglm.SparseLogisticRegression(alpha=1e-3, tol=1e-4,
                                           fit_intercept=False).fit(X, ylog)
            if group_size > 1:
                for loss, yy in (("squared", y), ("logistic", ylog)):
                    spec = dict(loss=loss, fit_intercept=False, group_size=group_size)
                    _skglm_group_model(X.shape[1], group_size, spec, 1e-3, 1e-4).fit(
                        X.toarray() if loss == "logistic" else X, yy)
        except ImportError:
            pass


# --------------------------------------------------------------------------- external peers

def _intercept(value):
    arr = np.ravel(np.asarray(value, dtype=np.float64))
    return float(arr[0]) if arr.size else 0.0


def _fit_linear_model(model, X, y):
    """Fit a scikit-learn-style linear model: (coef, intercept, {"support": nnz})."""
    with quiet_warnings():
        model.fit(X, y)
    coef = np.ravel(model.coef_)
    return coef, _intercept(getattr(model, "intercept_", 0.0)), {
        "support": int(np.count_nonzero(coef))}


def _geometric_mean(a, b):
    return math.sqrt(a * b)


def run_sklearn(X, y, spec, lam, evaluate, target, cap, repeat):
    from sklearn.linear_model import Lasso, LogisticRegression

    state = {"max_iter": 100_000}

    n = X.shape[0]

    def fit(tol):
        if spec["loss"] == "squared":
            model = Lasso(alpha=lam, fit_intercept=spec["fit_intercept"], tol=tol,
                          max_iter=state["max_iter"], selection="cyclic")
        else:
            model = LogisticRegression(C=1.0 / (lam * n), l1_ratio=1.0, solver="saga",
                                       fit_intercept=spec["fit_intercept"], tol=tol,
                                       max_iter=state["max_iter"])
        used_max_iter = state["max_iter"]
        t0 = time.perf_counter()
        with quiet_warnings():
            model.fit(X, y)
        elapsed = time.perf_counter() - t0
        n_iter = int(np.max(model.n_iter_))
        # bound the next fit's epochs so that it cannot run far past the cap
        state["max_iter"] = max(10, int(1.5 * cap / max(elapsed / max(n_iter, 1), 1e-9)))
        coef = np.ravel(model.coef_)
        return coef, _intercept(model.intercept_), {
            "n_iter": n_iter, "hit_max_iter": n_iter >= used_max_iter,
            "support": int(np.count_nonzero(coef))}

    if spec["loss"] == "squared":
        params = [10.0 ** -k for k in range(3, 15)]
        note = "Lasso (coordinate descent, cyclic); tol sequence 1e-3 .. 1e-14"
    else:
        params = [10.0 ** -k for k in range(2, 13)]
        note = ("LogisticRegression(l1_ratio=1, solver='saga', C=1/(lam n)); "
                "tol sequence 1e-2 .. 1e-12")
    return tolerance_sequence("sklearn", fit, evaluate, target, params, cap=cap,
                              repeat=repeat, refine=_geometric_mean, note=note)


def run_celer(X, y, spec, lam, evaluate, target, cap, repeat):
    import celer

    n = X.shape[0]

    group_size = spec["group_size"]

    def fit(tol):
        if group_size > 1:
            penalty = make_penalty(X.shape[1], group_size)
            model = celer.GroupLasso(groups=group_lists(penalty), alpha=lam,
                                     weights=penalty.weights,
                                     fit_intercept=spec["fit_intercept"], tol=tol,
                                     max_iter=1000, max_epochs=100_000)
        elif spec["loss"] == "squared":
            model = celer.Lasso(alpha=lam, fit_intercept=spec["fit_intercept"], tol=tol,
                                max_iter=1000, max_epochs=100_000)
        else:
            if spec["fit_intercept"]:
                raise ValueError("celer's LogisticRegression fits no intercept")
            model = celer.LogisticRegression(C=1.0 / (lam * n), tol=tol, max_iter=1000,
                                             max_epochs=100_000, fit_intercept=False)
        return _fit_linear_model(model, X, y)

    params = [10.0 ** -k for k in range(2, 15)]
    note = ("celer.GroupLasso(weights=sqrt(|g|))" if group_size > 1 else
            "celer.Lasso" if spec["loss"] == "squared" else
            "celer.LogisticRegression(C=1/(lam n)), no intercept") + \
        "; tol sequence 1e-2 .. 1e-14"
    return tolerance_sequence("celer", fit, evaluate, target, params, cap=cap,
                              repeat=repeat, refine=_geometric_mean, note=note)


def run_skglm(X, y, spec, lam, evaluate, target, cap, repeat):
    import skglm

    group_size = spec["group_size"]
    dense = group_size > 1 and spec["loss"] != "squared"
    if dense:      # GroupProxNewton takes no sparse X; densified once, not timed
        need = 8.0 * X.shape[0] * X.shape[1]
        if need > DENSE_LIMIT_BYTES:
            raise ValueError(f"skglm's GroupProxNewton takes dense X only: "
                             f"{need / 1e9:.1f} GB")
    X_fit = X.toarray() if dense else X

    def fit(tol):
        if group_size > 1:
            model = _skglm_group_model(X.shape[1], group_size, spec, lam, tol)
        elif spec["loss"] == "squared":
            model = skglm.Lasso(alpha=lam, fit_intercept=spec["fit_intercept"], tol=tol,
                                max_iter=1000, max_epochs=100_000)
        else:
            model = skglm.SparseLogisticRegression(alpha=lam,
                                                   fit_intercept=spec["fit_intercept"],
                                                   tol=tol, max_iter=1000,
                                                   max_epochs=100_000)
        return _fit_linear_model(model, X_fit, y)

    params = [10.0 ** -k for k in range(2, 15)]
    note = ("skglm.GroupLasso(weights=sqrt(|g|))" if group_size > 1 and
            spec["loss"] == "squared" else
            "skglm LogisticGroup + WeightedGroupL2(alpha=lam) with GroupProxNewton, dense X"
            if group_size > 1 else "skglm.Lasso" if spec["loss"] == "squared" else
            "skglm.SparseLogisticRegression(alpha=lam)") + "; tol sequence 1e-2 .. 1e-14"
    return tolerance_sequence("skglm", fit, evaluate, target, params, cap=cap,
                              repeat=repeat, refine=_geometric_mean, note=note)


DENSE_LIMIT_BYTES = 4e9    # X densified for skglm's GroupProxNewton up to this size


def _skglm_group_model(n_features, group_size, spec, lam, tol):
    """skglm's estimator of the group problem: GroupLasso (squared loss), or its
    LogisticGroup datafit and WeightedGroupL2 penalty with the GroupProxNewton solver."""
    import skglm
    penalty = make_penalty(n_features, group_size)
    groups, weights = group_lists(penalty), penalty.weights
    if spec["loss"] == "squared":
        return skglm.GroupLasso(groups=groups, alpha=lam, weights=weights,
                                fit_intercept=spec["fit_intercept"], tol=tol,
                                max_iter=1000, max_epochs=100_000)
    from skglm.datafits import LogisticGroup
    from skglm.penalties import WeightedGroupL2
    from skglm.solvers import GroupProxNewton
    from skglm.utils.data import grp_converter
    grp_indices, grp_ptr = grp_converter(groups, n_features)
    return skglm.GeneralizedLinearEstimator(
        datafit=LogisticGroup(grp_ptr, grp_indices),
        penalty=WeightedGroupL2(lam, weights, grp_ptr, grp_indices),
        solver=GroupProxNewton(tol=tol, max_iter=1000,
                               fit_intercept=spec["fit_intercept"]))


_COPT_KERNELS = {}


def _copt_kernels():
    """A serial logistic derivative (copt's own is @njit(parallel=True), which launches a
    parallel region per sample inside its SAGA epoch) and an L1 prox that leaves an
    appended intercept column unpenalised. Same formulas as copt.loss / copt.penalty."""
    if not _COPT_KERNELS:
        from numba import njit

        @njit
        def log_deriv(p, y):
            out = np.zeros_like(p)
            for i in range(p.size):
                if p[i] < 0:
                    exp_p = np.exp(p[i])
                    out[i] = ((1 - y[i]) * exp_p - y[i]) / (1 + exp_p)
                else:
                    exp_nx = np.exp(-p[i])
                    out[i] = ((1 - y[i]) - y[i] * exp_nx) / (1 + exp_nx)
            return out

        def make_prox(alpha, skip):
            @njit
            def prox_l1(x, i, indices, indptr, d, step_size):
                for j in range(indptr[i], indptr[i + 1]):
                    j_idx = indices[j]
                    if j_idx == skip:
                        continue
                    a = x[j_idx] - alpha * d[j_idx] * step_size
                    b = -x[j_idx] - alpha * d[j_idx] * step_size
                    x[j_idx] = np.fmax(a, 0) - np.fmax(b, 0)
            return prox_l1

        _COPT_KERNELS["log_deriv"] = log_deriv
        _COPT_KERNELS["make_prox"] = make_prox
    return _COPT_KERNELS


def run_copt(X, y, spec, lam, evaluate, target, cap, repeat):
    import copt

    n, p = X.shape
    fit_intercept = spec["fit_intercept"]
    A = sp.hstack([X, np.ones((n, 1))], format="csr") if fit_intercept else X
    A.sort_indices()
    kernels = _copt_kernels()
    row_sq = np.asarray(A.multiply(A).sum(axis=1)).ravel()
    if spec["loss"] == "squared":
        b = y
        deriv = copt.loss.SquareLoss(A, b).partial_deriv        # z - y; f = (z - y)^2 / 2
        l_max = float(row_sq.max())
    else:
        b = (y + 1.0) / 2.0                                      # copt's LogLoss wants 0/1
        deriv = kernels["log_deriv"]
        l_max = 0.25 * float(row_sq.max())
    step = 1.0 / (3.0 * l_max)                                   # ProxASAGA's step
    prox = kernels["make_prox"](lam, p if fit_intercept else -1)
    note = ("copt.minimize_saga, SquareLoss (mean of (z-y)^2/2)" if spec["loss"] == "squared"
            else "copt.minimize_saga, LogLoss derivative (serial copy), labels 0/1") + \
        ", L1Norm prox, step 1/(3 L_max)" + \
        ("; intercept = appended ones column left out of the prox" if fit_intercept else "")

    best = None
    for rep in range(max(1, repeat)):
        clock = EpochClock()
        curve = []

        def callback(env):
            if "it" not in env:          # before the first epoch: compile, then start the clock
                env["_saga_epoch"](env["x"], env["idx"][:0], env["memory_gradient"],
                                   env["gradient_average"], env["grad_tmp"],
                                   env["step_size"])
                curve.append((0.0, float(evaluate(*split(env["x"])))))
                clock.start()
                return
            t = clock.pause()
            gap = float(evaluate(*split(env["x"])))
            curve.append((t, gap))
            if gap <= target:
                raise TargetReached
            if t > cap:
                raise TimeCapReached
            clock.resume()

        def split(x):
            return (x[:p], float(x[p])) if fit_intercept else (x, 0.0)

        np.random.seed(rep)
        try:
            with quiet_warnings():
                copt.minimize_saga(deriv, A, b, np.zeros(A.shape[1]), step,
                                   prox=prox, max_iter=10 ** 7, tol=0.0, verbose=0,
                                   callback=callback)
        except (TargetReached, TimeCapReached):
            pass
        run = SolverRun("copt_saga", False, curve=curve, note=note,
                        best_rel_gap=min(g for _, g in curve),
                        extra={"epochs": len(curve) - 1, "step_size": step})
        hit = [t for t, g in curve if g <= target and t <= cap]
        if hit:
            run.reached, run.time = True, hit[0]
        if best is None or (run.reached and (not best.reached or run.time < best.time)):
            best = run
    return best


EXTERNAL = {"sklearn": run_sklearn, "celer": run_celer, "skglm": run_skglm,
            "copt_saga": run_copt}


# --------------------------------------------------------------------------- main

def select(names, tokens):
    """Names matching any token; all of them when no token matches any. A token that is a
    name exactly keeps that name alone ("ddss" is not "ddss_naive" too); any other token
    keeps every name containing it ("ctr" keeps both CTR problems)."""
    if not tokens:
        return list(names)
    exact = set(tokens) & set(names)
    chosen = [n for n in names
              if n in exact or any(t in n for t in tokens if t not in exact)]
    return chosen if chosen else list(names)


def log(msg):
    print(msg, flush=True)


def _check(v, kind, op, bound):
    """Whether ratio v (exact or a bound, see common.ratio) satisfies ``v op bound``;
    None when a capped run leaves it undecided."""
    if v is None:
        return None
    if kind == "exact":
        return v >= bound if op == ">=" else v <= bound
    if op == ">=":          # lower bound settles "met", upper bound settles "not met"
        return True if (kind == "lower" and v >= bound) else \
            (False if kind == "upper" and v < bound else None)
    return True if (kind == "upper" and v <= bound) else \
        (False if kind == "lower" and v > bound else None)


def targets_report(results, cap):
    """The issue's targets on the CTR problems: (text lines, {key: met or None})."""
    lines, met = [], {}
    for name in ("ctr_lasso_1e-3", "ctr_lasso_1e-4"):
        runs = results.get(name)
        if not runs or "ddss" not in runs:
            continue
        ddss = runs["ddss"]
        checks = [("copt_saga", "copt_saga/ddss", ">=", 10,
                   "DDSS >= 10x faster than copt SAGA")]
        checks.append(("sklearn", "ddss/sklearn", "<=", 1.5,
                       "DDSS no slower than 1.5x scikit-learn CD"))
        if name == "ctr_lasso_1e-3":
            checks.append(("ddss_noscreen", "ddss_noscreen/ddss", ">=", 2,
                           "screening alone >= 2x"))
        for other, label, op, bound, text in checks:
            if other not in runs:
                continue
            if label.startswith("ddss/"):
                v, shown, kind = ratio(ddss, runs[other], cap)
            else:
                v, shown, kind = ratio(runs[other], ddss, cap)
            ok = _check(v, kind, op, bound)
            met[f"{name}: {label} {op} {bound}"] = ok
            lines.append(f"{name}: {text}: {label} = {shown} -> {_yes_no(ok)}")
    return lines, met


def _yes_no(ok):
    return "MET" if ok is True else ("NOT MET" if ok is False else "undecided")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (CTR 20k x 10k, a9a degree 2): a < 1 min smoke test")
    parser.add_argument("--time-cap", type=float, default=None,
                        help="seconds per solver and problem (default 120, 1 with --quick); "
                             "a tolerance sequence may spend 2x this in all its fits")
    parser.add_argument("--repeat", type=int, default=1,
                        help="best of N for every timed measurement (default 1)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="keep problems and/or solvers whose name contains NAME")
    parser.add_argument("--target", type=float, default=1e-6,
                        help="relative duality gap to reach (default 1e-6)")
    parser.add_argument("--output", default=None,
                        help="JSON path (default benchmarks/results/bench_serial[_quick].json"
                             "; the PNG goes next to it)")
    parser.add_argument("--group-size", type=int, default=1, metavar="G",
                        help="the group penalty on consecutive groups of G features "
                             "instead of L1 (problems *_groupG; default 1: L1)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--replot", metavar="JSON",
                        help="only redraw the PNG (next to JSON) from a results file")
    args = parser.parse_args(argv)
    if args.group_size < 1:
        parser.error(f"--group-size must be >= 1, got {args.group_size}")
    if args.replot:
        return replot(args.replot)
    cap = args.time_cap if args.time_cap is not None else (1.0 if args.quick else 120.0)
    target = args.target
    specs = problem_specs(args.quick, args.group_size)
    keep_problems = select([s["name"] for s in specs], args.only)
    specs = [s for s in specs if s["name"] in keep_problems]
    solvers = select(SOLVERS, args.only)
    stem = ("bench_serial_quick" if args.quick else "bench_serial") + \
        (f"_group{args.group_size}" if args.group_size > 1 else "")
    json_path = args.output or os.path.join(RESULTS_DIR, stem + ".json")
    png_path = os.path.splitext(json_path)[0] + ".png"

    info = machine_info(("sklearn", "celer", "skglm", "copt", "matplotlib"))
    info["asyncopt_source"] = source_fingerprint()
    log(f"bench_serial: {info['cpu_count']} cores, {info['cpu_model']}, python "
        f"{info['python']}, " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    log(f"target gap <= {target:g} * P(0), time cap {cap:g} s, repeat {args.repeat}, "
        f"problems {[s['name'] for s in specs]}, solvers {solvers}")

    t0 = time.perf_counter()
    warm_up(args.group_size)
    log(f"numba warm-up: {time.perf_counter() - t0:.1f} s")

    def finish(final=False):
        report(specs, results, problems_out, solvers, cap, target, args, info, t_start,
               json_path, png_path, final)

    data_cache = {}
    results, problems_out = {}, []
    t_start = time.perf_counter()
    for spec in specs:
        key = spec["data"]
        if key not in data_cache:
            data_cache.clear()
            t0 = time.perf_counter()
            data_cache[key] = load_data(key)
            log(f"data {DATA_DESCRIPTION[key]}: {data_cache[key][0].shape}, "
                f"nnz {data_cache[key][0].nnz:,} ({time.perf_counter() - t0:.1f} s)")
        X, y = data_cache[key]
        base = Problem(X, y, spec["loss"], make_penalty(X.shape[1], spec["group_size"]),
                       lam=1.0, fit_intercept=spec["fit_intercept"])
        t0 = time.perf_counter()
        lam_max = base.lam_max()          # also builds and caches the shuffled CSR copy
        prep = time.perf_counter() - t0
        lam = spec["lam_ratio"] * lam_max
        problem = base.with_lam(lam)
        zero = problem.zero_certificate()
        p0 = zero.primal

        def evaluate(coef, intercept, problem=problem, p0=p0):
            return problem.certificate(coef, intercept).gap / p0

        log(f"\n== {spec['name']}: {spec['loss']}, n={X.shape[0]:,}, p={X.shape[1]:,}, "
            f"nnz={X.nnz:,}, lam = {spec['lam_ratio']:g} lam_max = {lam:.4g}, "
            f"fit_intercept={spec['fit_intercept']}, P(0) = {p0:.6g}")
        runs = {}
        for solver in solvers:
            if not_offered(solver, spec):
                log(f"  {solver:14s} not run: {not_offered(solver, spec)}")
                continue
            t0 = time.perf_counter()
            try:
                if solver in DDSS_VARIANTS:
                    run = run_ddss(solver, problem, target, cap, args.repeat)
                else:
                    run = EXTERNAL[solver](X, y, spec, lam, evaluate, target, cap,
                                           args.repeat)
            except Exception as exc:  # noqa: BLE001 - one failing peer must not stop the rest
                run = SolverRun(solver, False, error=repr(exc))
            runs[solver] = run
            detail = ""
            if run.runs:
                detail = " fits: " + ", ".join(
                    f"{r['param']:.1e}->{r['rel_gap']:.1e}@{r['time']:.2f}s"
                    for r in run.runs if "time" in r)
            elif run.extra.get("epochs") is not None:
                detail = f" epochs {run.extra['epochs']}"
            best = f"{run.best_rel_gap:.2e}" if run.best_rel_gap is not None else "-"
            log(f"  {solver:14s} {format_seconds(run, cap):>8s} s  best rel gap {best}"
                f"  (wall {time.perf_counter() - t0:.1f} s){detail}"
                + (f"  ERROR {run.error}" if run.error else ""))
        results[spec["name"]] = runs
        support = runs["ddss"].extra.get("support") if "ddss" in runs else None
        problems_out.append({
            **spec, "data_description": DATA_DESCRIPTION[key], "n_samples": X.shape[0],
            "n_features": X.shape[1], "nnz": X.nnz, "lam_max": lam_max, "lam": lam,
            "P0": p0, "ddss_support": support, "asyncopt_prep_seconds": prep,
            "runs": {k: v.as_dict() for k, v in runs.items()}})
        if support is not None:
            log(f"  support of the DDSS solution: {support:,} of {X.shape[1]:,} features")
        finish()

    finish(final=True)
    return 0


def fastest_peer(runs):
    """The run of the fastest peer (scikit-learn, celer, skglm, copt) that reached the
    target, else any peer's run (all capped: a bound), None when no peer ran."""
    peers = [runs[s] for s in EXTERNAL if s in runs and not runs[s].error]
    reached = [r for r in peers if r.reached]
    if reached:
        return min(reached, key=lambda r: r.time)
    return peers[0] if peers else None


def report(specs, results, problems_out, solvers, cap, target, args, info, t_start,
           json_path, png_path, final):
    """Table, targets, JSON and PNG of the problems done so far (called after each one,
    so that an interrupted run keeps its results)."""
    done = [s for s in specs if s["name"] in results]
    header = ["problem"] + solvers + ["copt_saga/ddss", "ddss/sklearn",
                                      "ddss_noscreen/ddss", "ddss_nonewton/ddss",
                                      "best peer/ddss"]
    rows = []
    for spec in done:
        runs = results[spec["name"]]
        row = [spec["name"]] + [format_seconds(runs.get(s), cap) for s in solvers]
        row.append(ratio(runs.get("copt_saga"), runs.get("ddss"), cap)[1])
        row.append(ratio(runs.get("ddss"), runs.get("sklearn"), cap)[1])
        row.append(ratio(runs.get("ddss_noscreen"), runs.get("ddss"), cap)[1])
        row.append(ratio(runs.get("ddss_nonewton"), runs.get("ddss"), cap)[1])
        row.append(ratio(fastest_peer(runs), runs.get("ddss"), cap)[1])
        rows.append(row)
    table = format_table(header, rows)
    target_lines, met = targets_report(results, cap)
    if final:
        log(f"\nseconds to duality gap <= {target:g} * P(0) (our gap; >cap: not reached in "
            f"{cap:g} s)\n")
        log(table)
        if target_lines:
            log("\nissue targets (CTR problems):")
            for line in target_lines:
                log("  " + line)

    payload = {
        "benchmark": "bench_serial", "quick": args.quick, "complete": final,
        "target_rel_gap": target, "time_cap_s": cap, "repeat": args.repeat,
        "machine": info, "total_seconds": time.perf_counter() - t_start,
        "solvers": {s: SOLVER_LABELS[s] for s in solvers},
        "problems": problems_out, "table": {"header": header, "rows": rows},
        "table_text": table, "targets": met, "targets_text": target_lines,
        "method": {
            "gap": "problem.certificate(coef, intercept).gap / problem.zero_certificate()"
                   ".primal for every solver (the certificate refits the intercept)",
            "asyncopt": "one run of solve_ddss(tol=target); first history record with "
                        "rel_gap <= target; the one-time shuffled CSR copy of the data "
                        "(asyncopt_prep_seconds) is built before timing",
            "external": "fits from scratch at decreasing tol (decades, one geometric "
                        "refinement); fastest fit reaching the target; at most 2 x cap "
                        "seconds of fits per solver and problem",
            "copt_saga": "one run, gap after every epoch in the callback, callback time "
                         "and copt's per-call numba compilation excluded",
        },
    }
    write_json(json_path, payload)
    if not args.no_plot and done:
        panels = [(f"{s['name']} (lam={s['lam_ratio']:g} lam_max)", results[s["name"]])
                  for s in done]
        plot_gap_curves(png_path, panels, target=target, cap=cap,
                        title=f"serial: duality gap / P(0) vs seconds "
                              f"({info['cpu_count']} cores, {info['cpu_model']})",
                        solver_labels=SOLVER_LABELS)
    if final:
        log(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {png_path}"))


def replot(json_path):
    import json

    from benchmarks.common import run_from_dict
    with open(json_path) as f:
        payload = json.load(f)
    info = payload["machine"]
    panels = [(f"{p['name']} (lam={p['lam_ratio']:g} lam_max)",
               {k: run_from_dict(v) for k, v in p["runs"].items()})
              for p in payload["problems"]]
    png_path = os.path.splitext(json_path)[0] + ".png"
    plot_gap_curves(png_path, panels, target=payload["target_rel_gap"],
                    cap=payload["time_cap_s"],
                    title=f"serial: duality gap / P(0) vs seconds "
                          f"({info['cpu_count']} cores, {info['cpu_model']})",
                    solver_labels=SOLVER_LABELS)
    log(f"wrote {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
