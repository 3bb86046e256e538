"""The MPI wire every distributed protocol of asyncopt runs on: Dis-DDSS's parameter
server (``solvers/mpi/``) and the torch bridge's federated rounds, Multi-LoRA server and
SGR pipeline (``asyncopt.deep``).

Messages are numpy buffers (``Ibcast`` / ``Isend`` / ``Irecv``, never pickles), and no wait
holds a core (:func:`poll`: a short spin that yields the core at every check, then sleeps),
so runs with more ranks than cores stay usable.
:class:`Wire` counts the bytes this rank put on and took off the wire, headers included.
"""
import contextlib
import ctypes
import functools
import os
import platform
import sys
import time
import traceback

import numpy as np

from ..runtime import available_cores, fine_timer_slack

SPIN_SECONDS, MAX_PAUSE = 1e-3, 2e-4
# how a reduction too long for the shared window goes where it does not go root-centred
# (``Wire.reduce``): "auto" (one worker's as a message, more workers' through MPI's
# reduction), "mpi" or "messages"; the environment's ASYNCOPT_MPI_REDUCE
REDUCE_ROUTES = ("auto", "mpi", "messages")
CROWDED_RANKS_PER_CORE = 2   # Wire.crowded: at least this many ranks per core on a node
LEVELS = 3                   # a node's levels (node_level): a core per rank, over, crowded
TAG_BCAST, TAG_REDUCE = 1001, 1002
# Linux futex(2) on x86-64 (its stores and loads keep program order, which the doorbell's
# protocol relies on; elsewhere waits sleep in steps): FUTEX_WAIT / FUTEX_WAKE, not
# process-private (the word lies in memory that several processes map)
SYS_FUTEX = {"x86_64": 202}.get(platform.machine()) if sys.platform.startswith("linux") \
    else None
FUTEX_WAIT, FUTEX_WAKE = 0, 1
DOORBELL_TIMEOUT = 2e-3    # a doorbell wait re-checks after this long even if not rung
ABORT_GRACE_SECONDS = 0.5  # abort_all_ranks: the pause that lets the message out first


def _mpi():
    from mpi4py import MPI
    return MPI


@functools.lru_cache(maxsize=None)
def _libc():
    """This process's C library through ctypes (futex), loaded once."""
    return ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Doorbell:
    """One rank's doorbell: a 32-bit word in memory shared by the ranks of a node (a
    futex), which whoever posts something that rank waits for rings (``ring``) and on
    which that rank sleeps until it is rung (``wait``), instead of waking up every
    MAX_PAUSE to look (``poll``). Dis-DDSS's shared window has one per rank and uses
    them on a crowded node (``Wire.crowded``).

    The protocol: the waiter reads the word (``value``), then checks its condition, then
    sleeps unless the word still holds what it read (the kernel compares, so a ring
    between the check and the sleep is not lost); a poster raises its sequence number,
    then adds 1 to the word, then wakes the waiter. Two posters may add at once and
    leave one addition; the wait then ends at ``timeout`` (DOORBELL_TIMEOUT) at worst.
    ``available`` says whether this platform has them (Linux on x86-64)."""

    available = SYS_FUTEX is not None

    def __init__(self, word, timeout=DOORBELL_TIMEOUT):
        self.word = word            # a length-1 int32 view into shared memory
        self.address = word.ctypes.data
        self.timeout = _Timespec(int(timeout), int(timeout % 1 * 1e9))
        self._syscall = _libc().syscall

    def value(self):
        return int(self.word[0])

    def ring(self):
        """Add 1 to the word (wrapping at 2^31) and wake whoever sleeps on it."""
        self.word[0] = (int(self.word[0]) + 1) & 0x7FFFFFFF
        self._syscall(SYS_FUTEX, ctypes.c_void_p(self.address), FUTEX_WAKE, 1 << 30,
                      None, None, 0)

    def wait(self, seen):
        """Sleep until the word differs from ``seen``, it is rung, or DOORBELL_TIMEOUT."""
        self._syscall(SYS_FUTEX, ctypes.c_void_p(self.address), FUTEX_WAIT,
                      ctypes.c_int(seen), ctypes.byref(self.timeout), None, 0)


