"""The first fit in a fresh process: asyncopt beside skglm, celer, scikit-learn, glmnet.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_startup.py            # ~3 minutes
    PYTHONPATH=. .venv/bin/python benchmarks/bench_startup.py --data dexter --repeat 5

What a user waits for the first model of a session: a fresh ``python`` process imports
the estimator's module, fits it once (``fit`` on data already in memory, loaded from a
neutral ``.npz`` of the CSR arrays so that no solver's loader is timed) and fits it a
second time (the warm fit that every other benchmark reports). Each solver's estimator
at its defaults but ``alpha`` (the Lasso and L1 logistic regression with an intercept,
at 0.01 lam_max; scikit-learn's logistic model is liblinear with C = 1 / (n lam)), so
the first fit is what ``Model(alpha).fit(X, y)`` costs.

Two states of the numba cache, the two a user meets:
  - "cold": ``NUMBA_CACHE_DIR`` an empty folder, so every jitted function of asyncopt
    (and of skglm, if it caches) is compiled in this process: a first run after
    ``pip install``;
  - "warm": the cache as the previous run of the same command left it: every later run.
Solvers without numba (celer, scikit-learn, glmnet: compiled code) read the same in
both. Each cell is the median of ``--repeat`` fresh processes; the relative
suboptimality of the first fit, (P - P*) / P(0) with P* the least P any fit reached
(asyncopt's tol=1e-10 fit among them), shows what was solved.

Output: a table (import, first fit, second fit, seconds), ``results/bench_startup.json``
(the machine, every process's times) and ``results/bench_startup.png`` (first fit per
solver, cold and warm, log scale).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402

SOLVERS = ("asyncopt", "skglm", "celer", "sklearn", "glmnet")
RATIO = 0.01

# The child: import, fit twice, print the times and the first fit's (coef, intercept).
CHILD = r"""
import json, sys, time, warnings
import numpy as np
import scipy.sparse as sp
warnings.simplefilter("ignore")
solver, loss, lam, path = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
X = sp.load_npz(path)
y = np.load(path + ".y.npy")
began = time.perf_counter()
if solver == "asyncopt":
    from asyncopt import Lasso, SparseLogisticRegression
    make = (lambda: Lasso(alpha=lam)) if loss == "squared" else \
        (lambda: SparseLogisticRegression(alpha=lam))
elif solver == "skglm":
    from skglm import Lasso, SparseLogisticRegression
    make = (lambda: Lasso(alpha=lam)) if loss == "squared" else \
        (lambda: SparseLogisticRegression(alpha=lam))
elif solver == "celer":
    from celer import Lasso
    make = lambda: Lasso(alpha=lam)
elif solver == "sklearn":
    from sklearn.linear_model import Lasso, LogisticRegression
    make = (lambda: Lasso(alpha=lam)) if loss == "squared" else \
        (lambda: LogisticRegression(penalty="l1", solver="liblinear",
                                    C=1.0 / (X.shape[0] * lam), intercept_scaling=100.0))
else:
    import glmnet
    make = (lambda: glmnet.ElasticNet(alpha=1.0, lambda_path=[lam], standardize=False,
                                      n_splits=0)) if loss == "squared" else \
        (lambda: glmnet.LogitNet(alpha=1.0, lambda_path=[lam], standardize=False,
                                 n_splits=0))
imported = time.perf_counter()
est = make().fit(X, y)
first = time.perf_counter()
make().fit(X, y)
second = time.perf_counter()
if solver == "glmnet":
    coef, b = np.ravel(est.coef_path_[..., 0]), float(np.ravel(est.intercept_path_)[0])
else:
    coef, b = np.ravel(est.coef_), float(np.ravel(est.intercept_)[0]) \
        if np.size(est.intercept_) else 0.0
print(json.dumps({"import_s": imported - began, "first_fit_s": first - imported,
                  "second_fit_s": second - first, "coef": coef.tolist(), "intercept": b}))
