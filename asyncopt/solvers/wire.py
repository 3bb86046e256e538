"""The MPI wire every distributed protocol of asyncopt runs on: Dis-DDSS's parameter
server (``solvers/mpi.py``) and the torch bridge's federated rounds, Multi-LoRA server and
SGR pipeline (``asyncopt.deep``).

Messages are numpy buffers (``Ibcast`` / ``Isend`` / ``Irecv``, never pickles), and every
wait sleeps instead of spinning (:func:`poll`), so runs with more ranks than cores (``mpirun
-n 9`` on 2 cores) stay usable. :class:`Wire` counts the bytes this rank put on and took off
the wire, headers included.
"""
import time

import numpy as np

SPIN_SECONDS, MAX_PAUSE = 1e-3, 2e-4


def _mpi():
    from mpi4py import MPI
    return MPI


def poll(ready):
    """Wait until ``ready()`` is true without holding a core for long: call it in a loop
    for at most SPIN_SECONDS (a reply usually comes within that), then sleep between
    calls, 50 us doubling to MAX_PAUSE. MPICH moves a message over shared memory only
    when both ranks call into MPI, so a sleeping rank delays its peer too: sleeps growing
    to 1 ms and a 0.2 ms spin cost 2-3 ms per round trip and 1 worker took 5.6 s where
    these take 0.3-0.6 s (CTR 20,000 x 10,000)."""
    deadline = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < deadline:
        if ready():
            return
    pause = 5e-5
    while not ready():
        time.sleep(pause)
        pause = min(2 * pause, MAX_PAUSE)


def wait(request):
    """Complete a nonblocking request (see poll)."""
    poll(request.Test)


def wait_all(requests):
    """Complete a list of nonblocking requests (see poll)."""
    if requests:
        poll(lambda: _mpi().Request.Testall(requests))


class Wire:
    """The collectives and point-to-point calls of a protocol on ``comm``, rank 0 the
    root, counting bytes: ``sent`` / ``received`` are the payload bytes this rank put on /
    took off the wire (a broadcast counts once per receiving rank on the root, a
    reduction once per contributing rank)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.sent = 0
        self.received = 0

    def bcast(self, buf):
        """Broadcast ``buf`` from rank 0 in place; returns it."""
        wait(self.comm.Ibcast(buf, root=0))
        if self.rank == 0:
            self.sent += buf.nbytes * (self.size - 1)
        else:
            self.received += buf.nbytes
        return buf

    def allreduce(self, send, op=None):
        recv = np.empty_like(send)
        wait(self.comm.Iallreduce(send, recv, op=op or _mpi().SUM))
        return recv

    def reduce(self, send):
        """Sum to the server (None elsewhere)."""
        recv = np.empty_like(send) if self.rank == 0 else None
        wait(self.comm.Ireduce(send, recv, op=_mpi().SUM, root=0))
        if self.rank == 0:
            self.received += send.nbytes * (self.size - 1)
        else:
            self.sent += send.nbytes
        return recv

    def isend(self, buf, dest, tag):
        """Start sending ``buf`` (keep it alive until the request completes)."""
        self.sent += buf.nbytes
        return self.comm.Isend(buf, dest=dest, tag=tag)

    def send(self, buf, dest, tag):
        """Send ``buf`` and wait until it has left."""
        wait(self.isend(buf, dest, tag))

    def recv(self, buf, source, tag):
        """Receive into ``buf`` (exactly its size); returns it."""
        wait(self.comm.Irecv(buf, source=source, tag=tag))
        self.received += buf.nbytes
        return buf
