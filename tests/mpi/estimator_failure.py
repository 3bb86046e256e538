"""SPMD script run by tests/test_mpi.py under mpirun: Lasso(backend="mpi").fit as a
user's script calls it, where something goes wrong.

    estimator_failure.py fail    worker rank 2 raises in its first inner loop (injected)
    estimator_failure.py rows    2 rows for more workers than that

Every rank that sees a ValueError prints it on one line and exits with status 3."""
import sys

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

from asyncopt import Lasso
from cli_failure import inject      # the same failure the command line's test injects


def main(mode):
    comm = MPI.COMM_WORLD
    X = sp.random(300 if mode == "fail" else 2, 20, density=0.3, random_state=0,
                  format="csr")
    y = np.asarray(X.sum(axis=1)).ravel()
    if mode == "fail":
        inject("bug", comm.Get_rank())
    try:
        Lasso(alpha=0.01, backend="mpi").fit(X, y)
    except ValueError as exc:
        print(f"rank {comm.Get_rank()}: ValueError: {exc}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
