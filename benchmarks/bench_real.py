"""asyncopt against the solvers people use, on real data: time until P - P* <= 1e-6 P(0).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_real.py                 # ~15 minutes
    PYTHONPATH=. .venv/bin/python benchmarks/bench_real.py --data dexter --loss squared

Rows: the data sets of ``../shared/data/real`` (dexter, leukemia, rcv1s, reuters; with
``--more``, CTR 200,000 x 100,000 and a9a degree 2 and 3), the Lasso and L1 logistic
regression, both with an intercept, at 0.1, 0.01 and 0.001 lam_max. Labels in {-1, +1}
are the Lasso's response as they are.

Solvers, each a fit from scratch on a ladder of its own tolerances, loosest first; its
time is that of the first fit that reaches the target (``common.tolerance_sequence``),
after one untimed warm-up fit (numba compilation, imports):
  - asyncopt: the ``asyncopt.Lasso`` / ``SparseLogisticRegression`` estimators, serial,
    with ``--method`` (default: the estimators' default, "auto"), and the same on the
    threads backend, 2 threads (column "2 threads"; ``--threads T``: T threads,
    ``--threads 0``: no column), and for the rows of ``--more``'s data sets with
    ``backend="mpi"`` under ``mpirun -n 3`` (``--mpi K``; ``mpi_measure``);
  - skglm (``Lasso``, ``SparseLogisticRegression``), celer (``Lasso``; its logistic
    model fits no intercept, so no row), scikit-learn (``Lasso``, coordinate descent;
    ``LogisticRegression(penalty="l1", solver="liblinear")``, whose intercept is
    penalised, intercept_scaling 100 making that negligible);
  - glmnet: python-glmnet's ``ElasticNet`` / ``LogitNet`` (alpha = 1: the Lasso's
    penalty; ``standardize=False``), fitted at the one lambda, ``lambda_path=[lam]``,
    its ``tol`` the ladder's (pinned in requirements.txt; a row says "n/a" where the
    package does not import).
Every solver is judged by one objective, P(w, b) = (1/n) sum f(y_i, a_i^T w + b) +
lam ||w||_1 (f squared / 2 or logistic), with b refitted exactly (asyncopt's certificate),
so no solver loses by its intercept. P* is the least P any run reached, asyncopt's run at
a certified relative gap of 1e-10 (so within 1e-10 P(0) of the optimum) among them.

Output: a table (seconds per solver, the fastest peer, asyncopt / fastest peer),
``results/bench_real.json`` (the machine, every fit of every ladder) and
``results/bench_real.png`` (seconds per row, log scale, one bar per solver).
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import (RESULTS_DIR, _sequence_result, format_table,  # noqa: E402
                               machine_info, quiet_warnings, tolerance_sequence,
                               write_json)

REAL = os.path.join(os.path.dirname(ROOT), "shared", "data", "real")
DATA = ("dexter", "leukemia", "rcv1s", "reuters")
MORE = ("ctr", "a9a_d2", "a9a_d3")
RATIOS = (0.1, 0.01, 0.001)
TARGET = 1e-6
LADDER = tuple(10.0 ** -k for k in range(2, 13))
PEERS = ("skglm", "celer", "sklearn", "glmnet")


def load(name):
    """(X CSR or dense, y in {-1, +1}) of one data set."""
    from asyncopt.data import load_a9a, load_libsvm, make_ctr
    if name == "ctr":
        X, y, _ = make_ctr(200_000, 100_000, nnz_per_row=30, random_state=0)
        return X, np.where(y > 0, 1.0, -1.0)
    if name.startswith("a9a_d"):
        return load_a9a(degree=int(name[-1]))
    return load_libsvm(os.path.join(REAL, f"{name}.svm.xz"))


class Row:
    """One problem: data, loss, lam; ``suboptimality(coef, b)`` = (P - P*) / P(0) once
    ``best`` (P*) is known."""

    def __init__(self, X, y, loss, ratio):
        from asyncopt.penalties import L1
        from asyncopt.problem import Problem
        self.X, self.y, self.loss, self.ratio = X, y, loss, ratio
        full = Problem(X, y, loss, L1(X.shape[1]), 1.0, True)
        self.lam = ratio * full.lam_max()
        self.problem = full.with_lam(self.lam)
        self.p0 = self.problem.null_objective()
        self.best = math.inf

    def primal(self, coef, b):
        coef = np.ascontiguousarray(np.ravel(coef), dtype=np.float64)
        return self.problem.certificate(coef, float(b)).primal

    def offer(self, coef, b):
        value = self.primal(coef, b)
        self.best = min(self.best, value)
        return value


def asyncopt_fit(row, method, threads=1):
    from asyncopt import Lasso, SparseLogisticRegression
    model = Lasso if row.loss == "squared" else SparseLogisticRegression
    chosen = {} if method is None else {"method": method}
    if threads > 1:
        chosen.update(backend="threads", n_jobs=threads)

    def fit(tol):
        est = model(alpha=row.lam, tol=tol, max_epochs=100_000, **chosen).fit(
            row.X, row.y)
        return est.coef_.ravel(), float(np.ravel(est.intercept_)[0]), {}
    return fit


def peer_fit(row, peer):
    """fit(tol) -> (coef, intercept, {}) of one peer, or None where it has no model."""
    n = row.X.shape[0]
    if peer == "skglm":
        import skglm
        if row.loss == "squared":
            return lambda tol: _sk(skglm.Lasso(alpha=row.lam, tol=tol, max_iter=1000,
                                               fit_intercept=True), row)
        return lambda tol: _sk(skglm.SparseLogisticRegression(
            alpha=row.lam, tol=tol, max_iter=1000, fit_intercept=True), row)
    if peer == "celer":
        if row.loss != "squared":
            return None
        import celer
        return lambda tol: _sk(celer.Lasso(alpha=row.lam, tol=tol, max_iter=1000,
                                           fit_intercept=True), row)
    if peer == "sklearn":
        from sklearn.linear_model import Lasso, LogisticRegression
        if row.loss == "squared":
            return lambda tol: _sk(Lasso(alpha=row.lam, tol=tol, max_iter=1_000_000), row)
        return lambda tol: _sk(LogisticRegression(
            penalty="l1", solver="liblinear", C=1.0 / (n * row.lam), tol=tol,
            intercept_scaling=100.0, max_iter=1_000_000), row)
    if peer == "glmnet":
        try:
            import glmnet
        except ImportError:
            return None
        if row.loss == "squared":
            return lambda tol: _glmnet(glmnet.ElasticNet(alpha=1.0, lambda_path=[row.lam],
                                                         tol=tol, standardize=False,
                                                         n_splits=0), row)
        return lambda tol: _glmnet(glmnet.LogitNet(alpha=1.0, lambda_path=[row.lam],
                                                   tol=tol, standardize=False,
                                                   n_splits=0), row)
    raise ValueError(peer)


def _sk(est, row):
    with quiet_warnings():
        est.fit(row.X, row.y)
    return np.ravel(est.coef_), float(np.ravel(est.intercept_)[0]) \
        if np.size(est.intercept_) else 0.0, {}


def _glmnet(est, row):
    """One-lambda fit: with ``n_splits=0`` python-glmnet keeps only the path's arrays."""
    est.fit(row.X, row.y)
    return np.ravel(est.coef_path_[..., 0]), float(np.ravel(est.intercept_path_)[0]), {}


