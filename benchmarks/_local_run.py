"""bench_paired_local.py's solving process: reads one JSON request a line on stdin
({data, loss, lam_ratio, fit_intercept, threads, seed, tol}), answers one JSON line
{solve_s, epochs, records, converged, rel_gap}. Imports only the asyncopt found first on
PYTHONPATH (the tree under test), and names only what every tree of the project has."""
import json
import sys
import time

import numpy as np
import scipy.sparse as sp

CTR = {"ctr": (200_000, 100_000), "ctr_small": (20_000, 10_000)}


def load(key):
    """(X, y) of bench_serial's data keys (CSR float64, sorted indices)."""
    from asyncopt.data import load_a9a
    from asyncopt.data.synthetic import make_ctr
    if key in CTR:
        X, y, _ = make_ctr(*CTR[key], nnz_per_row=30, random_state=0)
    else:
        X, y = load_a9a(degree={"a9a_d2": 2, "a9a_d3": 3}[key])
    X = sp.csr_matrix(X, dtype=np.float64)
    X.sort_indices()
    return X, np.ascontiguousarray(y, dtype=np.float64)


def main():
    from asyncopt.problem import Problem
    from asyncopt.solvers import solve_ddss
    from asyncopt.solvers.threads import ThreadsInnerLoop
    data, problems, warm = {}, {}, set()
    for line in sys.stdin:
        req = json.loads(line)
        if req["data"] not in data:
            data[req["data"]] = load(req["data"])
        key = (req["data"], req["loss"], req["lam_ratio"], req["fit_intercept"])
        if key not in problems:
            X, y = data[req["data"]]
            if req["loss"] == "logistic":
                y = np.where(y > np.median(y), 1.0, -1.0) if set(np.unique(y)) - {-1, 1} \
                    else y
            problem = Problem(X, y, req["loss"], lam=1.0, fit_intercept=req["fit_intercept"])
            problems[key] = problem.with_lam(req["lam_ratio"] * problem.lam_max())
        threads = int(req["threads"])
        loop = None if threads <= 1 else ThreadsInnerLoop(threads)
        if (key, threads) not in warm:       # every kernel of this solve compiled once
            solve_ddss(problems[key], tol=req["tol"], max_epochs=100000, random_state=0,
                       inner_loop=loop)
            warm.add((key, threads))
        start = time.perf_counter()
        result = solve_ddss(problems[key], tol=req["tol"], max_epochs=100000,
                            random_state=req["seed"], inner_loop=loop)
        seconds = time.perf_counter() - start
        print(json.dumps({"solve_s": seconds, "epochs": result.n_iter,
                          "records": len(result.history),
                          "converged": bool(result.converged),
                          "rel_gap": result.history[-1]["rel_gap"]}), flush=True)


if __name__ == "__main__":
    main()
