"""SPMD check run by tests/test_startup.py under mpirun: rank 0 loads the server's kernels
(``load_server_kernels``, as the command line's server does while the workers parse),
then every rank runs solve_mpi on small random shards, and rank 0 writes to argv[1], per
kernel, the overloads it had after the warm-up and those the solve added.

    server_kernels.py OUT LOSS"""
import json
import sys

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

from asyncopt.comm import messages
from asyncopt.losses import generalized_residual, get_loss
from asyncopt.penalties import L1, weighted_l1_value
from asyncopt.problem import Problem
from asyncopt.solvers.methods import solver_flags
from asyncopt.solvers.mpi import load_server_kernels, solve_mpi
from asyncopt.cli.common import freeze_at_exit

KERNELS = {"generalized_residual": generalized_residual,
           "weighted_l1_value": weighted_l1_value,
           "add_weighted_delta": messages.add_weighted_delta,
           "changed_in_log": messages.changed_in_log}


def overloads():
    return {name: sorted(str(s) for s in kernel.signatures)
            for name, kernel in KERNELS.items()}


def main(out, loss, n=400, p=150):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    code = get_loss(loss).code
    warmed = None
    if rank == 0:
        load_server_kernels(L1(1), code)
        warmed = overloads()
    rng = np.random.default_rng(0)
    X = sp.random(n, p, density=0.08, random_state=0, format="csr")
    y = X @ np.r_[rng.standard_normal(8), np.zeros(p - 8)] + 0.05 * rng.standard_normal(n)
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    lam = 0.05 * Problem(X, y, loss, L1(p), 1.0, True).lam_max()
    shard = None
    if rank > 0:
        part = np.array_split(np.arange(n), size - 1)[rank - 1]
        shard = Problem(X[part], y[part], loss, L1(p), lam, True)
    result = solve_mpi(comm, shard, L1(p), p, code, lam, True, tol=1e-8,
                       **solver_flags("ddss"))
    if rank == 0:
        after = overloads()
        with open(out, "w") as f:
            json.dump({"warmed": warmed, "converged": bool(result.converged),
                       "added": {name: sorted(set(after[name]) - set(warmed[name]))
                                 for name in KERNELS}}, f)


if __name__ == "__main__":
    freeze_at_exit()     # as the command lines: their exit, not numba's last collection
    main(sys.argv[1], sys.argv[2])