def measure(row, name, fit, cap, repeat=1):
    """The ladder of one solver after a warm-up fit (each fit's time the best of
    ``repeat``), stopped at the first fit within
    TARGET of P* (``row.best``, already within 1e-10 P(0) of the optimum: asyncopt's
    certified reference)."""
    try:
        fit(LADDER[0])
    except Exception as exc:  # noqa: BLE001 - a peer's failure is its row's entry
        return _sequence_result(name, [{"param": LADDER[0], "error": repr(exc)}], TARGET,
                                "", error=repr(exc))
    return tolerance_sequence(
        name, fit, lambda coef, b: (row.offer(coef, b) - row.best) / row.p0, TARGET,
        LADDER, cap=cap, repeat=repeat)


def mpi_measure(row, name, ranks, cap, repeat):
    """asyncopt's estimator with ``backend="mpi"`` under ``mpirun -n ranks``, on the
    ladder: one job per tolerance, each rank loading the data set itself; a fit's time
    is rank 0's around ``fit`` (the best of ``repeat``, after a warm-up fit in the same
    job: numba, the MPI connections), so the job's start-up and loading are left out.
    None where mpirun is missing."""
    from benchmarks._mpi_run import find_mpirun, rank_environment
    mpirun = find_mpirun()
    if mpirun is None:
        return None
    runs = []
    for tol in LADDER:
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "fit.npz")
            command = [mpirun, "-n", str(ranks), sys.executable, os.path.abspath(__file__),
                       "--mpi-child", name, row.loss, repr(row.lam), repr(tol), out,
                       str(repeat)]
            try:
                proc = subprocess.run(command, env=rank_environment(), capture_output=True,
                                      text=True, timeout=(repeat + 1) * cap + 120)
            except subprocess.TimeoutExpired:
                runs.append({"param": tol, "error": "timeout"})
                break
            if proc.returncode != 0:
                runs.append({"param": tol, "error": proc.stderr[-300:]})
                break
            fitted = np.load(out)
            gap = (row.offer(fitted["coef"], float(fitted["intercept"])) - row.best) / row.p0
            runs.append({"param": tol, "time": float(fitted["seconds"]), "rel_gap": gap})
        if gap <= TARGET or runs[-1]["time"] > cap:
            break
    return _sequence_result(f"mpi -n {ranks}", runs, TARGET, "", cap=cap)


