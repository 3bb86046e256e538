"""SPMD check run by tests/test_mpi.py under mpirun: the root-centred collectives a Wire
uses on an oversubscribed node, and those it sends through the inner loop's shared-memory
window on one node (``channels.SharedCollectives``, a window of capacity 600: the
1000-long vectors go through it in pieces where the node is oversubscribed, else as
MPI's collectives), give what MPI's own collectives give, and count the same bytes.
Every rank contributes rank-dependent vectors; rank 0 writes JSON to argv[1]."""
import json
import sys

import numpy as np
from mpi4py import MPI

from asyncopt.comm.channels import open_channel
from asyncopt.comm.wire import Wire
from asyncopt.cli.common import freeze_at_exit


def exchange(wire):
    rank, size = wire.rank, wire.size
    rng = np.random.default_rng(rank)
    vector = rng.standard_normal(1000)
    root_vector = np.arange(7.0) * 3.5 if rank == 0 else np.zeros(7)
    reduced = wire.reduce(vector)
    # back to back, no broadcast between: a worker's next vector waits for its slot
    first, second = wire.reduce(vector[:600]), wire.reduce(2.0 * vector[:500])
    # the root's blank buffer is neither read nor summed: NaNs there would show
    own = np.full(1000, np.nan) if rank == 0 else vector.copy()
    into_own = wire.reduce(own, root_blank=True)
    long_root = np.arange(1500.0) / 7.0 if rank == 0 else np.zeros(1500)
    out = {
        "bcast": wire.bcast(root_vector).tolist(),
        "bcast_long": bool(np.array_equal(wire.bcast(long_root), np.arange(1500.0) / 7.0)),
        "reduce": None if reduced is None else reduced.tolist(),
        "reduce_twice": None if first is None else [first.tolist(), second.tolist()],
        "reduce_blank_root": None if into_own is None else
        [into_own.tolist(), bool(np.shares_memory(into_own, own))],
        "allreduce_sum": wire.allreduce(vector).tolist(),
        "allreduce_sum_short": wire.allreduce(vector[:600].copy()).tolist(),
        "allreduce_max": wire.allreduce(np.array([float(rank), -float(rank)]),
                                        MPI.MAX).tolist(),
        "expected_sum": np.sum([np.random.default_rng(r).standard_normal(1000)
                                for r in range(size)], axis=0).tolist(),
        "expected_workers_sum": np.sum([np.random.default_rng(r).standard_normal(1000)
                                        for r in range(1, size)], axis=0).tolist(),
        "sent": wire.sent, "received": wire.received,
    }
    return out


def through_window(comm):
    """A Wire attached to a shared channel's collectives (as solve_mpi attaches it)."""
    wire = Wire(comm)
    channel = open_channel(comm, wire, 596, 4, 4, "shared")
    wire.attach(channel.collectives)
    out = exchange(wire)
    out["fits"] = [channel.collectives.fits(np.zeros(n)) for n in (600, 601)]
    out["oversubscribed"] = wire.oversubscribed
    wire.detach()
    channel.close()
    return out


def main(out):
    comm = MPI.COMM_WORLD
    results = {mode: exchange(Wire(comm, oversubscribed=mode == "root_centred"))
               for mode in ("tree", "root_centred")}
    results["window"] = through_window(comm)
    every = comm.gather(results, root=0)
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"size": comm.Get_size(), "ranks": every}, f)


if __name__ == "__main__":
    freeze_at_exit()     # as the command lines: their exit, not numba's last collection
    main(sys.argv[1])
