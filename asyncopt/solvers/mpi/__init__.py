"""Dis-DDSS: DDSS under MPI, a parameter server and its workers (thesis Algorithms 5, 6;
docs/design.md §3).

Rank 0 is the server: ``ddss.Driver``, the outer loop every backend shares, runs on it
over ``server.ServerBackend``; it holds x on the active set, the column statistics and
the history, and decides. Ranks 1..l are workers (``worker.run_worker``): each holds its
own contiguous shard of the rows (an ActiveSet of a Problem on those rows), never the
whole data set, and executes what the server's control word says. Outer iteration:
synchronous collectives (``protocol``; root-centred on an oversubscribed node, see
``comm.wire.Wire``); inner epoch: asynchronous deltas and replies (``inner``); the
second-order step: the workers' Hessian shares or products (``newton``); the
working-set step: the workers' Gram shares, the server's coordinate descent
(``working_set``).

No rank busy-polls (``comm.wire``), so runs with more ranks than cores stay usable; on
one node the messages and the outer iteration's vectors go through a shared-memory
window (``comm.channels``). What the driver does differently here is named in its
Settings: every epoch is checked against its snapshot (``reject_worse_epochs``: summed
stale deltas can overshoot) and the server checkpoints every outer iteration.
"""
import numpy as np

from ...comm.channels import open_channel
from ...comm.wire import Wire
from ...runtime import blas_threads, blas_threads_beside, check_switch, in_small_pages
from ...losses import loss_of_code
from ..ddss import Driver, Settings, SolverResult
from ..methods import check_elastic_net
from .inner import HEADER, REPLY_HEADER, default_batch
from .protocol import ShardStatistics, close_channel, distributed_lam_max
from .server import ServerBackend, load_server_kernels
from .worker import Shard, run_worker
from .working_set import supports as working_set_supports

__all__ = ["solve_mpi", "distributed_lam_max", "load_server_kernels"]


@in_small_pages
def solve_mpi(comm, problem, penalty, n_features, loss_code, lam, fit_intercept, *,
              tol=1e-4, max_epochs=200, screening=True, variance_reduced=True, batch=None,
              step_scale=1.0, checkpoint=None, saga=False, dense=False,
              random_state=None, verbose=0, label="ddss", max_time=None, transport=None,
              support_newton=True, coef_init=None, intercept_init=0.0, inner="svrg"):
    """Dis-DDSS on ``comm`` (rank 0 the server, the others workers). Every rank calls it;
    ``problem`` is the worker's Problem on its own rows (None on the server). Returns the
    SolverResult on every rank (coef broadcast once at the end; the history on rank 0).

    checkpoint: a .npz path the server rewrites atomically after every outer iteration
    and when interrupted (coef, intercept, lam, history); a run that finds it resumes
    from it (a crashed or killed job loses at most one epoch).
    coef_init, intercept_init: a warm start (the server's are used; it broadcasts them),
    as in ``ddss.solve_ddss``: it takes precedence over a checkpoint; the relative gap
    stays relative to P(0).
    saga / dense: the ProxASAGA / ProxASVRG baselines on the same server (with
    screening=False): SAGA keeps each row's gradient memory on its worker and sums the
    average exactly over the shards every epoch; ProxASVRG takes dense steps.
    batch: local steps per message (default ``inner.default_batch``).
    transport: how the inner loop's messages travel (``comm.channels.open_channel``):
    "auto" (a shared-memory window when every rank is on one node, MPI messages
    otherwise), "shared" or "messages"; None reads ASYNCOPT_MPI_TRANSPORT (default auto).
    support_newton: the second-order step on the support (``newton``; L1 and group
    penalties; the baselines run without it).
    inner: "svrg" (the asynchronous prox-SVRG epochs), "working_set" (the working-set
    step, ``working_set``: the L1 penalty only; a ValueError on every rank otherwise)
    or "auto" (``choice.InnerChoice`` between the two for the L1 penalty, else
    "svrg")."""
    if inner not in ("svrg", "working_set", "auto"):
        raise ValueError(f"inner must be 'svrg', 'working_set' or 'auto', not {inner!r}")
    if saga or dense:
        check_elastic_net("prox_asaga" if saga else "prox_asvrg", penalty)
    reason = working_set_supports(loss_of_code(loss_code), penalty)
    if inner == "working_set" and reason is not None:
        raise ValueError(reason)
    if inner == "auto" and reason is not None:
        inner = "svrg"
    check_switch()
    wire = Wire(comm)
    rank, size = wire.rank, comm.Get_size()
    if size < 2:
        raise ValueError("the mpi backend needs at least 2 ranks (1 server + workers)")
    server = rank == 0
    if server and wire.oversubscribed:
        wire.spin = 0.0     # the server sleeps while it waits (comm.wire)
    p = n_features
    channel = open_channel(comm, wire, p, HEADER, REPLY_HEADER, transport)
    if channel.rings:       # a crowded node: waits sleep on doorbells (comm.wire)
        wire.spin = 0.0
    # on one node the outer iteration's vectors go through the channel's window too
    wire.attach(channel.collectives)
    active = None if server else problem.full_active_set()
    folded = fit_intercept and loss_of_code(loss_code).quadratic
    stats = ShardStatistics(wire, active, penalty, p, fit_intercept, folded)
    if stats.fewest < 1:
        close_channel(wire, channel)
        raise ValueError(f"more workers ({size - 1}) than rows ({stats.n}): every worker "
                         "needs at least one row")
    # the server answers late where the node is oversubscribed and its waits poll
    batch = default_batch(stats.n, size - 1, wire.oversubscribed and not channel.rings) \
        if batch is None else int(batch)
    flags = (variance_reduced, saga, dense)
    if server:
        settings = Settings(tol=tol, max_epochs=max_epochs, screening=screening,
                            variance_reduced=variance_reduced, saga=saga, dense=dense,
                            support_newton=support_newton, step_scale=step_scale,
                            max_time=max_time, checkpoint=checkpoint,
                            checkpoint_interval=0.0, reject_worse_epochs=True,
                            verbose=verbose, label=label, inner=inner)
        backend = ServerBackend(wire, channel, stats, penalty, p, loss_code, lam,
                                fit_intercept, batch, flags)
        result = Driver(backend, settings, coef_init, intercept_init).run()
    else:
        rng = np.random.default_rng(None if random_state is None
                                    else [int(random_state), rank])
        # one BLAS thread per core a rank has on its node (``runtime.blas_threads``)
        with blas_threads(blas_threads_beside(wire.local_ranks)):
            blocks = run_worker(wire, channel, Shard(active, penalty, p), stats,
                                loss_code, lam, fit_intercept, flags, rng, batch,
                                checkpoint)
    coef = wire.bcast(result.coef if server else np.zeros(p))
    summary = wire.bcast(np.array(
        [result.intercept, float(result.converged), result.primal, result.dual,
         result.gap, float(result.n_iter)] if server else np.zeros(6)))
    close_channel(wire, channel)
    if server:
        result.coef = coef
        return result
    return SolverResult(coef, float(summary[0]), int(summary[5]), float(summary[2]),
                        float(summary[3]), float(summary[4]),
                        penalty.active_features(blocks), bool(summary[1]), [])
