"""Synchronous federated rounds over flat float32 parameter vectors (docs/design.md §6).

Protocol of round r (FedAvg, McMahan et al. 2017; FedProx, Li et al. 2020):

1. the server samples m = max(1, round(fraction * K)) of the K clients without
   replacement (``numpy.random.default_rng(seed)``, one draw per round; all K when
   fraction = 1) and sends each the global vector w_r;
2. client i loads w_r into its model, trains locally (the user's ``local_train(model,
   client, round) -> n_i``, e.g. :class:`LocalTrainer`: E epochs of SGD on its data,
   optionally with the FedProx term mu/2 ||w - w_r||^2 added to the loss) and replies
   with its vector w_r^i and its sample count n_i;
3. the server sets w_{r+1} = sum_i n_i w_r^i / sum_i n_i over the participants
   (accumulated in float64; clients with n_i = 0 weigh 0; if all weigh 0, w_{r+1} = w_r).

The vector (:class:`ParameterVector`) is every parameter of the model, then every
floating-point buffer (BatchNorm running mean and variance), flattened in
``named_parameters`` / ``named_buffers`` order and cast to float32: buffers are averaged
like parameters, as FedAvg on state dicts does. Integer buffers (BatchNorm's
``num_batches_tracked``) never travel: each model keeps its own (they only matter for
``momentum=None``). ``buffers=False`` leaves all buffers local.

Byte accounting, per round: ``bytes_sent`` = 4 P m (the server's vector to each
participant) and ``bytes_received`` = 4 P m (one vector from each), P the vector's length;
the sample counts and participant lists (O(m) integers) are not counted. Both transports
report the same counts: they are the protocol's, not the wire's (:class:`MPITransport`
keeps its wire totals in ``wire_bytes_sent`` / ``wire_bytes_received``).

Transports (same protocol, one interface: ``is_server``; ``start(n_clients,
vector_size)`` on every rank; on the server ``exchange(round, clients, vector,
run_client)``, yielding ``(client, vector, n)`` in ascending client order, and ``close()``;
on the other ranks ``serve(run_client)``, which returns when the server closes;
``abort()`` when a rank fails; ``run_client(client, vector, round) -> (vector, n)`` is one
client's local update):

- :class:`InProcessTransport`: every client runs in this process, one after the other,
  on the one model;
- :class:`MPITransport`: rank 0 is the server, ranks 1..W each run a fixed set of clients
  on their own copy of the model.
"""
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..progress import format_bytes
from ..comm.wire import abort_all_ranks

FLOAT32_BYTES = 4


class ParameterVector:
    """A model's parameters (and floating-point buffers) <-> one flat float32 vector.

    The layout is fixed at construction: parameters in ``named_parameters()`` order, then,
    when ``buffers`` is true, floating-point buffers in ``named_buffers()`` order; each
    tensor flattened (row-major).

    Parameters
    ----------
    model : torch.nn.Module
        The model whose tensors the vector holds (views: :meth:`set` writes into them).
    buffers : bool, default=True
        Include the floating-point buffers (BatchNorm running statistics).
    trainable_only : bool, default=False
        Only the parameters with ``requires_grad`` (the adapters and head of a LoRA-tuned
        model, ``asyncopt.deep.lora``); frozen weights never travel.

    Attributes
    ----------
    names : list of str
        The tensors' names, in layout order.
    tensors : list of torch.Tensor
        The tensors themselves.
    shapes : list of tuple
        Their shapes.
    numels : list of int
        Their entry counts.
    size : int
        P, the vector's length.
    """

    def __init__(self, model, buffers=True, trainable_only=False):
        named = [(name, p) for name, p in model.named_parameters()
                 if p.requires_grad or not trainable_only]
        if buffers:
            named += [(name, b) for name, b in model.named_buffers()
                      if torch.is_floating_point(b)]
        if not named:
            raise ValueError("the model has no parameters")
        self._set_layout(named)

    @classmethod
    def of_tensors(cls, tensors):
        """Make the same layout over an explicit list of tensors (names "0", "1", ...).

        E.g. Multi-LoRA's shared factors or one task's; an empty list gives P = 0.

        Parameters
        ----------
        tensors : iterable of torch.Tensor
            The tensors.

        Returns
        -------
        ParameterVector
            The layout over ``tensors``.
        """
        flat = cls.__new__(cls)
        flat._set_layout([(str(i), t) for i, t in enumerate(tensors)])
        return flat

    def _set_layout(self, named):
        self.names = [name for name, _ in named]
        self.tensors = [t for _, t in named]
        self.shapes = [tuple(t.shape) for t in self.tensors]
        self.numels = [t.numel() for t in self.tensors]
        self.size = int(sum(self.numels))

    @property
    def nbytes(self):
        """Bytes of one vector on the wire: 4 P."""
        return FLOAT32_BYTES * self.size

    @torch.no_grad()
    def get(self):
        """Return the current values as a new float32 numpy vector of length P.

        Returns
        -------
        ndarray of float32, shape (P,)
            The flattened tensors.
        """
        if not self.tensors:
            return np.zeros(0, dtype=np.float32)
        return torch.cat([t.detach().reshape(-1).to("cpu", torch.float32)
                          for t in self.tensors]).numpy()

    @torch.no_grad()
    def set(self, vector):
        """Load a length-P vector into the tensors (cast to each tensor's dtype).

        Parameters
        ----------
        vector : array-like of shape (P,)
            The values, in layout order.
        """
        vector = np.asarray(vector)
        if vector.shape != (self.size,):
            raise ValueError(f"expected a vector of shape ({self.size},), got {vector.shape}")
        flat = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float32))
        for tensor, piece in zip(self.tensors, torch.split(flat, self.numels)):
            tensor.copy_(piece.view_as(tensor))


