"""SPMD script run by tests/test_sample_weight.py under mpirun: the weighted Lasso and L1
logistic model with backend="mpi" (every rank the same data, weights and calls, as a
user's script), on the methods ddss, working_set and auto; rank 0 writes argv[1] (JSON):
per fit, the objective of the mpi fit and of the serial one with the same weights
(scikit-learn's weighted objective, from NumPy), and whether every rank ended with the
same coef_ and intercept_."""
import json
import sys

import numpy as np
import scipy.sparse as sp


def make_data():
    """(X, y, labels, s): 300 x 40 sparse rows, a sparse ground truth with an offset, the
    labels split at y's median, weights in [0, 3) with a fifth of them zero."""
    rng = np.random.default_rng(4)
    n, p = 300, 40
    X = sp.random(n, p, density=0.2, random_state=4, format="csr")
    y = X @ np.r_[rng.standard_normal(6), np.zeros(p - 6)] + 0.05 * rng.standard_normal(n)
    y = y + 0.7
    s = rng.uniform(0.0, 3.0, n) * (rng.random(n) < 0.8)
    return X, y, np.where(y > np.median(y), 1, 0), s


def objective(X, y, s, alpha, est, logistic):
    coef, b = np.ravel(est.coef_), float(np.ravel(est.intercept_)[0])
    z = X @ coef + b
    if logistic:
        loss = s @ np.logaddexp(0.0, -np.where(y > 0, 1.0, -1.0) * z)
    else:
        loss = 0.5 * s @ ((y - z) ** 2)
    return float(loss) / float(np.sum(s)) + alpha * float(np.abs(coef).sum())


def main(out):
    from mpi4py import MPI

    from asyncopt import Lasso, SparseLogisticRegression, lam_max
    comm = MPI.COMM_WORLD
    X, y, labels, s = make_data()
    results = []
    for name, estimator, target, loss in (("lasso", Lasso, y, "squared"),
                                          ("logistic", SparseLogisticRegression, labels,
                                           "logistic")):
        alpha = 0.05 * lam_max(X, target, loss=loss, sample_weight=s)
        for method in ("ddss", "working_set", "auto"):
            fitted = estimator(alpha, tol=1e-10, max_epochs=3000, method=method,
                               backend="mpi", random_state=0).fit(X, target,
                                                                  sample_weight=s)
            mine = np.append(np.ravel(fitted.coef_), np.ravel(fitted.intercept_))
            same = bool(comm.allreduce(int(np.array_equal(mine, comm.bcast(mine))),
                                       op=MPI.MIN))
            if comm.Get_rank() == 0:
                serial = estimator(alpha, tol=1e-13, max_epochs=20000).fit(
                    X, target, sample_weight=s)
                results.append({
                    "name": f"{name} {method}", "same": same,
                    "objective": objective(X, target, s, alpha, fitted, loss == "logistic"),
                    "serial": objective(X, target, s, alpha, serial, loss == "logistic")})
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
