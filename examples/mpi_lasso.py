"""Dis-DDSS from Python: run with

    .venv/bin/mpirun -n 5 .venv/bin/python examples/mpi_lasso.py

Every rank runs this same script (SPMD) and calls fit with the same data; with
backend="mpi" rank 0 becomes the parameter server and ranks 1..4 workers that keep only
their contiguous shard of the rows. All ranks end with the same coef_; rank 0 prints.
"""
import numpy as np
from mpi4py import MPI

from asyncopt import Lasso, lam_max
from asyncopt.data import make_ctr

X, y, _ = make_ctr(20_000, 5_000, nnz_per_row=20, random_state=0)
alpha = 0.01 * lam_max(X, y)
est = Lasso(alpha=alpha, tol=1e-6, backend="mpi", random_state=0,
            verbose=1 if MPI.COMM_WORLD.Get_rank() == 0 else 0).fit(X, y)
if MPI.COMM_WORLD.Get_rank() == 0:
    print(f"{MPI.COMM_WORLD.Get_size() - 1} workers: {est.n_iter_} outer iterations, "
          f"{np.count_nonzero(est.coef_)} non-zero coefficients, relative gap "
          f"{est.history_[-1]['rel_gap']:.1e}, {est.history_[-1]['bytes_recv']:,} bytes "
          "received by the server")
