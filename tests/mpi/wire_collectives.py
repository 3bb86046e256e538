"""SPMD check run by tests/test_mpi.py under mpirun: the root-centred collectives a Wire
uses on an oversubscribed node give what MPI's own collectives give, and count the same
bytes. Every rank contributes rank-dependent vectors; rank 0 writes JSON to argv[1]."""
import json
import sys

import numpy as np
from mpi4py import MPI

from asyncopt.solvers.wire import Wire


def exchange(wire):
    rank, size = wire.rank, wire.size
    rng = np.random.default_rng(rank)
    vector = rng.standard_normal(1000)
    root_vector = np.arange(7.0) * 3.5 if rank == 0 else np.zeros(7)
    reduced = wire.reduce(vector)
    out = {
        "bcast": wire.bcast(root_vector).tolist(),
        "reduce": None if reduced is None else reduced.tolist(),
        "allreduce_sum": wire.allreduce(vector).tolist(),
        "allreduce_max": wire.allreduce(np.array([float(rank), -float(rank)]),
                                        MPI.MAX).tolist(),
        "expected_sum": np.sum([np.random.default_rng(r).standard_normal(1000)
                                for r in range(size)], axis=0).tolist(),
        "sent": wire.sent, "received": wire.received,
    }
    return out


def main(out):
    comm = MPI.COMM_WORLD
    results = {mode: exchange(Wire(comm, oversubscribed=mode == "root_centred"))
               for mode in ("tree", "root_centred")}
    every = comm.gather(results, root=0)
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"size": comm.Get_size(), "ranks": every}, f)


if __name__ == "__main__":
    main(sys.argv[1])