def fedprox_term(params, global_params, mu):
    """Return the FedProx proximal term mu/2 sum_j ||w_j - w_global_j||^2.

    Li et al. 2020, eq. 2; its gradient with respect to w is mu (w - w_global), the global
    parameters being constants.

    Parameters
    ----------
    params : iterable of torch.Tensor
        The client's parameters w.
    global_params : iterable of torch.Tensor
        The received global parameters, same shapes (detached).
    mu : float
        The proximal coefficient.

    Returns
    -------
    torch.Tensor
        The scalar term.
    """
    params, global_params = list(params), list(global_params)
    if len(params) != len(global_params):
        raise ValueError("params and global_params differ in length")
    total = sum(((w - g.detach()) ** 2).sum() for w, g in zip(params, global_params))
    return 0.5 * mu * total


class LocalTrainer:
    """The usual client update of a federated round: local minibatch SGD epochs.

    ``trainer(model, client, round)`` trains ``model`` in place for ``epochs`` passes over
    ``X[partition[client]]`` on ``loss_fn(model(x), y)``, plus the FedProx term
    mu/2 ||w - w_r||^2 when ``mu > 0`` (w_r: the parameters the client received), and
    returns the client's sample count. Batches are consecutive slices of the epoch's order;
    a last batch of one sample joins the batch before it (BatchNorm cannot train on one
    sample). Each call builds a fresh optimizer (no optimizer state crosses rounds).
    Reproducible: epoch e visits the samples in the order
    ``numpy.random.default_rng([seed, round, client]).permutation(n_i)`` (one permutation
    per epoch), after a first draw ``integers(2**63)`` of that generator that seeds torch's
    global RNG (dropout) inside a ``torch.random.fork_rng`` block, which leaves it as it
    was.

    Parameters
    ----------
    X : array-like or torch.Tensor
        All clients' inputs.
    y : array-like or torch.Tensor
        All clients' targets.
    partition : sequence of array-like of int
        ``partition[client]``: the client's row indices.
    epochs : int, default=1
        Local passes per round.
    batch_size : int, default=32
        Minibatch size.
    lr : float, default=0.05
        SGD learning rate.
    momentum : float, default=0.0
        SGD momentum.
    weight_decay : float, default=0.0
        SGD weight decay.
    mu : float, default=0.0
        FedProx coefficient; 0: FedAvg's plain local loss.
    loss_fn : callable, default=None
        ``loss_fn(outputs, y)``; None: cross-entropy.
    seed : int, default=0
        Seed of the sample orders (with the round and the client).
    batch_loss : callable, default=None
        ``batch_loss(model, x, y, client) -> loss`` replaces ``loss_fn(model(x), y)`` as the
        minibatch loss (the FedProx term is still added): the hook for local objectives that
        need more than the model's outputs, e.g. distillation from a client's frozen teacher
        (``asyncopt.deep.fedlpfm``); it runs inside the seeded RNG block.
    make_optimizer : callable, default=None
        ``make_optimizer(params)`` builds the optimizer; None:
        ``torch.optim.SGD(params, lr, momentum, weight_decay)``.

    See Also
    --------
    run_federated : Runs the rounds this trainer serves.
    """

    def __init__(self, X, y, partition, *, epochs=1, batch_size=32, lr=0.05, momentum=0.0,
                 weight_decay=0.0, mu=0.0, loss_fn=None, seed=0, batch_loss=None,
                 make_optimizer=None):
        self.X = torch.as_tensor(X)
        self.y = torch.as_tensor(y)
        self.partition = [np.asarray(p, dtype=np.int64) for p in partition]
        self.epochs, self.batch_size = int(epochs), int(batch_size)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.mu, self.seed = float(mu), seed
        self.loss_fn = loss_fn or torch.nn.functional.cross_entropy
        self.batch_loss = batch_loss
        self.make_optimizer = make_optimizer

    def __call__(self, model, client, round_index):
        indices = self.partition[client]
        if indices.size == 0:
            return 0
        rng = np.random.default_rng([self.seed, round_index, client])
        params = [p for p in model.parameters() if p.requires_grad]
        received = [p.detach().clone() for p in params] if self.mu > 0 else None
        if self.make_optimizer is not None:
            optimizer = self.make_optimizer(params)
        else:
            optimizer = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                        weight_decay=self.weight_decay)
        model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng.integers(2 ** 63)))
            for _ in range(self.epochs):
                order = indices[rng.permutation(indices.size)]
                starts = list(range(0, order.size, self.batch_size))
                if len(starts) > 1 and order.size - starts[-1] == 1:
                    starts.pop()
                for start, end in zip(starts, starts[1:] + [order.size]):
                    batch = torch.from_numpy(order[start:end])
                    x, y = self.X[batch], self.y[batch]
                    if self.batch_loss is not None:
                        loss = self.batch_loss(model, x, y, client)
                    else:
                        loss = self.loss_fn(model(x), y)
                    if self.mu > 0:
                        loss = loss + fedprox_term(params, received, self.mu)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        return int(indices.size)