"""


def child_run(solver, loss, lam, path, cache_dir):
    """One fresh process; its times (and the whole process's wall time), or an error."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, solver, loss, repr(lam), path],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-300:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = wall
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", default=["dexter", "rcv1s"])
    ap.add_argument("--loss", nargs="+", default=["squared", "logistic"])
    ap.add_argument("--solvers", nargs="+", default=list(SOLVERS))
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per cell")
    ap.add_argument("--output", default=os.path.join(RESULTS_DIR, "bench_startup.json"))
    args = ap.parse_args(argv)
    from benchmarks.bench_real import Row, load
    import scipy.sparse as sp

    rows, table = [], []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.data:
            X, y = load(name)
            path = os.path.join(folder, f"{name}.npz")
            sp.save_npz(path, sp.csr_matrix(X))
            np.save(path + ".y.npy", y)
            for loss in args.loss:
                row = Row(X, y, loss, RATIO)
                from asyncopt import Lasso, SparseLogisticRegression
                model = Lasso if loss == "squared" else SparseLogisticRegression
                ref = model(alpha=row.lam, tol=1e-10, max_epochs=100_000).fit(X, y)
                row.offer(np.ravel(ref.coef_), float(np.ravel(ref.intercept_)[0]))
                cells = {}
                for solver in args.solvers:
                    if solver == "celer" and loss != "squared":
                        continue      # celer's logistic model fits no intercept
                    for state in ("cold", "warm"):
                        if state == "warm":       # the cache as a previous run leaves it
                            child_run(solver, loss, row.lam, path, None)
                        runs = []
                        for _ in range(args.repeat):
                            if state == "cold":
                                with tempfile.TemporaryDirectory() as cache:
                                    runs.append(child_run(solver, loss, row.lam, path,
                                                          cache))
                            else:
                                runs.append(child_run(solver, loss, row.lam, path, None))
                        good = [r for r in runs if "error" not in r]
                        for r in good:
                            r["rel_subopt"] = (row.offer(np.array(r.pop("coef")),
                                                         r["intercept"]) - row.best) / \
                                row.p0
                        cell = {"runs": runs, "error": None if good else runs[0]["error"]}
                        for key in ("import_s", "first_fit_s", "second_fit_s",
                                    "process_s", "rel_subopt"):
                            cell[key] = statistics.median(r[key] for r in good) \
                                if good else None
                        cells[f"{solver} {state}"] = cell
                        table.append([name, "Lasso" if loss == "squared" else "L1 logistic",
                                      solver, state] +
                                     [_cell(cell[k]) for k in ("import_s", "first_fit_s",
                                                               "second_fit_s", "process_s")]
                                     + [f"{cell['rel_subopt']:.1e}"
                                        if cell["rel_subopt"] is not None else "-"])
                        print(format_table(HEADER, table[-1:]), flush=True)
                rows.append({"data": name, "loss": loss, "ratio": RATIO, "lam": row.lam,
                             "n": X.shape[0], "p": X.shape[1], "P_star": row.best,
                             "P0": row.p0, "cells": cells})
    print()
    print(format_table(HEADER, table))
    write_json(args.output, {"benchmark": "bench_startup",
                             "machine": machine_info(("skglm", "celer", "sklearn",
                                                      "glmnet")),
                             "ratio": RATIO, "repeat": args.repeat, "rows": rows})
    plot(rows, args.output.replace(".json", ".png"))
    print(f"wrote {args.output}")


HEADER = ["data", "model", "solver", "numba cache", "import s", "first fit s",
          "second fit s", "process s", "first fit's subopt"]


def _cell(value):
    return "-" if value is None else f"{value:.3f}"


def plot(rows, path):
    """First fit per solver and row (log scale), cold and warm cache side by side."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.6), squeeze=False)
    for ax, row in zip(axes[0], rows):
        solvers = sorted({key.split()[0] for key in row["cells"]},
                         key=lambda s: SOLVERS.index(s) if s in SOLVERS else 99)
        for k, state in enumerate(("cold", "warm")):
            values = [row["cells"].get(f"{s} {state}", {}).get("first_fit_s") or np.nan
                      for s in solvers]
            ax.bar(np.arange(len(solvers)) + 0.4 * k, values, 0.4, label=f"{state} cache")
        ax.set_xticks(np.arange(len(solvers)) + 0.2)
        ax.set_xticklabels(solvers, rotation=45, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{row['data']} {'Lasso' if row['loss'] == 'squared' else 'logit'}",
                     fontsize=9)
    axes[0][0].set_ylabel("first fit in a fresh process (s)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
