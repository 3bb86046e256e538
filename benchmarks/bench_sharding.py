"""Rows or columns for wide data under MPI: the bytes each sharding moves.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_sharding.py            # ~2 minutes

Dis-DDSS shards the rows: each worker holds some rows and all their columns, and the
working-set step's workers reduce their shares of the Gram (or Hessian) matrix of
[A_W, 1], |W| (|W| + 1) / 2 numbers each, at every step, beside A^T rho's share (one
number per active feature) at every certificate. Sharding the columns instead (each
worker some columns and all the rows) would move, per certificate, the margins' shares
(n numbers from each worker), rho back to each worker (n) and each worker's part of
A^T rho (p numbers in all), per step the move on W, and each column of a working set to
the server once (an index and a value per stored entry), where the server would form
the Gram matrix itself.

For each of the real data sets, the Lasso and L1 logistic regression at 0.01 and 0.001
lam_max, ``method="working_set"``, tol 1e-6:
  - rows: the bytes the server sent and received in a run of ``mpirun -n 3`` (1 server,
    2 workers), from the run's history (``bytes_sent``, ``bytes_recv``), measured;
  - columns: the bytes above for K = 2 workers along the serial run of the same problem
    (its outer iterations, its working sets, the stored entries of every column any of
    them held), modelled: nothing here implements column sharding.

Output: a table, ``results/bench_sharding.json``.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402

WORKERS = 2
REAL = os.path.join(os.path.dirname(ROOT), "shared", "data", "real")


def row_sharded_bytes(name, loss, ratio):
    """(bytes the server sent, received, outer iterations) of the mpirun run."""
    from benchmarks._mpi_run import find_mpirun, rank_environment
    prog = os.path.join(os.path.dirname(sys.executable),
                        "asyncopt-lasso" if loss == "squared" else "asyncopt-logreg")
    with tempfile.TemporaryDirectory() as folder:
        history = os.path.join(folder, "run.jsonl")
        subprocess.run([find_mpirun(), "-n", str(WORKERS + 1), prog, "--data",
                        os.path.join(REAL, f"{name}.svm.xz"), "--alpha-ratio", str(ratio),
                        "--tol", "1e-6", "--method", "working_set", "--quiet",
                        "--history", history], check=True, env=rank_environment(),
                       capture_output=True, timeout=600)
        records = [json.loads(line) for line in open(history)]
    last = records[-1]      # the server's counts since the start of the run
    return last["bytes_sent"], last["bytes_recv"], len(records)


def column_sharded_bytes(X, y, loss, lam):
    """The modelled bytes of column sharding along the serial run, and its facts."""
    import asyncopt.solvers.local as local
    import asyncopt.solvers.working_set as steps
    from asyncopt import Lasso, SparseLogisticRegression
    sets, current = [], {}
    step, choose = local.step, steps.working_set

    def watched_step(store, active, *args, **kwargs):
        current["active"] = active
        return step(store, active, *args, **kwargs)

    def watched_choice(x_norms, scores, size=None):
        chosen = choose(x_norms, scores, size)
        if size is None:          # the step's set (not the column store's look-ahead)
            sets.append(current["active"].features[chosen])
        return chosen

    local.step, steps.working_set = watched_step, watched_choice
    try:
        model = Lasso if loss == "squared" else SparseLogisticRegression
        est = model(alpha=lam, tol=1e-6, method="working_set", random_state=0).fit(X, y)
    finally:
        local.step, steps.working_set = step, choose
    n, p = X.shape
    counts = np.diff(X.tocsc().indptr)
    held = np.unique(np.concatenate(sets)) if sets else np.zeros(0, dtype=int)
    certificates = len(est.history_)
    per_certificate = 8 * (2 * WORKERS * n + p)
    moves = sum(8 * WORKERS * s.shape[0] for s in sets)
    columns_once = 12 * int(counts[held].sum())
    return {"iterations_serial": certificates, "largest_set": max(map(len, sets)),
            "columns_held": int(held.shape[0]), "per_certificate": per_certificate,
            "columns_once": columns_once,
            "total": certificates * per_certificate + moves + columns_once}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", default=["dexter", "leukemia", "rcv1s", "reuters"])
    ap.add_argument("--output", default=os.path.join(RESULTS_DIR, "bench_sharding.json"))
    args = ap.parse_args(argv)
    from benchmarks.bench_real import Row, load
    rows, table = [], []
    for name in args.data:
        X, y = load(name)
        for loss in ("squared", "logistic"):
            for ratio in (0.01, 0.001):
                row = Row(X, y, loss, ratio)
                sent, received, iterations = row_sharded_bytes(name, loss, ratio)
                columns = column_sharded_bytes(X, y, loss, row.lam)
                rows.append({"data": name, "loss": loss, "ratio": ratio, "n": X.shape[0],
                             "p": X.shape[1], "rows_sent": sent, "rows_received": received,
                             "rows_iterations": iterations, "columns": columns})
                total = sent + received
                table.append([name, "Lasso" if loss == "squared" else "L1 logistic",
                              f"{ratio:g}", f"{X.shape[0]:,} x {X.shape[1]:,}",
                              str(columns["largest_set"]), f"{total / 1e6:.1f}",
                              f"{columns['total'] / 1e6:.1f}",
                              f"{total / columns['total']:.1f}"])
                print(format_table(HEADER, table[-1:]), flush=True)
    print()
    print(format_table(HEADER, table))
    write_json(args.output, {"benchmark": "bench_sharding", "machine": machine_info(),
                             "workers": WORKERS, "rows": rows})
    print(f"wrote {args.output}")


HEADER = ["data", "model", "lam/lam_max", "n x p", "largest W", "rows MB (measured)",
          "columns MB (modelled)", "rows / columns"]


if __name__ == "__main__":
    main()
