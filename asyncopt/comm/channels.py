"""The inner loop's transport between Dis-DDSS's server and its workers (solvers/mpi/).

Both channels carry the same messages, numpy buffers and never pickles: a worker's delta
(int32 indices or bitmap words, ``comm/messages.py``; float64 header + values) and the
server's reply (the same), one of each in flight per worker. A worker writes its next
delta only after it has read the reply to the previous one, and the server answers a delta
only after it has read it, so each buffer below has one writer at a time and its reader is
done before the next write.

``SharedMemoryChannel``, when every rank runs on one node: an MPI-3 shared-memory window
(``MPI_Win_allocate_shared``) holds, in each worker's segment, a delta slot and a reply
slot sized for the whole active set, and in the server's segment one row of sequence
numbers per worker (the worker's and the server's on separate cache lines). A side writes
its message into the slot, ``MPI_Win_sync``, then raises its sequence number; the other
polls that number, ``MPI_Win_sync``, then reads the slot in place. A message moves without
either side calling into MPI: with MPI messages on an oversubscribed node a delta larger
than one MPICH shared-memory cell moves only while both ranks are inside MPI, so the
server waited for workers busy in a numba batch. On a crowded node (``Wire.crowded``) the
window also holds a doorbell per rank (``wire.Doorbell``): a side that raises a sequence
number rings the rank that waits for it, and that rank sleeps on its doorbell instead of
checking on a timer.

``MessageChannel``, otherwise (ranks on several nodes; a window that would not fit in
SHARED_BUDGET bytes or in half of the free space of /dev/shm; or
ASYNCOPT_MPI_TRANSPORT=messages): Isend / Irecv with tags TAG_INDEX .. TAG_REPLY. The
worker posts the receives of the reply before its delta leaves, so the reply lands while
it computes its next batch.

Both count the payload bytes on the ``Wire`` (``sent`` / ``received``) the same way, so
bytes per run do not depend on the transport.

The shared channel also carries the outer iteration's broadcasts and reductions of float64
vectors (``SharedCollectives``, attached to the ``Wire`` while the channel is open): those
up to its capacity on any node, longer ones (a Newton step's Hessian shares) in pieces on
an oversubscribed node, where the Wire's collectives are root-centred.
"""
import os

import numpy as np

from .wire import Doorbell, _mpi, poll, wait_all

TAG_INDEX, TAG_VALUES, TAG_REPLY_INDEX, TAG_REPLY = 11, 12, 13, 14
TRANSPORTS = ("auto", "shared", "messages")
SHARED_BUDGET = 1 << 30           # bytes of shared window at most (auto)
_LINE = 8                         # int64 per cache line: a sequence row's two halves
SEQ_DELTA, COUNT_DELTA_INDEX, COUNT_DELTA, SEQ_REPLY, COUNT_REPLY_INDEX, COUNT_REPLY = \
    0, 1, 2, 8, 9, 10
# the collectives' sequence numbers (``SharedCollectives``): on a worker's row, its half
# counts the vectors it posted for reductions and the broadcasts it has read, the
# server's half the worker's vectors it has summed; row 0 (no worker) holds the
# broadcasts the server has posted
SEQ_SUM_POSTED, SEQ_BCAST_READ, SEQ_SUM_READ, SEQ_BCAST = 3, 4, 11, 8


def _round_up(nbytes, to=64):
    return (nbytes + to - 1) // to * to


def transport_from_env(transport=None):
    """``transport`` or, when None, the environment's ASYNCOPT_MPI_TRANSPORT (default
    "auto"); ValueError for anything else than auto, shared or messages."""
    value = os.environ.get("ASYNCOPT_MPI_TRANSPORT", "auto") if transport is None \
        else transport
    value = str(value).strip().lower()
    if value not in TRANSPORTS:
        raise ValueError(f"unknown MPI transport {value!r} (ASYNCOPT_MPI_TRANSPORT or "
                         f"transport=): expected one of {', '.join(TRANSPORTS)}")
    return value


def _shared_window_bytes(n_workers, capacity, header, reply_header):
    return sum(_SharedSlots.layout(capacity, header, reply_header)) * n_workers + \
        _server_segment_bytes(n_workers, capacity, header)


def _sequence_bytes(n_workers):
    """The sequence rows at the start of the server's segment (one per rank)."""
    return _round_up(8 * _LINE * 2 * (n_workers + 1))


def _ring(bells, rank):
    """Ring ``rank``'s doorbell, where the channel has them (``bells`` None: not)."""
    if bells is not None:
        bells[rank].ring()