def aggregation_weights(counts):
    """Return FedAvg's weights n_i / sum_j n_j.

    A client with n_i = 0 weighs 0; all weights are 0 when every client is empty (the round
    that keeps the global vector).

    Parameters
    ----------
    counts : array-like of int
        The participants' sample counts.

    Returns
    -------
    list of float
        One weight per participant.
    """
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    return (counts / total if total > 0 else np.zeros_like(counts)).tolist()


def sample_clients(rng, n_clients, fraction):
    """Draw m = max(1, round(fraction * K)) distinct clients, in ascending order.

    Parameters
    ----------
    rng : numpy.random.Generator
        The server's generator (one draw per round).
    n_clients : int
        K.
    fraction : float
        The participating fraction, in (0, 1]; all K when m = K.

    Returns
    -------
    ndarray of int64
        The participants, ascending.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"client_fraction must be in (0, 1], got {fraction}")
    m = max(1, int(round(fraction * n_clients)))
    if m == n_clients:
        return np.arange(n_clients, dtype=np.int64)
    return np.sort(rng.choice(n_clients, size=m, replace=False)).astype(np.int64)


class InProcessTransport:
    """All clients in this process, run one after the other on the server's model.

    The transport interface of :func:`run_federated` (module docstring) without messages.

    Attributes
    ----------
    is_server : bool
        Always True.
    """

    is_server = True

    def start(self, n_clients, vector_size):
        """Prepare a run (nothing to do in process).

        Parameters
        ----------
        n_clients : int
            K.
        vector_size : int
            P.
        """
        pass

    def exchange(self, round_index, clients, vector, run_client):
        """Run one round's participants here, in ascending client order.

        Parameters
        ----------
        round_index : int
            The round r.
        clients : array-like of int
            The participants.
        vector : ndarray of float32
            The global vector w_r.
        run_client : callable
            ``run_client(client, vector, round) -> (vector, n)``.

        Yields
        ------
        tuple
            ``(client, vector, n)`` per participant.
        """
        for client in np.sort(np.asarray(clients, dtype=np.int64)):
            reply, n = run_client(int(client), vector, round_index)
            yield int(client), reply, n

    def serve(self, run_client):
        """Raise: an in-process transport has no worker side.

        Parameters
        ----------
        run_client : callable
            Unused.

        Raises
        ------
        RuntimeError
            Always.
        """
        raise RuntimeError("InProcessTransport has no worker side")

    def close(self):
        """End a run (nothing to do in process).
        """
        pass

    def abort(self):
        """Handle a failure (nothing to do in process).
        """
        pass


TAG_VECTOR, TAG_COUNT = 31, 32


def client_ranks(n_clients, n_workers, assignment="round_robin"):
    """Return the MPI rank (1..n_workers) that runs each client 0..K-1.

    Parameters
    ----------
    n_clients : int
        K.
    n_workers : int
        W, the worker ranks.
    assignment : {"round_robin", "contiguous"}, default="round_robin"
        ``"round_robin"``: client c on rank 1 + c mod W; ``"contiguous"``: clients cut into
        W consecutive blocks of ``numpy.array_split`` sizes, block w on rank w + 1.

    Returns
    -------
    ndarray of int64, shape (K,)
        The rank of each client.
    """
    if assignment == "round_robin":
        return 1 + np.arange(n_clients, dtype=np.int64) % n_workers
    if assignment == "contiguous":
        sizes = [len(block) for block in np.array_split(np.arange(n_clients), n_workers)]
        return np.repeat(np.arange(1, n_workers + 1, dtype=np.int64), sizes)
    raise ValueError(f"assignment must be 'round_robin' or 'contiguous', got {assignment!r}")


class MPITransport:
    """The federated rounds over MPI: rank 0 the server, ranks 1..W the clients.

    It runs on Dis-DDSS's wire (:class:`asyncopt.comm.wire.Wire`: numpy buffers, no
    pickles; waits sleep instead of spinning, so more ranks than cores stay usable).
    Messages of a round: Bcast of the header int64 [round, m] (m = -1: stop), Bcast of the
    m participant ids (int64), Bcast of the global vector (float32, P); then every worker,
    for its participants in ascending order, Sends its vector (float32, P, tag 31) and
    [client, n] (int64, tag 32) to rank 0, which receives the participants in ascending
    client order (each worker sends in that order too, so no message waits on a later one).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm, default=None
        The communicator, at least 2 ranks; None: ``MPI.COMM_WORLD``.
    assignment : {"round_robin", "contiguous"}, default="round_robin"
        How clients map to worker ranks (:func:`client_ranks`).

    Attributes
    ----------
    is_server : bool
        Whether this rank is rank 0.
    rank : int
        This rank.
    size : int
        The communicator's size, W + 1.
    wire : asyncopt.comm.wire.Wire
        The wire, which counts this rank's bytes.
    """

    def __init__(self, comm=None, assignment="round_robin"):
        from mpi4py import MPI

        from ..comm.wire import Wire
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if self.size < 2:
            raise ValueError("MPITransport needs at least 2 ranks (a server and a worker)")
        client_ranks(0, 1, assignment)              # rejects an unknown assignment now
        self.assignment = assignment
        self.is_server = self.rank == 0
        self.wire = Wire(self.comm)
        self.n_clients = self.vector_size = None

    @property
    def wire_bytes_sent(self):
        """Bytes this rank put on the wire, headers included.

        A Bcast counts once per worker rank on rank 0.
        """
        return self.wire.sent

    @property
    def wire_bytes_received(self):
        """Bytes this rank took off the wire, headers included.
        """
        return self.wire.received

    def start(self, n_clients, vector_size):
        """Prepare a run: record K and P and assign the clients to ranks.

        Parameters
        ----------
        n_clients : int
            K.
        vector_size : int
            P.
        """
        self.n_clients, self.vector_size = int(n_clients), int(vector_size)
        self.client_rank = client_ranks(n_clients, self.size - 1, self.assignment)

    def rank_of(self, clients):
        """Return the worker rank of each client.

        Parameters
        ----------
        clients : array-like of int
            Client ids.

        Returns
        -------
        ndarray of int64
            Their ranks.
        """
        return self.client_rank[np.asarray(clients, dtype=np.int64)]

    def exchange(self, round_index, clients, vector, run_client):
        """Run the server side of one round.

        ``run_client`` runs on the workers, not here.

        Parameters
        ----------
        round_index : int
            The round r.
        clients : array-like of int
            The participants.
        vector : ndarray of float32
            The global vector w_r.
        run_client : callable
            Unused on the server.

        Yields
        ------
        tuple
            ``(client, vector, n)`` per participant, in ascending client order.
        """
        clients = np.sort(np.asarray(clients, dtype=np.int64))
        self.wire.bcast(np.array([round_index, len(clients)], dtype=np.int64))
        self.wire.bcast(clients)
        self.wire.bcast(np.ascontiguousarray(vector, dtype=np.float32))
        buf = np.empty(self.vector_size, dtype=np.float32)
        count = np.empty(2, dtype=np.int64)
        for client, rank in zip(clients, self.rank_of(clients)):
            self.wire.recv(buf, int(rank), TAG_VECTOR)
            self.wire.recv(count, int(rank), TAG_COUNT)
            if count[0] != client:
                raise RuntimeError(f"rank {rank} replied for client {count[0]}, "
                                   f"expected {client}")
            yield int(client), buf.copy(), int(count[1])

    def serve(self, run_client):
        """Run the worker side: this rank's participants every round until the server stops.

        Parameters
        ----------
        run_client : callable
            ``run_client(client, vector, round) -> (vector, n)``.
        """
        vector = np.empty(self.vector_size, dtype=np.float32)
        while True:
            header = self.wire.bcast(np.empty(2, dtype=np.int64))
            round_index, m = int(header[0]), int(header[1])
            if m < 0:
                return
            clients = self.wire.bcast(np.empty(m, dtype=np.int64))
            self.wire.bcast(vector)
            for client in clients[self.rank_of(clients) == self.rank]:
                reply, n = run_client(int(client), vector, round_index)
                self.wire.send(np.ascontiguousarray(reply, dtype=np.float32), 0, TAG_VECTOR)
                self.wire.send(np.array([client, n], dtype=np.int64), 0, TAG_COUNT)

    def close(self):
        """Tell the workers to stop (server side).
        """
        if self.is_server:
            self.wire.bcast(np.array([-1, -1], dtype=np.int64))

    def abort(self):
        """End every rank after a failure (:func:`asyncopt.comm.wire.abort_all_ranks`).
        """
        abort_all_ranks(self.comm, "asyncopt.deep.federated")


@dataclass
class FederatedResult:
    """What :func:`run_federated` returns.

    Parameters
    ----------
    vector : ndarray of float32 or None
        The final global vector (None on worker ranks).
    history : list of dict, default=[]
        One record per round (see :func:`run_federated`); empty on worker ranks.
    is_server : bool, default=True
        Whether this is the server's result.
    """
    vector: object
    history: list = field(default_factory=list)
    is_server: bool = True

    @property
    def bytes_sent(self):
        """Protocol bytes the server sent over the whole run, 4 P m per round.
        """
        return self.history[-1]["bytes_sent_total"] if self.history else 0

    @property
    def bytes_received(self):
        """Protocol bytes the server received over the whole run, 4 P m per round.
        """
        return self.history[-1]["bytes_received_total"] if self.history else 0


def _format_round(record, rounds, n_clients, label):
    parts = [label, f"round {record['round'] + 1:>3}/{rounds}",
             f"clients {len(record['participants'])}/{n_clients}",
             f"sent {format_bytes(record['bytes_sent'])} "
             f"recv {format_bytes(record['bytes_received'])}",
             f"total {format_bytes(record['bytes_sent_total'])} "
             f"/ {format_bytes(record['bytes_received_total'])}"]
    metric = record.get("metric")
    if isinstance(metric, dict):
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                  for k, v in metric.items()]
    elif metric is not None:
        parts.append(f"metric {metric:.4g}" if isinstance(metric, float) else f"metric {metric}")
    parts.append(f"{record['time']:.2f} s")
    return " | ".join(parts)


def run_federated(model, local_train, n_clients, rounds, *, client_fraction=1.0, seed=0,
                  transport=None, evaluate=None, buffers=True, trainable_only=False,
                  verbose=True, label="fedavg"):
    """Run synchronous FedAvg rounds (the protocol of the module docstring).

    Round r: the server samples m = max(1, round(client_fraction * K)) clients and sends
    each w_r; client i trains locally and replies with w_r^i and n_i; the server sets
    w_{r+1} = sum_i n_i w_r^i / sum_i n_i (McMahan et al. 2017; in float64, an empty client
    weighs 0, and w_{r+1} = w_r when all are empty).

    Parameters
    ----------
    model : torch.nn.Module
        The global model on the server (its current values are w_0) and the client model on
        MPI worker ranks (the same architecture on every rank).
    local_train : callable
        ``local_train(model, client, round) -> n_samples`` trains in place (see
        :class:`LocalTrainer`).
    n_clients : int
        K.
    rounds : int
        Rounds to run.
    client_fraction : float, default=1.0
        The participating fraction per round, in (0, 1].
    seed : int, default=0
        Seed of the client sampling (``numpy.random.default_rng(seed)``).
    transport : InProcessTransport or MPITransport, default=None
        None: :class:`InProcessTransport`; with :class:`MPITransport`, call this on every
        rank.
    evaluate : callable, default=None
        ``evaluate(model) -> float | dict``, run on the server after each round with the
        new global values loaded.
    buffers : bool, default=True
        The vector includes the floating-point buffers.
    trainable_only : bool, default=False
        The vector holds only the parameters with ``requires_grad`` (LoRA adapters and
        head), so P and the byte counts are those of the tuned part.
    verbose : bool, default=True
        One line per round on stderr.
    label : str, default="fedavg"
        The label of the progress lines.

    Returns
    -------
    FederatedResult
        On the server: the final vector and one record per round: ``round`` (0-based),
        ``participants``, ``n_samples``, ``weights`` (n_i / sum_j n_j), ``bytes_sent`` and
        ``bytes_received`` (4 P m each), ``bytes_sent_total`` and ``bytes_received_total``
        (cumulative), ``time`` (seconds since the start) and ``metric`` when ``evaluate`` is
        given; the model ends holding the final global vector. On a worker rank:
        ``vector=None``, an empty history, ``is_server=False``.
    """
    transport = transport if transport is not None else InProcessTransport()
    flat = ParameterVector(model, buffers=buffers, trainable_only=trainable_only)

    def run_client(client, vector, round_index):
        flat.set(vector)
        n = local_train(model, client, round_index)
        return flat.get(), int(n)

    transport.start(n_clients, flat.size)
    try:
        if not transport.is_server:
            transport.serve(run_client)
            return FederatedResult(vector=None, history=[], is_server=False)
        return _serve_rounds(model, flat, run_client, n_clients, rounds, client_fraction,
                             seed, transport, evaluate, verbose, label)
    except BaseException:
        transport.abort()
        raise


def _serve_rounds(model, flat, run_client, n_clients, rounds, client_fraction, seed,
                  transport, evaluate, verbose, label):
    """The server's side of :func:`run_federated`: sample, exchange, average, record."""
    rng = np.random.default_rng(seed)
    vector = flat.get()
    history, sent_total, received_total = [], 0, 0
    start = time.perf_counter()
    for r in range(rounds):
        clients = sample_clients(rng, n_clients, client_fraction)
        total = np.zeros(flat.size, dtype=np.float64)
        weight, counts = 0, []
        for client, reply, n in transport.exchange(r, clients, vector, run_client):
            counts.append(n)
            if n > 0:
                total += n * reply.astype(np.float64)
                weight += n
        if weight > 0:
            vector = (total / weight).astype(np.float32)
        flat.set(vector)
        sent = received = flat.nbytes * len(clients)
        sent_total += sent
        received_total += received
        record = {"round": r, "participants": [int(c) for c in clients],
                  "n_samples": counts, "weights": aggregation_weights(counts),
                  "bytes_sent": sent, "bytes_received": received,
                  "bytes_sent_total": sent_total, "bytes_received_total": received_total}
        if evaluate is not None:
            record["metric"] = evaluate(model)
        record["time"] = time.perf_counter() - start
        history.append(record)
        if verbose:
            print(_format_round(record, rounds, n_clients, label), file=sys.stderr,
                  flush=True)
    transport.close()
    return FederatedResult(vector=vector, history=history, is_server=True)
