"""Communication between MPI ranks: what every distributed protocol of asyncopt runs on.

- ``wire``: ``Wire``, the collectives over numpy buffers (broadcast, reduce, allreduce)
  with byte counts, waits that never busy-poll, and the placement facts (ranks per node,
  crowded or oversubscribed cores) the protocols choose their paths by; plain mpi4py is
  the reference path.
- ``channels``: the point-to-point transport of Dis-DDSS's inner loop (deltas to the
  server, replies back) and the shared-window collectives, an accelerator of the same
  messages when every rank is on one node; MPI messages otherwise.
- ``messages``: the numba kernels that encode, decode and apply a delta or a reply in
  one pass each.
"""


def mpi_module():
    """mpi4py's ``MPI`` module (importing it initializes MPI); ImportError naming the
    ``[mpi]`` extra where mpi4py is not installed."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError("backend='mpi' needs mpi4py and an MPI library: "
                          "pip install 'asyncopt[mpi]'") from None
    return MPI