def _copy_into(total, piece, out):
    """``combine`` for a blank total: out = piece (``total`` is ``out``, not read)."""
    np.copyto(out, piece)


def _doorbell_bytes(n_workers):
    """The ranks' doorbells after the sequence rows: an int32 each, a cache line apart."""
    return 64 * (n_workers + 1)


def _server_segment_bytes(n_workers, capacity, header):
    """The server's segment: the sequence rows, the doorbells, then the broadcast buffer
    (header + capacity float64)."""
    return _sequence_bytes(n_workers) + _doorbell_bytes(n_workers) + \
        _round_up(8 * (header + capacity))


def _free_shm_bytes():
    try:
        stat = os.statvfs("/dev/shm")
    except (AttributeError, OSError):
        return None
    return stat.f_bavail * stat.f_frsize


def open_channel(comm, wire, capacity, header, reply_header, transport=None):
    """The channel for this run (collective on ``comm``: every rank calls it with the same
    arguments). ``capacity``: the most coordinates a message can carry (the number of
    active features at the start; it only shrinks); ``header`` / ``reply_header``: the
    float64 values in front of a delta's / a reply's values."""
    MPI = _mpi()
    transport = transport_from_env(transport)
    n_workers = comm.Get_size() - 1
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    one_node = node.Get_size() == comm.Get_size()
    if not one_node:
        node.Free()
        if transport == "shared":
            raise ValueError("ASYNCOPT_MPI_TRANSPORT=shared needs every rank on one node")
        return MessageChannel(comm, wire, capacity, header, reply_header)
    choice = np.zeros(1)
    if comm.Get_rank() == 0:
        needed = _shared_window_bytes(n_workers, capacity, header, reply_header)
        free = _free_shm_bytes()
        fits = needed <= SHARED_BUDGET and (free is None or 2 * needed <= free)
        choice[0] = transport == "shared" or (transport == "auto" and fits)
    comm.Bcast(choice, root=0)
    if not choice[0]:
        node.Free()
        return MessageChannel(comm, wire, capacity, header, reply_header)
    return SharedMemoryChannel(comm, node, wire, capacity, header, reply_header)


class MessageChannel:
    """The inner loop over MPI point-to-point messages (see the module docstring)."""
    name = "messages"
    collectives = None      # the Wire's collectives stay MPI's
    rings = False           # no doorbells (``SharedMemoryChannel``)

    def __init__(self, comm, wire, capacity, header, reply_header):
        self.comm, self.wire = comm, wire
        self.header, self.reply_header = header, reply_header
        self.rank = comm.Get_rank()
        n_workers = comm.Get_size() - 1
        self.status = _mpi().Status()
        if self.rank == 0:
            self.in_flight = [[] for _ in range(n_workers + 1)]
        else:
            self.index_buf = np.empty(capacity, dtype=np.int32)
            self.values_buf = np.empty(header + capacity)
            self.fresh_buf = np.empty(capacity, dtype=np.int32)
            self.reply_buf = np.empty(reply_header + capacity)
            self.statuses = [_mpi().Status() for _ in range(4)]
            self.requests = None

    # worker side
    def delta_buffers(self):
        """(index, values): where the worker writes its next delta (indices, then header +
        values)."""
        return self.index_buf, self.values_buf

    def post_delta(self, n_index, n_values):
        """Send the delta written into ``delta_buffers``: ``n_index`` int32 of index (its
        indices, or its bitmap), ``n_values`` values after the header."""
        comm, wire = self.comm, self.wire
        index, values = self.index_buf[:n_index], self.values_buf[:self.header + n_values]
        self.requests = [comm.Irecv(self.fresh_buf, source=0, tag=TAG_REPLY_INDEX),
                         comm.Irecv(self.reply_buf, source=0, tag=TAG_REPLY),
                         wire.isend(index, 0, TAG_INDEX), wire.isend(values, 0, TAG_VALUES)]

    def wait_reply(self):
        """(indices, header + values) of the reply to the last delta, once it is here."""
        MPI = _mpi()
        requests, statuses = self.requests, self.statuses
        poll(lambda: MPI.Request.Testall(requests, statuses), self.wire.spin)
        fresh = self.fresh_buf[:statuses[0].Get_count(MPI.INT32_T)]
        reply = self.reply_buf[:statuses[1].Get_count(MPI.DOUBLE)]
        self.wire.received += fresh.nbytes + reply.nbytes
        return fresh, reply

    # server side
    def wait_delta(self):
        """(worker, indices, header + values) of the next delta to arrive."""
        MPI, comm, status = _mpi(), self.comm, self.status
        poll(lambda: comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_INDEX, status=status),
             self.wire.spin)
        source = status.Get_source()
        index = np.empty(status.Get_count(MPI.INT32_T), dtype=np.int32)
        comm.Recv(index, source=source, tag=TAG_INDEX)
        comm.Probe(source=source, tag=TAG_VALUES, status=status)
        values = np.empty(status.Get_count(MPI.DOUBLE))
        comm.Recv(values, source=source, tag=TAG_VALUES)
        self.wire.received += index.nbytes + values.nbytes
        return source, index, values

    def reply_buffers(self, worker, n_index, n_values):
        """(indices, header + values) to fill with the reply to ``worker``'s last delta."""
        return (np.empty(n_index, dtype=np.int32),
                np.empty(self.reply_header + n_values))

    def post_reply(self, worker, index, values):
        """Send the reply written into ``reply_buffers``, once the previous one to this
        worker has left."""
        wait_all(self.in_flight[worker], self.wire.spin)
        self.in_flight[worker] = [self.wire.isend(index, worker, TAG_REPLY_INDEX),
                                  self.wire.isend(values, worker, TAG_REPLY)]

    def flush(self):
        """Wait until every reply has left (the server, at the end of an inner loop)."""
        for requests in self.in_flight:
            wait_all(requests, self.wire.spin)

    def close(self):
        """Release the channel (collective; nothing to release here)."""