def abort_all_ranks(comm, who, message=None):
    """Called in an ``except`` block on the rank that failed: print one message (``who``,
    the rank, its traceback; or, given ``message``, the error on one line, for a user's
    trouble such as a file the rank cannot write) and end every rank (``MPI_Abort``),
    since the others would wait for it forever. The one failure path of the MPI
    protocols (the command lines' and the estimators' Dis-DDSS, the torch bridge's).
    Never returns.

    The pause before ``MPI_Abort`` (ABORT_GRACE_SECONDS) lets the process manager forward
    the message: Hydra kills every rank on the abort request, and on a loaded machine
    that request could overtake the rank's stderr, leaving the user no message at all.
    MPICH's ``MPI_Abort`` can return before the process manager's kill arrives; the rank
    then ends itself (``os._exit``), never returning to its caller."""
    where = f"rank {comm.Get_rank()} of {comm.Get_size()}"
    print(f"{who}: error: {message} ({where}; aborting all ranks)" if message is not None
          else f"{who}: {where} failed, aborting all ranks\n" + traceback.format_exc(),
          file=sys.stderr, flush=True)
    _abort(comm, 1)


def _abort(comm, code):
    """End every rank of ``comm`` with exit status ``code`` once this rank's output has had
    ABORT_GRACE_SECONDS to reach the process manager (``abort_all_ranks``); never
    returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_SECONDS)
    comm.Abort(code)
    os._exit(code)


@contextlib.contextmanager
def ending_every_rank_on_error(comm, who, describe=None):
    """Run an MPI solve's block so that an error on some ranks only does not leave the
    others waiting for them forever: a ValueError passes (a user's mistake, which the
    solvers raise on every rank alike), any other Exception ends every rank through
    ``abort_all_ranks``, on one line where ``describe(exc)`` gives one (else with its
    traceback), and a SystemExit (a signal handler's, which has said why) ends every rank
    with its status, since the others would wait for this one in MPI_Finalize. The
    command lines' and the estimators' Dis-DDSS run in it."""
    try:
        yield
    except ValueError:
        raise
    except SystemExit as stop:
        if comm.Get_size() == 1:
            raise
        _abort(comm, stop.code if isinstance(stop.code, int) and stop.code else 1)
    except Exception as exc:
        abort_all_ranks(comm, who, None if describe is None else describe(exc))


def poll(ready, spin=SPIN_SECONDS, doorbell=None):
    """Wait until ``ready()`` is true without holding a core: call it in a loop for at
    most ``spin`` seconds (a reply usually comes within SPIN_SECONDS), giving the core
    away after every call (``sched_yield``: any rank that has work on this core runs
    first), then sleep between calls, 50 us doubling to MAX_PAUSE; or, given the waiting
    rank's ``doorbell`` (a ``Doorbell`` that whoever makes ``ready()`` true rings), sleep
    on it until it is rung. Returns once ``ready()`` has returned true.

    A rank that waits thus takes no time from ranks that compute on its core, and still
    sees a message within microseconds when no one else wants the core. The sleeps stay
    short (MAX_PAUSE) because MPICH moves a message over shared memory only when both
    ranks call into MPI, so a sleeping rank delays its peer too."""
    deadline = time.perf_counter() + spin
    while time.perf_counter() < deadline:
        if ready():
            return
        os.sched_yield()
    if doorbell is not None:
        while True:
            seen = doorbell.value()
            if ready():
                return
            doorbell.wait(seen)
    pause = 5e-5
    while not ready():
        time.sleep(pause)
        pause = min(2 * pause, MAX_PAUSE)


def wait(request, spin=SPIN_SECONDS):
    """Complete a nonblocking request (see poll)."""
    poll(request.Test, spin)


def wait_all(requests, spin=SPIN_SECONDS):
    """Complete a list of nonblocking requests (see poll)."""
    if requests:
        poll(lambda: _mpi().Request.Testall(requests), spin)


def launcher_local_ranks():
    """How many ranks of this job share this node by the launcher's count (MPICH's hydra
    sets MPI_LOCALNRANKS, Open MPI OMPI_COMM_WORLD_LOCAL_SIZE), or None where it sets
    neither (srun with PMI, another MPI)."""
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def local_ranks(comm):
    """How many ranks of this job share this node: the launcher's count
    (``launcher_local_ranks``), else every rank of ``comm`` (one node). Not collective;
    a ``Wire`` counts its node's ranks itself where the launcher gives no count
    (``Wire.local_ranks``)."""
    count = launcher_local_ranks()
    return comm.Get_size() if count is None else count


def reduce_route_from_env(route=None):
    """``route`` or, when None, the environment's ASYNCOPT_MPI_REDUCE (default "auto"):
    one of REDUCE_ROUTES; ValueError for anything else."""
    value = os.environ.get("ASYNCOPT_MPI_REDUCE", "auto") if route is None else route
    value = str(value).strip().lower()
    if value not in REDUCE_ROUTES:
        raise ValueError(f"unknown MPI reduction route {value!r} (ASYNCOPT_MPI_REDUCE): "
                         f"expected one of {', '.join(REDUCE_ROUTES)}")
    return value


def agreement_word(level, route, look=False):
    """What a Wire's ranks agree on in one MAX: whether some rank must ``look`` at its
    node (``node_load``: bound to fewer CPUs than its machine has, or given no count of
    its node's ranks), above the node's level (0: a core per rank, 1: oversubscribed, 2:
    crowded), above the index of the reduction route, so that any such rank, then the
    largest level wins, and every rank ends with the same triple
    (``from_agreement_word``)."""
    return (int(look) * LEVELS + level) * len(REDUCE_ROUTES) + route


def from_agreement_word(word):
    """(look, level, route) of an ``agreement_word``."""
    rest, route = divmod(int(word), len(REDUCE_ROUTES))
    look, level = divmod(rest, LEVELS)
    return bool(look), level, route


def node_level(ranks, cores):
    """A node's level for ``ranks`` ranks free to run on any of ``cores`` logical CPUs:
    ``load_level`` of ranks / cores."""
    return load_level(ranks / cores)


def load_level(load):
    """2 (crowded) where some CPU carries CROWDED_RANKS_PER_CORE ranks or more, 1
    (oversubscribed) where one carries more than one, else 0 (a core per rank)."""
    return 2 if load >= CROWDED_RANKS_PER_CORE - 1e-9 else int(load > 1.0 + 1e-9)


def bound_to_fewer_cores():
    """Whether this process's affinity mask leaves out some of its machine's CPUs: a
    launcher bound it (``mpirun -bind-to core``, ``srun --cpu-bind=cores``)."""
    return available_cores() < (os.cpu_count() or 1)


def node_load(comm):
    """(the most ranks of ``comm`` that one logical CPU of this node carries, each rank
    spread evenly over the CPUs of its affinity mask; how many CPUs the node's ranks may
    use together; how many ranks of ``comm`` run on this node): collective on ``comm``.
    Ranks bound one to a core carry 1 a core, however few CPUs each one's mask holds;
    two bound to one core carry 2 there."""
    MPI = _mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        load = np.zeros(os.cpu_count() or 1)
        ids = np.fromiter(os.sched_getaffinity(0), dtype=np.int64)
        ids = ids[ids < load.shape[0]]
        load[ids] = 1.0 / max(ids.shape[0], 1)
        node.Allreduce(MPI.IN_PLACE, load, op=MPI.SUM)
        return float(load.max()), int(np.count_nonzero(load)), node.Get_size()
    finally:
        node.Free()


class Wire:
    """The collectives and point-to-point calls of a protocol on ``comm``, rank 0 the
    root, counting bytes: ``sent`` / ``received`` are the payload bytes this rank put on /
    took off the wire (a broadcast counts once per receiving rank on the root, a
    reduction once per contributing rank, an allreduce as both). Every rank of ``comm``
    constructs it together (collective).

    On a node with more ranks than cores (``oversubscribed``: the launcher's count of
    ranks on the node above this process's cores on any rank of ``comm``, agreed in the
    constructor; or pass it; where a launcher bound ranks to fewer CPUs than the machine
    has, or gave no count of a node's ranks, what each CPU of the node carries,
    ``node_load``, so that ranks bound one to a core count as a core per rank) the
    collectives are root-centred point-to-point messages (Isend / Irecv, tags TAG_BCAST /
    TAG_REDUCE; sums in rank order): MPI's tree collectives pass a message through
    intermediate ranks, and each hop waits until that rank gets a time slice, which ranks
    spinning in the same collective take.

    While shared collectives are attached (``attach``: Dis-DDSS's channel on one node),
    the collectives of float64 vectors that fit them go root-centred through shared
    memory, on any node, and on an oversubscribed node those of longer ones too, in
    pieces (``channels.SharedCollectives``).

    ``spin``: how long each of this rank's waits spins before it sleeps (``poll``), the
    Wire's own and those of the channels on it; SPIN_SECONDS unless a protocol sets it
    (Dis-DDSS's server on an oversubscribed node does not spin, nor does any of its ranks
    on a ``crowded`` node, CROWDED_RANKS_PER_CORE ranks per core or more, where they
    sleep on doorbells instead: ``solvers/mpi/``).
    Constructing a Wire also makes the process's sleeps fine (``runtime.fine_timer_slack``,
    unless the runtime tuning is off)."""

    def __init__(self, comm, oversubscribed=None):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.sent = 0
        self.received = 0
        crowded = None
        route = REDUCE_ROUTES.index(reduce_route_from_env())
        # the logical CPUs this node's ranks may use together, and how many ranks of
        # the job run on it (``node_load``)
        self.node_cores, self.local_ranks = available_cores(), local_ranks(comm)
        if oversubscribed is None:
            look = bound_to_fewer_cores() or launcher_local_ranks() is None
            level = node_level(self.local_ranks, self.node_cores)
            if self.size > 1:
                # every rank must run the same collectives: one node with more ranks
                # than cores makes all of them root-centred (a job across machines can
                # mix such a node with others, and ranks that disagreed would deadlock,
                # root-centred sends meeting Ibcast); the reductions' route likewise, in
                # the same word (``agreement_word``)
                look, level, route = from_agreement_word(comm.allreduce(
                    agreement_word(level, route, look), op=_mpi().MAX))
                if look:
                    # a launcher that binds each rank to a core leaves each one core in
                    # its mask, and one that gives no count of the node's ranks (srun)
                    # leaves the whole job on this node: count what each CPU of the node
                    # carries instead, and its ranks (``node_load``)
                    load, self.node_cores, self.local_ranks = node_load(comm)
                    _, level, route = from_agreement_word(comm.allreduce(
                        agreement_word(load_level(load), route), op=_mpi().MAX))
            oversubscribed, crowded = level >= 1, level == 2
        self.reduce_route = REDUCE_ROUTES[route]
        self.oversubscribed = bool(oversubscribed)
        # whether some node holds CROWDED_RANKS_PER_CORE ranks per core or more (agreed
        # with ``oversubscribed``; as oversubscribed when that was passed): the shared
        # channel's waits then sleep on doorbells and spin not at all (``solvers/mpi/``)
        self.crowded = self.oversubscribed if crowded is None else bool(crowded)
        # whether every rank of ``comm`` runs on this node: the count of the job's ranks
        # here covers them (on COMM_WORLD the same answer on every rank, the nodes'
        # counts summing to its size); what a message costs follows from it
        # (``mpi.cg_products_from_shares``)
        self.one_node = self.local_ranks >= self.size
        self.shared = None
        self.spin = SPIN_SECONDS
        fine_timer_slack()

    def attach(self, shared):
        """Send the collectives whose vectors fit through ``shared`` (a
        ``channels.SharedCollectives``, on one node) until ``detach``; every rank attaches
        and detaches at the same point of the protocol."""
        self.shared = shared

    def detach(self):
        self.shared = None

    def _fits_shared(self, array):
        return self.shared is not None and self.shared.fits(array)

    def _root_centred(self, array):
        """Whether a collective of ``array`` goes root-centred: through the attached
        shared collectives when it fits them, else as point-to-point messages on an
        oversubscribed node (every rank decides alike: same shapes, same flag)."""
        return self.oversubscribed or self._fits_shared(array)

    def bcast(self, buf):
        """Broadcast ``buf`` from rank 0 in place; returns it."""
        if self._root_centred(buf):
            self._broadcast_from_root(buf)
        else:
            wait(self.comm.Ibcast(buf, root=0), self.spin)
        self._count(buf.nbytes, from_root=True)
        return buf

    def reduce(self, send, root_blank=False):
        """Sum to the server (None elsewhere). ``root_blank`` (read on the server
        alone): the server's ``send`` is a blank buffer (np.empty will do) whose contents
        are not summed; it receives the workers' sum, each page written first, never
        read first: the first worker's part is received or copied into it, the others
        added (a fresh np.zeros summed into faults each page twice: the zero page, then
        its copy). A vector that does not go root-centred takes ``reduce_route``
        (ASYNCOPT_MPI_REDUCE): by default one worker's comes as a message straight into
        the server's buffer, and more workers' go through MPI's reduction, whose tree sums
        on the workers' cores; "messages": the server receives every worker's and sums
        them in rank order; "mpi": MPI's reduction for one worker too."""
        if self._root_centred(send):
            recv = self._gather_to_root(send, _mpi().SUM, root_blank)
        elif self.reduce_route == "messages" or (self.size == 2 and
                                                 self.reduce_route == "auto"):
            recv = self._gather_to_root(send, _mpi().SUM, root_blank, through_window=False)
        else:
            recv = np.empty_like(send) if self.rank == 0 else None
            if root_blank and self.rank == 0:
                send, recv = np.zeros_like(send), send
            wait(self.comm.Ireduce(send, recv, op=_mpi().SUM, root=0), self.spin)
        self._count(send.nbytes, from_root=False)
        return recv

    def allreduce(self, send, op=None):
        """``op`` (default SUM) over every rank's ``send``, the result on every rank;
        counted as a reduction followed by a broadcast."""
        op = op or _mpi().SUM
        if self._root_centred(send) and op in (_mpi().SUM, _mpi().MAX):
            recv = self._gather_to_root(send, op)
            recv = self._broadcast_from_root(np.empty_like(send) if recv is None else recv)
        else:
            recv = np.empty_like(send)
            wait(self.comm.Iallreduce(send, recv, op=op), self.spin)
        self._count(send.nbytes, from_root=False)
        self._count(send.nbytes, from_root=True)
        return recv

    def _broadcast_from_root(self, buf):
        """Root-centred broadcast: rank 0's ``buf`` into every other rank's, through the
        attached shared collectives when it fits them (in pieces when it is a float64
        vector too long for one), else sent to each rank; returns ``buf`` (bytes not
        counted here)."""
        if self.shared is not None and self.shared.takes(buf):
            return self.shared.bcast(buf)
        if self.rank == 0:
            wait_all([self.comm.Isend(buf, dest=r, tag=TAG_BCAST)
                      for r in range(1, self.size)], self.spin)
        else:
            wait(self.comm.Irecv(buf, source=0, tag=TAG_BCAST), self.spin)
        return buf

    def _gather_to_root(self, send, op, root_blank=False, through_window=True):
        """Root-centred reduction: every other rank's ``send`` combined onto rank 0's in
        rank order (SUM or MAX), through the attached shared collectives when it fits
        them (in pieces when it is a float64 vector too long for one; ``through_window``
        False: as messages whatever the window), else sent to rank 0; None off the root.
        ``root_blank``: rank 0's ``send`` is a blank buffer that receives the others'
        combination (``reduce``)."""
        combine = np.add if op == _mpi().SUM else np.maximum
        if through_window and self.shared is not None and self.shared.takes(send):
            return self.shared.gather(send, combine, root_blank)
        if self.rank != 0:
            wait(self.comm.Isend(send, dest=0, tag=TAG_REDUCE), self.spin)
            return None
        # a blank root receives the first worker's part itself
        parts = [send if root_blank and r == 1 else np.empty_like(send)
                 for r in range(1, self.size)]
        wait_all([self.comm.Irecv(part, source=r, tag=TAG_REDUCE)
                  for r, part in enumerate(parts, start=1)], self.spin)
        total = parts.pop(0) if root_blank else send.copy()
        for part in parts:
            combine(total, part, out=total)
        return total

    def _count(self, nbytes, from_root):
        """Count ``nbytes`` per non-root rank, sent by the root (from_root) or to it."""
        if (self.rank == 0) == from_root:
            self.sent += nbytes * (self.size - 1 if self.rank == 0 else 1)
        else:
            self.received += nbytes * (self.size - 1 if self.rank == 0 else 1)

    def isend(self, buf, dest, tag):
        """Start sending ``buf`` (keep it alive until the request completes)."""
        self.sent += buf.nbytes
        return self.comm.Isend(buf, dest=dest, tag=tag)

    def send(self, buf, dest, tag):
        """Send ``buf`` and wait until it has left."""
        wait(self.isend(buf, dest, tag), self.spin)

    def recv(self, buf, source, tag):
        """Receive into ``buf`` (exactly its size); returns it."""
        wait(self.comm.Irecv(buf, source=source, tag=tag), self.spin)
        self.received += buf.nbytes
        return buf