def mpi_child(name, loss, lam, tol, out, repeat):
    """The job ``mpi_measure`` starts (every rank): load, warm up, time, and rank 0
    writes coef, intercept and the best fit's seconds to ``out``."""
    from mpi4py import MPI

    from asyncopt import Lasso, SparseLogisticRegression
    comm = MPI.COMM_WORLD
    X, y = load(name)
    model = Lasso if loss == "squared" else SparseLogisticRegression
    settings = dict(alpha=float(lam), backend="mpi", max_epochs=100_000)
    model(tol=1e-2, **settings).fit(X, y)
    best = math.inf
    for _ in range(int(repeat)):
        comm.Barrier()
        began = time.perf_counter()
        est = model(tol=float(tol), **settings).fit(X, y)
        best = min(best, time.perf_counter() - began)
    if comm.Get_rank() == 0:
        np.savez(out, coef=np.ravel(est.coef_), intercept=float(np.ravel(est.intercept_)[0]),
                 seconds=best)


def main(argv=None):
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--mpi-child":
        return mpi_child(*sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", default=list(DATA))
    ap.add_argument("--more", action="store_true", help="add " + ", ".join(MORE))
    ap.add_argument("--loss", nargs="+", default=["squared", "logistic"])
    ap.add_argument("--ratios", nargs="+", type=float, default=list(RATIOS))
    ap.add_argument("--method", default=None, help="asyncopt's method (default: above)")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads of the threads column (0: none)")
    ap.add_argument("--mpi", type=int, default=3,
                    help="ranks of the mpirun column, on the rows of --more's data sets "
                         "(0: none)")
    ap.add_argument("--peers", nargs="+", default=list(PEERS))
    ap.add_argument("--cap", type=float, default=10.0,
                    help="seconds per fit at most: a solver whose fit takes longer is "
                         "'> cap' on that row")
    ap.add_argument("--repeat", type=int, default=3,
                    help="each fit's time: the best of this many (a shared VM is noisy)")
    ap.add_argument("--output", default=os.path.join(RESULTS_DIR, "bench_real.json"))
    args = ap.parse_args(argv)
    names = list(args.data) + (list(MORE) if args.more else [])
    threads_column = f"{args.threads} threads"
    mpi_column = f"mpi -n {args.mpi}"
    ours_columns = ("asyncopt",) + ((threads_column,) if args.threads > 1 else ()) + \
        ((mpi_column,) if args.mpi > 1 and set(names) & set(MORE) else ())
    columns = ours_columns + tuple(args.peers)
    rows, table = [], []
    for name in names:
        X, y = load(name)
        for loss in args.loss:
            for ratio in args.ratios:
                row = Row(X, y, loss, ratio)
                method = args.method
                reference = asyncopt_fit(row, method)(1e-10)
                row.offer(*reference[:2])
                results, times = {}, {}
                for solver in columns:
                    if solver == mpi_column:
                        run = mpi_measure(row, name, args.mpi, args.cap, args.repeat) \
                            if name in MORE else None
                        times[solver] = run.time if run is not None and run.reached \
                            else None
                        results[solver] = {"available": False, "seconds": None} \
                            if run is None else {"seconds": times[solver],
                                                 "runs": run.runs, "error": run.error}
                        continue
                    fit = asyncopt_fit(row, method) if solver == "asyncopt" else \
                        asyncopt_fit(row, method, args.threads) \
                        if solver == threads_column else peer_fit(row, solver)
                    if fit is None:
                        results[solver] = {"available": False, "seconds": None}
                        continue
                    run = measure(row, solver, fit, args.cap, args.repeat)
                    times[solver] = run.time if run.reached else None
                    results[solver] = {"seconds": times[solver], "runs": run.runs,
                                       "error": run.error}
                peer_times = [t for s, t in times.items() if s not in ours_columns and t]
                fastest = min(peer_times) if peer_times else None
                ours = times.get("asyncopt")
                rows.append({"data": name, "loss": loss, "ratio": ratio, "lam": row.lam,
                             "n": X.shape[0], "p": X.shape[1], "P_star": row.best,
                             "P0": row.p0, "method": method or "auto", "solvers": results,
                             "fastest_peer_s": fastest,
                             "asyncopt_over_fastest": ours / fastest
                             if ours and fastest else None})
                table.append([name, "Lasso" if loss == "squared" else "L1 logistic",
                              f"{ratio:g}"] +
                             [_cell(results[s]) for s in columns] +
                             [f"{ours / fastest:.2f}" if ours and fastest else "-"])
                print(format_table(["data", "model", "lam/lam_max", *columns,
                                    "ours/best"], table[-1:]), flush=True)
    print()
    print(format_table(["data", "model", "lam/lam_max", *columns, "ours/best"], table))
    payload = {"benchmark": "bench_real", "machine": machine_info(("skglm", "celer",
                                                                    "sklearn", "glmnet")),
               "target": TARGET, "ladder": LADDER, "rows": rows}
    write_json(args.output, payload)
    plot(rows, columns, args.output.replace(".json", ".png"))
    print(f"wrote {args.output}")


def _cell(res):
    if not res.get("available", True):
        return "n/a"
    return "-" if res["seconds"] is None else f"{res['seconds']:.3f}"


def plot(rows, solvers, path):
    """Seconds per row (log scale), one bar per solver; a missing bar: not reached."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows)), 4.5))
    width = 0.8 / len(solvers)
    for k, solver in enumerate(solvers):
        values = [r["solvers"].get(solver, {}).get("seconds") or np.nan for r in rows]
        ax.bar(np.arange(len(rows)) + k * width, values, width, label=solver)
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{r['data']}\n{'Lasso' if r['loss'] == 'squared' else 'logit'}"
                        f" {r['ratio']:g}" for r in rows], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(f"seconds to P - P* <= {TARGET:g} P(0)")
    ax.legend(fontsize=8)
    ax.set_title(f"bench_real, {time.strftime('%Y-%m-%d')}, {os.uname().nodename}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