class _SharedSlots:
    """One worker's delta and reply slots in its segment of the window."""

    @staticmethod
    def layout(capacity, header, reply_header):
        """Bytes of the five buffers, each padded to 64: delta values, delta indices,
        reply values, reply indices, and the vector the worker adds to a reduction
        (``SharedCollectives``; header + capacity float64)."""
        return [_round_up(8 * (header + capacity)), _round_up(4 * capacity),
                _round_up(8 * (reply_header + capacity)), _round_up(4 * capacity),
                _round_up(8 * (header + capacity))]

    def __init__(self, memory, capacity, header, reply_header):
        sizes = self.layout(capacity, header, reply_header)
        starts = np.cumsum([0] + sizes)
        self.delta_values = memory[starts[0]:starts[0] + 8 * (header + capacity)].view(
            np.float64)
        self.delta_index = memory[starts[1]:starts[1] + 4 * capacity].view(np.int32)
        self.reply_values = memory[starts[2]:starts[2] + 8 * (reply_header + capacity)].view(
            np.float64)
        self.reply_index = memory[starts[3]:starts[3] + 4 * capacity].view(np.int32)
        self.summand = memory[starts[4]:starts[4] + 8 * (header + capacity)].view(
            np.float64)


class SharedMemoryChannel:
    """The inner loop through an MPI-3 shared-memory window (see the module docstring).

    Sequence numbers (int64, the server's segment, one row of 16 per worker): the worker
    writes SEQ_DELTA (deltas posted so far), COUNT_DELTA_INDEX and COUNT_DELTA on the row's
    first cache line,
    the server SEQ_REPLY (the delta it last answered), COUNT_REPLY_INDEX and COUNT_REPLY on
    the second."""
    name = "shared"

    def __init__(self, comm, node, wire, capacity, header, reply_header):
        MPI = _mpi()
        self.wire = wire
        self.header, self.reply_header = header, reply_header
        self.rank = comm.Get_rank()
        n_workers = comm.Get_size() - 1
        self.n_workers = n_workers
        segment = sum(_SharedSlots.layout(capacity, header, reply_header))
        server_segment = _server_segment_bytes(n_workers, capacity, header)
        rows = _sequence_bytes(n_workers)
        self.node = node
        self.window = MPI.Win.Allocate_shared(server_segment if self.rank == 0 else segment,
                                              1, comm=node)
        buffer, _ = self.window.Shared_query(0)
        server_memory = np.ndarray(buffer=buffer, dtype=np.uint8, shape=(server_segment,))
        self.sequence = server_memory[:rows].view(np.int64).reshape(n_workers + 1,
                                                                    2 * _LINE)
        bells = server_memory[rows:rows + _doorbell_bytes(n_workers)].view(np.int32)
        # rank r's doorbell (``wire.Doorbell``), rung by whoever posts what r waits for,
        # on a crowded node (``Wire.crowded``: the same answer on every rank)
        self.bells = [Doorbell(bells[16 * r:16 * r + 1]) for r in range(n_workers + 1)] \
            if Doorbell.available and wire.crowded else None
        self.rings = self.bells is not None
        self.bell = None if self.bells is None else self.bells[self.rank]
        start = rows + _doorbell_bytes(n_workers)
        broadcast = server_memory[start:start + 8 * (header + capacity)].view(np.float64)
        self.slots = {}
        for worker in range(1, n_workers + 1):
            if self.rank in (0, worker):
                buffer, _ = self.window.Shared_query(worker)
                memory = np.ndarray(buffer=buffer, dtype=np.uint8, shape=(segment,))
                self.slots[worker] = _SharedSlots(memory, capacity, header, reply_header)
        self.window.Lock_all(MPI.MODE_NOCHECK)
        if self.rank == 0:
            self.sequence[:] = 0
            bells[:] = 0
            self.window.Sync()
        node.Barrier()
        self.window.Sync()
        self.served = np.zeros(n_workers + 1, dtype=np.int64)    # server: deltas read
        self.posted = 0                                            # worker: deltas sent
        self.next = 1
        self.collectives = SharedCollectives(
            wire, n_workers, self.sequence, broadcast,
            {worker: slot.summand for worker, slot in self.slots.items()}, self.window.Sync,
            self.bells)

    # worker side
    def delta_buffers(self):
        slot = self.slots[self.rank]
        return slot.delta_index, slot.delta_values

    def post_delta(self, n_index, n_values):
        row = self.sequence[self.rank]
        self.wire.sent += 4 * n_index + 8 * (self.header + n_values)
        row[COUNT_DELTA_INDEX] = n_index
        row[COUNT_DELTA] = n_values
        self.window.Sync()
        self.posted += 1
        row[SEQ_DELTA] = self.posted
        _ring(self.bells, 0)

    def wait_reply(self):
        row, posted = self.sequence[self.rank], self.posted
        # spins as the server does, yielding its core to any rank that computes on it
        # (``poll``)
        poll(lambda: row[SEQ_REPLY] >= posted, self.wire.spin, self.bell)
        self.window.Sync()
        slot = self.slots[self.rank]
        fresh = slot.reply_index[:row[COUNT_REPLY_INDEX]]
        reply = slot.reply_values[:self.reply_header + row[COUNT_REPLY]]
        self.wire.received += fresh.nbytes + reply.nbytes
        return fresh, reply

    # server side
    def wait_delta(self):
        sequence, served, n_workers = self.sequence, self.served, self.n_workers
        found = [0]

        def ready():
            waiting = np.flatnonzero(sequence[1:, SEQ_DELTA] > served[1:]) + 1
            if not waiting.shape[0]:
                return False
            later = waiting[waiting >= self.next]      # round robin over the ready ones
            found[0] = int(later[0] if later.shape[0] else waiting[0])
            return True

        poll(ready, self.wire.spin, self.bell)
        self.window.Sync()
        worker = found[0]
        self.next = worker % n_workers + 1
        served[worker] += 1
        slot = self.slots[worker]
        index = slot.delta_index[:int(sequence[worker, COUNT_DELTA_INDEX])]
        values = slot.delta_values[:self.header + int(sequence[worker, COUNT_DELTA])]
        self.wire.received += index.nbytes + values.nbytes
        return worker, index, values

    def reply_buffers(self, worker, n_index, n_values):
        slot = self.slots[worker]
        return (slot.reply_index[:n_index],
                slot.reply_values[:self.reply_header + n_values])

    def post_reply(self, worker, index, values):
        row = self.sequence[worker]
        self.wire.sent += index.nbytes + values.nbytes
        row[COUNT_REPLY_INDEX] = index.shape[0]
        row[COUNT_REPLY] = values.shape[0] - self.reply_header
        self.window.Sync()
        row[SEQ_REPLY] = self.served[worker]
        _ring(self.bells, worker)

    def flush(self):
        """Nothing is in flight: a reply is in place once posted."""

    def close(self):
        """Free the window (collective over the node's ranks)."""
        self.collectives = None
        self.window.Unlock_all()
        self.window.Free()
        self.node.Free()


