"""SPMD script run by tests/test_mpi.py under mpirun: the estimators with backend="mpi",
as a user's script would call them (every rank the same data and the same calls).
Rank 0 writes argv[1] (JSON): each fit's coef_, intercept_, n_iter_, relative gap and
its scale P(0), and whether every rank ended with the same coef_ and intercept_;
argv[2] is the checkpoint path of the last two fits."""
import json
import os
import sys

import numpy as np
import scipy.sparse as sp

GROUP_SIZE = 4


def make_data():
    """(X, y, labels): 600 x 60 sparse rows, y from 6 features plus noise and an offset,
    labels "spam" / "ham" split at y's median (the test makes the same to check)."""
    rng = np.random.default_rng(3)
    n, p = 600, 60
    X = sp.random(n, p, density=0.15, random_state=3, format="csr")
    w = np.r_[rng.standard_normal(6), np.zeros(p - 6)]
    y = X @ w + 0.05 * rng.standard_normal(n) + 0.7
    return X, y, np.where(y > np.median(y), "spam", "ham")


def same_everywhere(comm, est):
    """Whether every rank holds rank 0's coef_ and intercept_, bit for bit."""
    from mpi4py import MPI
    mine = np.append(np.ravel(est.coef_), np.ravel(est.intercept_))
    first = comm.bcast(mine, root=0)
    return bool(comm.allreduce(int(np.array_equal(mine, first)), op=MPI.MIN))


def record(comm, est):
    history = est.history_
    return {"coef": np.ravel(est.coef_).tolist(),
            "intercept": float(np.ravel(est.intercept_)[0]), "alpha": est.alpha,
            "n_iter": int(est.n_iter_), "same": same_everywhere(comm, est),
            "rel_gap": history[-1]["rel_gap"] if history else None,
            "reference": history[-1]["gap"] / history[-1]["rel_gap"]
            if history and history[-1]["rel_gap"] > 0 else None,
            "first_rel_gap": history[0]["rel_gap"] if history else None}


def main(out, checkpoint):
    from mpi4py import MPI

    from asyncopt import GroupLasso, Lasso, SparseLogisticRegression, lam_max
    from asyncopt.penalties import GroupL1
    comm = MPI.COMM_WORLD
    X, y, labels = make_data()
    p = X.shape[1]
    results = {}
    alpha = 0.05 * lam_max(X, y)
    lasso = Lasso(alpha, tol=1e-9, backend="mpi", random_state=0).fit(X, y)
    results["lasso"] = record(comm, lasso)
    alpha_g = 0.05 * lam_max(X, y, penalty=GroupL1(p, GROUP_SIZE))
    group = GroupLasso(alpha_g, groups=GROUP_SIZE, tol=1e-9, backend="mpi", random_state=0)
    results["group"] = record(comm, group.fit(X, y))
    alpha_l = 0.05 * lam_max(X, labels, loss="logistic")
    clf = SparseLogisticRegression(alpha_l, tol=1e-9, backend="mpi", random_state=0)
    clf.fit(X, labels)
    results["logistic"] = record(comm, clf)
    results["classes"] = clf.classes_.tolist()
    results["accuracy"] = float(np.mean(clf.predict(X) == labels))
    # a path: each fit warm-started from the previous one
    path = Lasso(alpha, tol=1e-9, backend="mpi", random_state=0, warm_start=True).fit(X, y)
    cold = Lasso(alpha / 2, tol=1e-9, backend="mpi", random_state=0).fit(X, y)
    path.set_params(alpha=alpha / 2).fit(X, y)
    results["warm"], results["cold"] = record(comm, path), record(comm, cold)
    # the server writes the checkpoint; a second fit finds the run done and takes no epoch
    first = Lasso(alpha, tol=1e-9, backend="mpi", random_state=0, checkpoint=checkpoint)
    first.fit(X, y)
    results["checkpointed"] = record(comm, first)
    results["checkpoint_exists"] = os.path.exists(checkpoint)
    again = Lasso(alpha, tol=1e-9, backend="mpi", random_state=0, checkpoint=checkpoint)
    again.fit(X, y)
    results["resumed"] = record(comm, again)
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