class SharedCollectives:
    """Broadcasts from the server and reductions to it of float64 vectors of at most
    ``capacity`` (header + the channel's capacity) numbers, through the channel's window:
    what ``Wire`` uses for them while it is attached (``Wire.attach``), on one node.

    Broadcast: the server waits until every worker has read the previous broadcast
    (SEQ_BCAST_READ; by then they have), writes the vector into its broadcast buffer,
    ``MPI_Win_sync``, and raises SEQ_BCAST; a worker waits for that number and copies the
    vector out. Reduction: a worker waits until the server has summed its previous
    vector (SEQ_SUM_READ), writes the new one into its slot and raises SEQ_SUM_POSTED;
    the server adds the workers' vectors in rank order as they come (the sums of the
    root-centred reduction, bit for bit) and releases each slot once added.

    No side needs the other inside MPI: MPICH moves a message larger than an eager cell
    only while both ranks call into it, so a broadcast of the gradient as a message
    waits for workers that have gone on computing, and a worker's reduction for a server
    that sleeps between checks."""

    def __init__(self, wire, n_workers, sequence, broadcast, summands, sync, bells=None):
        self.wire, self.rank, self.n_workers = wire, wire.rank, n_workers
        self.bells = bells
        self.bell = None if bells is None else bells[self.rank]
        self.sequence, self.broadcast, self.summands = sequence, broadcast, summands
        self.capacity = broadcast.shape[0]
        self.sync = sync
        self.broadcasts = 0      # broadcasts posted (server) or read (worker)
        self.sums = np.zeros(n_workers + 1, dtype=np.int64)   # per worker: its vectors

    def takes(self, array):
        """Whether ``array`` can travel here: a contiguous float64 vector, of any length
        (one longer than ``capacity`` goes in pieces; every rank passes the same shape,
        so all agree)."""
        return array.dtype == np.float64 and array.ndim == 1 and array.flags.c_contiguous

    def fits(self, array):
        """Whether ``array`` can travel here in one piece (``takes`` it, and it holds at
        most ``capacity`` numbers)."""
        return self.takes(array) and array.shape[0] <= self.capacity

    def bcast(self, buf):
        """``buf`` from the server into every worker's ``buf``, one piece of at most
        ``capacity`` numbers after another; returns it."""
        for start in range(0, max(buf.shape[0], 1), self.capacity):
            self._bcast_piece(buf[start:start + self.capacity])
        return buf

    def gather(self, send, combine, root_blank=False):
        """The workers' ``send`` combined (``combine``: np.add or np.maximum) onto the
        server's, in rank order, on the server (None on a worker), one piece of at most
        ``capacity`` numbers after another; ``root_blank``: the server's ``send`` is a
        blank buffer that receives the workers' combination alone, the first worker's
        pieces copied in (``Wire.reduce``). A Newton step's Hessian shares take several
        pieces."""
        pieces = range(0, max(send.shape[0], 1), self.capacity)
        if self.rank != 0:
            for start in pieces:
                self._post_piece(send[start:start + self.capacity])
            return None
        total = send if root_blank else send.copy()
        # worker by worker, each one's pieces in turn: the first to finish its vector is
        # summed while the others still form theirs, and each element's sum runs in rank
        # order either way
        for worker in range(1, self.n_workers + 1):
            merge = _copy_into if root_blank and worker == 1 else combine
            for start in pieces:
                self._add_piece(worker, total[start:start + self.capacity], merge)
        return total

    def _bcast_piece(self, buf):
        sequence, k = self.sequence, buf.shape[0]
        if self.rank == 0:
            done = self.broadcasts
            poll(lambda: bool(np.all(sequence[1:, SEQ_BCAST_READ] >= done)), self.wire.spin,
                 self.bell)
            self.broadcast[:k] = buf
            self.sync()
            self.broadcasts = done + 1
            sequence[0, SEQ_BCAST] = self.broadcasts
            for worker in range(1, self.n_workers + 1):
                _ring(self.bells, worker)
        else:
            expected = self.broadcasts + 1
            poll(lambda: sequence[0, SEQ_BCAST] >= expected, self.wire.spin, self.bell)
            self.sync()
            buf[:] = self.broadcast[:k]
            self.broadcasts = expected
            sequence[self.rank, SEQ_BCAST_READ] = expected
            _ring(self.bells, 0)

    def _post_piece(self, send):
        """A worker: ``send`` into its summand slot once the server has read the last."""
        posted, row = self.sums[self.rank], self.sequence[self.rank]
        poll(lambda: row[SEQ_SUM_READ] >= posted, self.wire.spin, self.bell)
        self.summands[self.rank][:send.shape[0]] = send
        self.sync()
        self.sums[self.rank] = posted + 1
        row[SEQ_SUM_POSTED] = posted + 1
        _ring(self.bells, 0)

    def _add_piece(self, worker, total, combine):
        """The server: ``worker``'s next posted piece combined into ``total`` (in place:
        ``combine(total, piece, out=total)``)."""
        row, expected = self.sequence[worker], self.sums[worker] + 1
        poll(lambda: row[SEQ_SUM_POSTED] >= expected, self.wire.spin, self.bell)
        self.sync()
        combine(total, self.summands[worker][:total.shape[0]], out=total)
        self.sums[worker] = expected
        row[SEQ_SUM_READ] = expected
        _ring(self.bells, worker)
