"""Dis-DDSS: the MPI parameter server (thesis Algorithms 5 and 6, DESIGN 3).

Rank 0 is the server: it holds x on the active set, the active set and the history, and
only adds the deltas workers send. Ranks 1..l are workers: each holds its own shard of the
rows (an ActiveSet of a Problem on those rows) and never the whole data set.

Outer iteration (synchronous, collectives on the communicator, the server contributing
zeros to the sums; root-centred on an oversubscribed node, see ``wire.Wire``):
  1. broadcast [b, x], only where the workers do not hold it already (after a resume from
     a checkpoint, after a rejected epoch): every rank starts at x = 0, b = 0, and each
     inner loop ends with every worker holding exactly the server's x and b
     (``_serve_inner``);
  2. refit the intercept: logistic loss, Newton steps on the reduced sums of f' and f'';
     squared loss, b += sum(y - z) / n with no round of its own: step 3's sums at the old
     b give the server the shift and the sums at the new one (``fold_intercept_shift``),
     and the workers get the shift with step 4's broadcast;
  3. reduce [sum f, sum rho, A^T rho] to the server, which forms the dual scaling s;
     logistic loss: it broadcasts s and they reduce sum f*(-rho / s); squared loss: the
     same reduction carried sum rho^2 and sum y rho, from which the server has that sum
     at any s (``squared_conjugate_sum``), so there is no second round. The server has
     P, D and the gap, and stops on the gap at the best dual point so far
     (``screening.BestDual``: G = P - the largest D);
  4. the server decides (stop, screen, step), broadcasts [status, number of blocks removed,
     the intercept's shift] and, when there are any, their positions among the active
     blocks, then the epoch's anchor, the reweighted full gradient (under DDSS only where
     x is not a zero, or a zero block, that the epoch freezes,
     ``_anchor_without_optimal_zeros``); every worker compacts its shard. As in the
     serial solver (``ddss.worth_compacting``), the blocks the test removes are dropped
     only once they hold 5% of the stored non-zeros or half the features: a compaction is
     a pass over every shard;
  5. after an epoch that cut the certified gap by less than half, the support Newton
     step instead of an epoch (``_support_newton``: the workers reduce the Hessian on the
     non-zeros of x, or its products with the vectors of the server's CG, and their
     losses at the candidate steps; for a group penalty the Hessian, or above
     MAX_SUPPORT coordinates its diagonal blocks and products from the rows,
     ``group_newton.py``), then a new certificate; a full step that left violating zeros
     is followed at once by another (``StallWatch.should_chain``).
Inner loop (asynchronous): a worker runs ``batch`` sparse prox-SVRG steps on its copy of x
(kernels/svrg.py; under DDSS the zeros of x, or zero blocks, that are optimal at the
epoch's anchor stay frozen, ``ddss.freeze_optimal_zeros``), sends the sparse delta (int32
indices, or their bitmap once it is shorter, and float64 values with a header [version,
steps, intercept delta, last]) and waits for the reply: the coordinates of x that changed
since its previous reply, less those only this worker changed, with weight 1 (indices or
bitmap + float64 values with [control, version, b, full]; the whole x instead when that is
smaller), so replies shrink with the active set and the sparsity of the deltas; the server
applies deltas in arrival order (each side's vector work per message is one pass of
comm/messages.py; under DDSS with an L1 penalty a sum that takes a coordinate across
zero leaves it at zero, ``_serve_inner``). Each worker makes exactly one pass over its
shard per epoch (its rows in a fresh chunked random order) and flags its last delta, which
the server answers with "stop" once every worker has sent its own: every row is visited
once per epoch, as in the serial solver. (Ending the epoch after n steps in total instead
let fast workers revisit their rows while slow ones skipped theirs; on oversubscribed cores
that biased the reweighted estimate and 3-4 workers stalled at a gap of 1e-3. Tried again
at 2 workers on 2 cores, where a worker through its shard waits 25-175 ms a run for the
other (CTR 200,000 x 100,000 at -n 3): no faster over 20 paired runs (epochs 1.00x, time to
1e-6 1.09x; the epochs came out ~5% longer), and at -n 9 7-8 epochs to the Newton step
against 5. Nor did the last worker skip the rest of its pass once the others were
through, told to send the batch in hand as its last, with no worker revisiting rows: at
-n 3 on 2 cores median ratio 0.90 over 8 paired seeds, at -n 9 0.98; the Newton step
came 1-2 epochs later in 5 of the 16 runs, never sooner.)
Staleness tau = server version at apply - version the worker computed on.

Workers send while they compute: a worker posts its delta, then runs its next batch while
the delta and its reply travel, so one round trip hides behind one batch. The messages go
through ``channels.py``: a shared-memory window when every rank is on one node (neither
side has to be inside MPI for a message to move), MPI messages across nodes.

The server sums deltas (as Hogwild sums updates) with two weights: ``overshoot_weights``
caps the summed move of a coordinate that one batch already moves most of the way to its
minimum (the intercept, the most popular features: l such deltas side by side overshoot
and, past twice the way, diverge), and ``staleness_damping`` scales a delta computed more
than l versions ago by (l / tau)^k: k = 1 until an epoch ends with a larger gap than it
started with, then adapted per epoch (``adapt_damping_power``: up after such an epoch,
down after a calm stretch, 2 <= k <= 4). CTR 20,000 x 10,000 at 1e-3 lam_max, 1 worker
34 epochs: 2 and 4 workers need 35-37 and ~55 epochs; with the former weights (average
wherever a batch likely touches the coordinate) they needed 80 and 154.
As a safeguard the server keeps the snapshot of each inner loop and, when
the next certificate shows P above P(snapshot) + G(snapshot) (so above P* + 2 G), rejects
the epoch: x returns to the snapshot and every rank first halves the move cap (down to
MIN_MOVE_CAP), then the step, for the rest of the run.

Hot-path messages are numpy buffers (in a shared-memory window, or Isend / Irecv), never
pickles. No rank busy-polls: a wait checks for at most 1 ms, giving its core to any rank
that computes on it after every check (``sched_yield``), then sleeps between checks (50 us
growing to 0.2 ms; ``comm/wire.py``, shared with the torch bridge's MPI protocols), so
runs with more ranks than cores stay usable. On a node with more ranks than cores the
server's waits sleep from the start (``Wire.spin`` = 0): it waits while the workers
compute, mostly for deltas whose replies the workers do not wait for (they compute the
next batch meanwhile), and each check of a spin is a time slice a worker on its core loses.
CTR 200,000 x 100,000 at -n 3 on 2 cores: the server's CPU time 0.10-0.13 -> 0.07-0.11 s
of a 0.23-0.34 s solve, the solve's median 0.279 -> 0.259 s over 10 interleaved runs
(another 6 in a noisier hour: no difference; benchmarks/README.md, bench_wire).
On a crowded node (``Wire.crowded``: 2 ranks per core or more) every rank's waits in the
shared window sleep on a doorbell (``wire.Doorbell``, a futex the poster rings) with no
spin at all: there a waiting worker's spin mostly took slices from the ranks on its core,
and a sleep of 50-200 us between checks came late. CTR at -n 9 on 2 cores, medians of
blocks of 6-8 interleaved runs: 0.609 / 0.585 / 0.605 s before, 0.545 / 0.500 / 0.531 /
0.533 s with doorbells and no spin; doorbells with the workers' 1 ms spin 0.617 s, no
spin without doorbells 0.565 s; -n 5 0.332 -> 0.312 s and 0.338 -> 0.332 s. At -n 3
(1.5 ranks per core) a worker's spin still paid: 0.257 s with it against 0.295 s without
(8 each), so there nothing changed (benchmarks/README.md, bench_wire's doorbell section).
"""
import contextlib
import os
import signal
import sys
import threading
import time

import numpy as np

from ..cores import blas_threads, blas_threads_beside, in_small_pages
from ..kernels.linalg import csr_rmatvec, touch_lower_triangle, touch_pages
from ..comm.messages import (ChangeLog, add_weighted_delta, apply_reply, bitmap_words,
                                decode_index, encode_index, index_length, take_delta,
                                write_index)
from ..kernels.svrg import (dense_svrg_epoch, saga_epoch_group, saga_epoch_l1,
                            svrg_epoch_group, svrg_epoch_l1)
from ..losses import (LOGISTIC, SQUARED, derivative_sums, generalized_residual, mean_loss,
                      mean_neg_conjugate)
from ..problem import dropped_share
from ..screening import BestDual, gap_safe_keep, gap_safe_radius
from ..group_newton import (HESSIAN_FREE_MAX_SUPPORT, entering_groups,
                            group_blocks_length, group_hessian_blocks, group_move,
                            group_support_point, group_uses_hessian_free,
                            hessian_free_group_move)
from ..support_newton import (LINE, STEP_GRID, ReducedHessian, StallWatch, SupportRows,
                              best_candidate, dense_move, entering_coordinates,
                              entering_limit, firm_support, from_upper_triangle,
                              lower_from_upper_triangle,
                              move_candidates, preconditioner_coordinates,
                              preconditioner_size, pruned_coordinates, prunes_for_step,
                              quadratic_trial_sums, shard_slope, support_move,
                              support_point, take_candidate, trial_moves,
                              uses_hessian_free, violating_zeros)
from .checkpoint import load_checkpoint, save_checkpoint
from .ddss import (SolverResult, epoch_rows, l1_prox_svrg, optimal_zeros,
                   prox_svrg_epochs, worth_compacting)
from ..comm.channels import open_channel
from ..comm.wire import Wire, _mpi

MOVE_CAP, MIN_MOVE_CAP = 1.9, 0.45
MAX_DAMPING_POWER, CALM_EPOCHS = 4.0, 4
STOP, INNER, RECERTIFY, REJECT, NEWTON = 0, 1, 2, 3, 4
# where solve_mpi starts: x = 0, coef_init, the checkpoint, or nowhere (unreadable)
START_FRESH, START_WARM, START_RESUME, START_ERROR = 0.0, 1.0, 2.0, 3.0
HEADER = 4          # [version, steps, intercept delta, last] in front of a delta's values
REPLY_HEADER = 4    # [control, version, b, full] in front of a reply's values


CERTIFICATE_SUMS = 4    # the scalars ahead of A^T rho in a certificate's reduction


def squared_conjugate_sum(rho_sq, y_rho, scale):
    """sum_i f*(-theta_i) for the squared loss at theta = rho / scale, from sum rho^2 and
    sum y rho: f*(u) = u^2 / 2 + u y gives sum rho^2 / (2 s^2) - sum y rho / s. The workers
    send both sums in the certificate's one reduction, so the server finds D at any scale
    with no second round (the scale's broadcast and the conjugate's reduction that other
    losses need)."""
    return rho_sq / (2.0 * scale * scale) - y_rho / scale


def fold_intercept_shift(sums, shift, rows, y_sum, column_sums):
    """The certificate's sums [sum f, sum rho, sum rho^2, sum y rho, A^T rho] of the
    squared loss over ``rows`` rows at the intercept b + shift, in place, from those at b:
    every margin rises by the shift and rho_i = y_i - z_i falls by it, so with S = sum rho,
    sum f = sum rho^2 / 2 changes by rows shift^2 / 2 - shift S, sum rho^2 by twice that,
    sum y rho by -shift sum y, S by -rows shift and A^T rho by -shift A^T 1
    (``column_sums``). With shift = S / n over all rows this is the exact refit
    b += sum(y - z) / n, folded into the certificate's one reduction instead of a round
    of its own before it."""
    s = float(sums[1])
    sums[0] += 0.5 * rows * shift * shift - shift * s
    sums[2] += rows * shift * shift - 2.0 * shift * s
    sums[3] -= shift * y_sum
    sums[1] -= rows * shift
    sums[CERTIFICATE_SUMS:] -= shift * column_sums


def _intercept_refit(wire, code, z, y, b, n):
    """The exact intercept optimum over all shards, by Newton steps on the reduced sums of
    f' and f''; z (margins with b) shifted in place. Not for the squared loss, whose
    refit rides in the certificate's reduction (``fold_intercept_shift``)."""
    for _ in range(100):
        grad, hess = wire.allreduce(np.array(derivative_sums(code, z, y))) / n
        if abs(grad) <= 1e-13:
            break
        step = float(np.clip(grad / max(hess, 1e-12), -5.0, 5.0))
        z -= step
        b -= step
        if abs(step) <= 1e-15 * (1.0 + abs(b)):
            break
    return b


def _save_state(path, penalty, n_features, blocks, x, b, lam, history):
    """Write the checkpoint of x (on the active ``blocks``), b and the history to
    ``path``."""
    save_checkpoint(path, coef=_expand(penalty, n_features, blocks, x), intercept=b,
                    lam=lam, history=history)


def _expand(penalty, n_features, blocks, x):
    """x on the active blocks -> the vector over all n_features (zeros elsewhere)."""
    coef = np.zeros(n_features)
    coef[penalty.active_features(blocks)] = x
    return coef


def _checkpoint_on_sigterm(path, live, history, penalty, n_features, lam):
    """On SIGTERM (a scheduler ending the job, mpirun forwarding a kill) the server writes
    its current x (mid-epoch: a valid iterate) with the history to the checkpoint, then
    exits with status 143; the per-iteration checkpoints stay as they were until then.
    Returns the function that puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_sigterm(signum, frame):
        if "x" in live:
            save_checkpoint(path, coef=_expand(penalty, n_features, live["blocks"], live["x"]),
                            intercept=live["b"], lam=lam, history=history)
        sys.stderr.write(f"asyncopt: terminated; the checkpoint {path} holds the "
                         f"server's x (--resume continues from it)\n")
        sys.stderr.flush()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, previous)


@in_small_pages
def solve_mpi(comm, problem, penalty, n_features, loss_code, lam, fit_intercept, *,
              tol=1e-4, max_epochs=200, screening=True, variance_reduced=True, batch=None,
              step_scale=1.0, checkpoint=None, saga=False, dense=False,
              random_state=None, verbose=0, label="ddss", max_time=None, transport=None,
              support_newton=True, coef_init=None, intercept_init=0.0):
    """Dis-DDSS on ``comm`` (rank 0 the server, the others workers). Every rank calls it;
    ``problem`` is the worker's Problem on its own rows (None on the server). Returns the
    SolverResult on every rank (coef broadcast once at the end).

    checkpoint: a .npz path the server rewrites atomically after every outer iteration
    (coef, intercept, lam, history); a run that finds it resumes from it (a crashed or
    killed job loses at most one epoch).
    coef_init, intercept_init: a warm start (the server's are used; it broadcasts them),
    as in ``ddss.solve_ddss``: it takes precedence over a checkpoint; the relative gap
    stays relative to P(0) (``distributed_null_objective``).

    saga / dense: the ProxASAGA / ProxASVRG baselines on the same server (with
    screening=False): SAGA keeps each row's gradient memory on its worker and sums the
    average exactly over the shards every epoch; ProxASVRG takes dense steps.
    batch: local steps per message (default ``default_batch``).
    transport: how the inner loop's messages travel (``channels.open_channel``): "auto"
    (a shared-memory window when every rank is on one node, MPI messages otherwise),
    "shared" or "messages"; None reads ASYNCOPT_MPI_TRANSPORT (default auto).
    support_newton: after an epoch that cut the gap by less than half, the support Newton
    step (``_support_newton``; L1 and group penalties; the baselines run without it)."""
    from ..progress import ProgressLine

    start = time.perf_counter()
    wire = Wire(comm)
    rank, size = wire.rank, comm.Get_size()
    if size < 2:
        raise ValueError("the mpi backend needs at least 2 ranks (1 server + workers)")
    server = rank == 0
    if server and wire.oversubscribed:
        wire.spin = 0.0     # see the module docstring: the server sleeps while it waits
    p = n_features
    channel = open_channel(comm, wire, p, HEADER, REPLY_HEADER, transport)
    if channel.rings:       # a crowded node: see the module docstring
        wire.spin = 0.0
    # on one node the vectors of the set-up and of every outer iteration go through the
    # channel's window too, up to the final broadcasts (MPI's messages of an
    # oversubscribed node move only while both sides are inside MPI; CTR at -n 9 on 2
    # cores, median solve 0.424 s before against 0.392 s, 8 paired)
    wire.attach(channel.collectives)
    active = None if server else problem.full_active_set()
    local_rows = 0 if server else active.y.shape[0]
    row_sq = np.zeros(0) if server else active._row_sq_norms
    local_y_sum = 0.0 if server else float(np.sum(active.y))    # compactions keep the rows
    # [rows, sum ||a_i||^2, stored entries, sum y] summed, [-rows (workers), max ||a_i||^2]
    # maxed
    n, sq_total, nnz_total, y_total = wire.allreduce(np.array(
        [float(local_rows), row_sq.sum(), 0.0 if server else float(active.nnz),
         local_y_sum]))
    n = int(n)
    fewest, max_row_sq = wire.allreduce(np.array(
        [-np.inf if server else -float(local_rows), row_sq.max(initial=0.0)]), _mpi().MAX)
    fewest, max_row_sq = -fewest, float(max_row_sq)
    if fewest < 1:
        _close_channel(wire, channel)
        raise ValueError(f"more workers ({size - 1}) than rows ({n}): every worker needs "
                         "at least one row")
    # only the server uses the column norms (overshoot weights, the screening test) and
    # the stored non-zeros per column (the compaction rule); counts travel as int32, and
    # an L1 penalty's rows per block are its column counts
    count = np.int32 if n < 2 ** 31 else np.int64
    # squared loss: the intercept's refit rides in the certificate's reduction
    # (``fold_intercept_shift``), for which the server needs A^T 1 as well
    folded = fit_intercept and loss_code == SQUARED
    stats = wire.reduce(np.empty((1 + folded) * p) if server else np.concatenate(
        (active.column_sq_norms,) + ((active.column_sums,) if folded else ())),
        root_blank=True)
    column_sq, column_sums = (stats[:p], stats[p:] if folded else None) if server else \
        (None, None)
    block_rows = wire.allreduce(np.zeros(penalty.n_blocks, dtype=count) if server
                                else active.block_row_counts.astype(count))
    if penalty.is_l1:
        column_counts = block_rows if server else None
    else:
        column_counts = wire.reduce(np.empty(p, dtype=count) if server
                                    else active.column_counts.astype(count),
                                    root_blank=True)
    intercept_sq = (sq_total / nnz_total if nnz_total else 1.0) if fit_intercept else 0.0
    blocks = np.arange(penalty.n_blocks)
    pen = penalty.restricted(blocks)
    x = np.zeros(pen.ids.shape[0])
    b = 0.0
    rng = np.random.default_rng(None if random_state is None
                                else [int(random_state), rank])
    history, epoch, converged, reference = [], 0, False, None
    time_offset = 0.0
    first_epoch = 0
    resuming = False
    # where the server starts: [START_*, the last recorded epoch] on every rank, all that
    # the workers need of a checkpoint (its x and b reach them with the first outer
    # iteration's state); one float64 broadcast instead of the pickled checkpoint
    origin, saved, unreadable = np.array([START_FRESH, 0.0]), None, None
    if server and coef_init is not None:
        origin[0] = START_WARM
    elif server and checkpoint is not None and os.path.exists(checkpoint):
        try:
            coef0, b0, _, saved = load_checkpoint(checkpoint, p, lam)
        except ValueError as exc:
            origin[0], unreadable = START_ERROR, exc
        else:
            if saved:
                origin[:] = START_RESUME, saved[-1]["epoch"]
    origin = wire.bcast(origin)
    if origin[0] == START_ERROR:
        _close_channel(wire, channel)
        raise unreadable if server else ValueError(
            f"the server could not read the checkpoint {checkpoint}")
    warm = origin[0] == START_WARM
    if warm:
        reference = distributed_null_objective(
            wire, None if server else active.y, n, loss_code, fit_intercept)
        if server:
            x = np.asarray(coef_init, dtype=np.float64)[penalty.active_features(blocks)]
            b = float(intercept_init) if fit_intercept else 0.0
    elif origin[0] == START_RESUME:
        resuming = True
        if server:
            x, b, history = coef0[penalty.active_features(blocks)].copy(), b0, saved
            reference = history[0]["primal"]
            time_offset = history[-1]["time"]
        epoch = int(origin[1]) + 1
    first_epoch = epoch
    best = BestDual() if server else None   # the run's certified G = P - the largest D
    watch = StallWatch(None if penalty.is_l1 else HESSIAN_FREE_MAX_SUPPORT) \
        if server and support_newton and not saga else None
    newton_from, newton_t = None, 0.0     # the gap a Newton step started from, its t
    newton_products = 0                   # the Hessian products the step took (server)
    # the server's wall seconds in the inner loop and the Newton step since the last
    # record (the record's inner_s and newton_s; certificate_s is timed in the loop)
    phases = {"inner_s": 0.0, "newton_s": 0.0}
    firm = None       # the server's firm support of x (``firm_support``), for the watch
    # the sum the last step reduced, on every rank (its ids; its matrix on the server)
    reduced = ReducedHessian() if loss_code == SQUARED else None
    freezing = prox_svrg_epochs(variance_reduced, saga, dense)
    if freezing and not server:
        active.touch_view_buffers()     # on whatever core idles before the first view
    l1_epochs = l1_prox_svrg(penalty, variance_reduced, saga, dense)
    snapshot, step_factor, move_cap = None, 1.0, MOVE_CAP
    # per active set (rebuilt after a compaction): the server's ||A_g||, and the
    # reweighting d per block and per feature
    block_column_norms = reweighting = None
    damping_power, calm = 1.0, 0
    memory = None
    clock, stale = np.zeros(1, dtype=np.int64), np.zeros(2, dtype=np.int64)
    steps_total, staleness = 0, (0.0, 0)
    messages, message_bytes = 0, 0
    progress = ProgressLine(verbose if server else 0, label=label)
    live = {}     # the server's current x, b and active blocks, for a SIGTERM checkpoint
    restore_handler = None
    if server and checkpoint is not None:
        restore_handler = _checkpoint_on_sigterm(checkpoint, live, history, penalty, p, lam)
    in_sync = not (resuming or warm)   # whether every worker holds the server's x and b
    # the server answers late where the node is oversubscribed and its waits poll
    batch = default_batch(n, size - 1, wire.oversubscribed and not channel.rings) \
        if batch is None else int(batch)
    # one BLAS thread per core a rank has on its node: spinning BLAS pools take the cores
    # the ranks compute on (``cores.blas_threads``)
    blas = contextlib.ExitStack()
    blas.enter_context(blas_threads(blas_threads_beside(wire.local_ranks)))
    try:
        while True:
            certificate_start = time.perf_counter()
            if not in_sync:
                state = wire.bcast(np.concatenate(([b], x)))
                b, x = float(state[0]), state[1:].copy()
                in_sync = True
            if server:
                z = np.zeros(0)
                y = np.zeros(0)
            else:
                z = active.margins(x, b)
                y = active.y
            if fit_intercept and not folded:
                b = _intercept_refit(wire, loss_code, z, y, b, n)
            rho = generalized_residual(loss_code, z, y, np.empty_like(z))
            # [sum f, sum rho, sum rho^2, sum y rho, A^T rho]
            local = (np.empty if server else np.zeros)(CERTIFICATE_SUMS + x.shape[0])
            if not server:
                local[0] = mean_loss(loss_code, z, y) * z.shape[0]
                local[1] = np.sum(rho)
                if loss_code == SQUARED:
                    local[2], local[3] = rho @ rho, y @ rho
                local[CERTIFICATE_SUMS:] = active.residual_correlation_at(x, loss_code, b,
                                                                          rho)
            total = wire.reduce(local, root_blank=True)
            # A^T rho over the server's all rows, a worker's own (a Newton step's trials)
            correlation = (total if server else local)[CERTIFICATE_SUMS:]
            scale = np.zeros(1)
            if server and folded:       # the workers shift theirs on the control's word
                shift = float(total[1]) / n
                fold_intercept_shift(total, shift, n, y_total, column_sums)
                b += shift
            if server:
                block_corr = pen.block_norms(correlation)
                dual_norm = float(np.max(block_corr / pen.weights, initial=0.0))
                scale[0] = max(1.0, dual_norm / (n * lam))
            if loss_code == SQUARED:
                scale = float(scale[0])
                conj_total = None if not server else \
                    [squared_conjugate_sum(total[2], total[3], scale)]
            else:
                scale = float(wire.bcast(scale)[0])
                conj = np.array([0.0 if server or not z.shape[0] else
                                 -mean_neg_conjugate(loss_code, rho / scale, y) * z.shape[0]])
                conj_total = wire.reduce(conj)
            control = np.zeros(3)     # [status, blocks removed, the intercept's shift]
            if server:
                primal = total[0] / n + lam * pen.value(x)
                dual = -conj_total[0] / n
                # gap: at x's own dual point (the screening, the damping and the
                # rejection follow it); certified: at the best point so far (the stop,
                # the record)
                gap = max(primal - dual, 0.0)
                best.offer(dual)
                certified = best.gap(primal)
                if reference is None:     # P at x = 0 (the first record) is P(0)
                    reference = primal
                churn = None      # changes of x's firm support over the last epoch
                groups = pen.group_indptr
                firm = None if watch is None else firm_support(x, correlation, n, lam,
                                                               pen.weights, groups)
                if snapshot is not None:
                    damping_power, calm = adapt_damping_power(damping_power, calm,
                                                              gap > snapshot[3])
                    if watch is not None:
                        churn = int(np.count_nonzero(snapshot[4] != firm))
                now = time.perf_counter() - start
                record = {"epoch": epoch, "time": time_offset + now, "primal": primal,
                          "dual": best.dual, "dual_at_x": dual, "gap": certified,
                          "rel_gap": certified / reference if reference > 0 else 0.0,
                          "n_active": x.shape[0], "n_features": p,
                          "active_nnz": None, "coef_nnz": int(np.count_nonzero(x)),
                          "inner_steps": steps_total,
                          "bytes_sent": wire.sent, "bytes_recv": wire.received,
                          "staleness_mean": staleness[0], "staleness_max": staleness[1],
                          "messages": messages, "message_bytes": message_bytes,
                          "intercept": b, "step_factor": step_factor,
                          "move_cap": move_cap, "damping_power": damping_power,
                          "newton_step": newton_t, "newton_products": newton_products,
                          "support_changes": churn,
                          "transport": channel.name, "batch": batch,
                          "certificate_s": time.perf_counter() - certificate_start,
                          **phases}
                phases = dict.fromkeys(phases, 0.0)
                history.append(record)
                progress.update(record)
                keep = np.ones(pen.n_blocks, dtype=bool)
                if certified <= tol * reference:
                    converged, status = True, STOP
                elif epoch - first_epoch >= max_epochs or \
                        (max_time is not None and now >= max_time):
                    status = STOP
                elif snapshot is not None and not primal <= snapshot[2] + snapshot[3]:
                    status = REJECT
                else:
                    status = INNER
                    if screening:
                        radius = gap_safe_radius(n, _lipschitz(loss_code), gap, primal)
                        if block_column_norms is None:      # per active set
                            block_column_norms = np.sqrt(np.add.reduceat(
                                column_sq, pen.indptr[:-1])) if x.shape[0] else np.zeros(0)
                        # x's own sphere only: with the best point's sphere as well, CTR
                        # 20,000 x 10,000 at -n 9 compacted earlier and then took
                        # 643-1,237 epochs against 88-183 (not understood; both are safe)
                        keep = gap_safe_keep(block_corr, scale, radius, block_column_norms,
                                             n, lam, pen.weights)
                        if keep.all():
                            pass
                        elif not worth_compacting(*dropped_share(column_counts,
                                                                 pen.indptr, keep)):
                            keep[:] = True
                        elif np.any(x[~np.repeat(keep, np.diff(pen.indptr))] != 0):
                            status = RECERTIFY
                    if watch is not None:
                        if newton_from is not None:
                            watch.tried(epoch, newton_from, certified)
                            newton_from = None
                            if status == INNER and watch.should_chain(
                                    newton_t, violating_zeros(
                                        x, correlation, n, lam, pen.weights,
                                        groups)[0].shape[0]):
                                status, newton_from = NEWTON, certified
                        elif status == INNER and watch.should_try(
                                epoch, certified, int(np.count_nonzero(firm)), churn,
                                tol * reference, prunes_for_step(x, groups is not None)):
                            status, newton_from = NEWTON, certified
                newton_t, newton_products = 0.0, 0
                dropped = np.flatnonzero(~keep)
                control[:] = status, dropped.shape[0], shift if folded else 0.0
            control = wire.bcast(control)
            status = int(control[0])
            if folded and not server:
                shift = float(control[2])
                fold_intercept_shift(local, shift, z.shape[0], local_y_sum,
                                     active.column_sums)
                b += shift
                z += shift
                rho -= shift
            if control[1]:      # never with STOP or REJECT: nothing is screened then
                if not server:
                    dropped = np.empty(int(control[1]), dtype=np.int64)
                dropped = wire.bcast(dropped)
                keep = np.ones(pen.n_blocks, dtype=bool)
                keep[dropped] = False
            # each outer iteration's record goes into the checkpoint once the workers
            # have what they wait for: here, or after the epoch's anchor (below)
            if server and checkpoint is not None and status != INNER:
                _save_state(checkpoint, penalty, p, blocks, x, b, lam, history)
            if status == STOP:
                break
            if status == REJECT:
                # the epoch made P worse than P(snapshot) + its gap (>= P* + 2 gap): the
                # workers' summed stale deltas overshot; redo it from the snapshot with
                # half the step (every rank halves it)
                if move_cap > MIN_MOVE_CAP:
                    move_cap /= 2
                else:
                    step_factor /= 2
                epoch += 1
                if server:
                    x, b = snapshot[0].copy(), snapshot[1]
                in_sync = False
                continue
            if control[1]:
                # a pass over the shard's nnz: skipped when the test screened nothing
                feature_keep = np.repeat(keep, np.diff(pen.indptr))
                correlation = correlation[feature_keep]
                if server:
                    firm = None if firm is None else firm[feature_keep]
                    column_sq = column_sq[feature_keep]
                    if folded:
                        column_sums = column_sums[feature_keep]
                    column_counts = column_counts[feature_keep]
                else:
                    active, _, _ = active.compact(keep, np.zeros(feature_keep.shape[0]))
                blocks = blocks[keep]
                pen = penalty.restricted(blocks)
                x = x[feature_keep]
                block_column_norms = reweighting = None
            if status == NEWTON:
                newton_start = time.perf_counter()
                x, b, newton_t, newton_products = _support_newton(
                    wire, active, x, b, z, loss_code, lam, n, pen, fit_intercept,
                    correlation, float((total if server else local)[1]), firm,
                    float(total[0]) if server else 0.0, column_sq, reduced,
                    penalty.active_features(blocks))
                phases["newton_s"] += time.perf_counter() - newton_start
            if status in (RECERTIFY, NEWTON):
                snapshot = None
                continue
            # step data from the server's full gradient
            if reweighting is None:     # per active set: d_g = n / (rows of block g)
                d = n / np.maximum(block_rows[blocks], 1.0)
                reweighting = d, np.repeat(d, np.diff(pen.indptr))
            d, feature_d = reweighting
            eta0 = step_scale * step_factor / (
                3.0 * _lipschitz(loss_code) * max(max_row_sq + intercept_sq, 1e-300))
            eta = eta0 if variance_reduced else eta0 / (1.0 + epoch)
            step = np.zeros(1 + x.shape[0])
            if server and variance_reduced and not saga:
                step[0] = -float(total[1]) / n
                np.divide(correlation, -n, out=step[1:])
                if not dense:
                    step[1:] *= feature_d
            thresholds = eta * lam * (1.0 if dense else d) * pen.weights
            if freezing:
                mu_intercept, weighted_mu, thresholds = _anchor_without_optimal_zeros(
                    wire, step if server else None, x, eta, thresholds,
                    pen.group_indptr)
            else:
                step = wire.bcast(step)
                mu_intercept, weighted_mu = float(step[0]), step[1:]
            if server and checkpoint is not None:
                # the record's checkpoint, written while the workers form their epoch
                # views rather than before they have the anchor: 2 ms of the server's
                # serial time an epoch at 100,000 features, 20 at a million (the blocks
                # compacted away are zeros of x, so the coefficients are the record's)
                _save_state(checkpoint, penalty, p, blocks, x, b, lam, history)
            eta_intercept = eta * intercept_sq
            if saga:
                # the SAGA gradient memory stays on the workers (one value per own row);
                # its average (1/n) A^T memory is summed exactly over the shards each epoch
                if not server and memory is None:
                    memory = -rho
                local_sum = np.zeros(1 + x.shape[0])
                if not server:
                    local_sum[0] = np.sum(memory)
                    local_sum[1:] = csr_rmatvec(active.indptr, active.indices, active.data,
                                                memory, active.n_features)
                average_all = wire.allreduce(local_sum) / n
            if server:
                snapshot = (x.copy(), b, primal, gap, firm)
                live.update(x=x, b=b, blocks=blocks)
                per_batch = _lipschitz(loss_code) * batch
                inner_start = time.perf_counter()
                x, b, steps, staleness, msgs, mbytes = _serve_inner(
                    channel, x, b, size - 1,
                    overshoot_weights(eta * per_batch * column_sq / n, size - 1, move_cap),
                    float(overshoot_weights(eta_intercept * per_batch, size - 1, move_cap)),
                    damping_power,
                    pen.weights > 0 if l1_epochs else None)
                phases["inner_s"] += time.perf_counter() - inner_start
                steps_total += steps
                messages, message_bytes = msgs, mbytes
            else:
                args = (active.indptr, active.indices, active.data, active.y, loss_code)
                movable = None      # the coordinates the epoch can move (None: all)
                if saga:
                    average, average_b = average_all[1:].copy(), average_all[:1].copy()
                    reweight = feature_d
                    kernel = saga_epoch_l1 if active.penalty.is_l1 else saga_epoch_group

                    def run_batch(local, intercept, samples):
                        kernel(*args, local, intercept, eta_intercept, memory, average,
                               average_b, reweight, thresholds, eta, samples,
                               *block_args)
                elif dense:
                    def run_batch(local, intercept, samples):
                        dense_svrg_epoch(*args, local, intercept, eta_intercept, z,
                                         weighted_mu, mu_intercept, thresholds, eta, samples,
                                         active.block_indptr)
                else:
                    kernel = svrg_epoch_l1 if active.penalty.is_l1 else svrg_epoch_group
                    moving = active.unfrozen_features(thresholds)
                    rows = active.without_frozen(thresholds, moving)
                    args = (rows.indptr, rows.indices, rows.data, active.y, loss_code)
                    if not moving.all():      # x stays put elsewhere on every rank
                        movable = np.flatnonzero(moving)

                    def run_batch(local, intercept, samples):
                        kernel(*args, local, intercept, eta_intercept, z, weighted_mu,
                               mu_intercept, thresholds, eta, samples, variance_reduced,
                               clock, stale, *block_args)
                block_args = () if active.penalty.is_l1 else (active.block_indptr,
                                                              active.feature_block)
                x, b = _work_inner(channel, active.y.shape[0], x, b, run_batch, rng, batch,
                                   movable)
            epoch += 1
    finally:
        blas.close()
        progress.close()
        if restore_handler is not None:
            restore_handler()
    coef = wire.bcast(_expand(penalty, p, blocks, x) if server else np.zeros(p))
    summary = wire.bcast(np.array([b, float(converged)] + ([history[-1]["primal"],
                                  history[-1]["dual"], history[-1]["gap"]]
                                  if server else [0.0, 0.0, 0.0])))
    _close_channel(wire, channel)
    b, converged = float(summary[0]), bool(summary[1])
    return SolverResult(coef, b, epoch - first_epoch, float(summary[2]), float(summary[3]),
                        float(summary[4]), penalty.active_features(blocks), converged,
                        history)


def _close_channel(wire, channel):
    """Detach the channel's collectives from ``wire`` and close it (collective: every
    rank calls it at the same point)."""
    wire.detach()
    channel.close()


def _support_newton(wire, active, x, b, z, code, lam, n, penalty, intercept, correlation,
                    rho_sum, firm, loss_sum, column_sq, reduced, features):
    """The support Newton step (``support_newton.py``) over the shards; every rank calls
    it with its x and b (equal on every rank: each inner loop ends with the workers
    holding the server's) and its margins z at them. S = the non-zeros of x and the zeros
    that most violate the optimality condition (``entering_coordinates``; for the
    squared loss where the Hessian is summed, also the zeros among the largest columns:
    ``_entering_coordinates``; the server broadcasts their count, then their coded
    indices and signs); each worker forms its share of the Hessian on S from its rows
    (``SupportRows``). Then, by what a message costs (``cg_products_from_shares``),
    either
      - the workers reduce their shares' upper triangles ((|S| + 1)(|S| + 2) / 2 numbers,
        formed packed: ``SupportRows.hessian_triangle``; for the squared loss, when most
        of S was in the last such step's, only their rows of the coordinates new to S:
        ``ReducedHessian``, ``reduced`` on every rank, ``features`` the active features'
        original ids) and the server broadcasts the move (``dense_move``: the end point
        of the orthant Newton path or the projected direction, [kind, vector]); for the
        squared loss the server then sums the losses at the candidates itself
        (``quadratic_trial_sums``, exact from the reduced Hessian, the slope and
        ``loss_sum``), so no worker forms or keeps the square matrix and there is no
        round of trial losses (CTR 200,000 x 100,000, 1e-3 lam_max, 2 cores, 12 seeds:
        the first step's median 154-158 -> 120-128 ms at mpirun -n 9, 72-82 -> 67-69
        ms at -n 3, 89-94 -> 81-86 ms at -n 2, when the workers formed the square
        matrix, mirrored it, packed it and summed their trial losses);
      - or the server broadcasts the coordinates of CG's preconditioner block
        (``preconditioner_coordinates``, ranked by its column norms ``column_sq``), they
        reduce their shares' diagonals and upper triangles on that block, then, for
        every product the server's move needs (``support_move``: the same projected
        direction and second solve with the violating zeros as ``dense_move``, and a
        product per model value), it broadcasts [1, v] and they reduce their shares of
        H v; [0, vector] ends the loop ([-1, ...]: no move, no step), then [kind, the
        orthant of S];
    every rank forms the same candidates from it, the workers reduce their losses at
    them (but above) and the server broadcasts the one taken (-1: none). Returns (x, b,
    t), the same on every rank, and the Hessian-vector products the server's solve took
    (0 on the workers and where the Hessian was reduced; the record's
    ``newton_products``).
    ``correlation`` (A^T rho) and ``rho_sum`` (sum rho) are this rank's:
    the server's over all rows, a worker's over its own (the slope of its trial losses,
    ``shard_slope``); ``firm`` (x's firm support), ``loss_sum`` (sum f at x) and
    ``column_sq`` (||A_:j||^2 over the active features) the server's.

    When x has more than MAX_SUPPORT non-zeros (for a group penalty, always), those
    outside its firm support are first set to zero (``pruned_coordinates``: the server
    broadcasts them); the workers' margins
    and their sums [f, rho, A_S^T rho] at the pruned x replace the certificate's, and a
    candidate is taken only below P of the unpruned x (else x is put back).

    ``penalty``: the one on the active blocks (L1 or group). For a group penalty S is the
    coordinates of x's non-zero groups and of the zero groups that most violate the
    optimality condition (``group_newton.entering_groups``, broadcast as group numbers;
    |S| up to HESSIAN_FREE_MAX_SUPPORT), and the server broadcasts the model's minimiser
    as the target of a LINE move. Up to MAX_SUPPORT coordinates the workers reduce their
    shares of the Hessian (``group_newton.group_move``); above
    (``group_uses_hessian_free``), their shares' diagonal group blocks and intercept
    column (``group_newton.group_hessian_blocks``), then the products the server's model
    (``hessian_free_group_minimum``) asks for, each from a pass over their rows
    restricted to S (``SupportRows.hessian_times_from_rows``), and their trial losses
    come from those rows too: no worker forms the Hessian (CTR 200,000 x 100,000, groups
    of 5, 1e-3 lam_max: |S| = 3,440, 47 MB a worker)."""
    server = wire.rank == 0
    weights, block_indptr = penalty.weights, penalty.group_indptr
    groups = block_indptr is not None
    used = {"products": 0}      # Hessian-vector products the server's solve asked for
    pruned = _server_vector(wire, pruned_coordinates(x, firm, always=groups).astype(
        np.float64) if server else None).astype(np.int64)
    saved = x[pruned].copy()
    x[pruned] = 0.0
    if pruned.shape[0] and not server:
        z = active.margins(x, b)
    if groups:
        entering = _server_vector(wire, entering_groups(
            x, correlation, n, lam, weights, block_indptr, HESSIAN_FREE_MAX_SUPPORT)
            if server else None)
        support, point, starts, chosen_groups = group_support_point(
            x, b, intercept, block_indptr, entering)
        signs, weights_S = None, weights[chosen_groups]
    else:
        entering = _server_vector(wire, _entering_coordinates(
            wire, x, correlation, n, lam, weights, column_sq if code == SQUARED else None)
            if server else None)
        support, point, signs = support_point(x, b, intercept, entering)
        starts, weights_S = None, weights[support]
    k, dim = support.shape[0], point.shape[0]
    offset = 0.0         # P(x) - P(the pruned x)
    loss_at_point = loss_sum     # the server's sum f at the point (the pruned x)
    # the squared loss's trial losses, exact from the sums the server reduces with the
    # Hessian (``quadratic_trial_sums``): no round of the workers' trial losses
    server_trials = False
    if pruned.shape[0]:
        local = np.zeros(2 + k)
        if not server:
            rho = generalized_residual(code, z, active.y, np.empty_like(z))
            local[0] = mean_loss(code, z, active.y) * z.shape[0]
            local[1] = np.sum(rho)
            local[2:] = csr_rmatvec(active.indptr, active.indices, active.data, rho,
                                    active.n_features)[support]
        total = wire.reduce(local, root_blank=True)
        if server:
            # the pruned coordinates make up whole blocks (the firm support is one of
            # blocks): their share of the penalty is the penalty of them alone
            alone = np.zeros_like(x)
            alone[pruned] = saved
            offset = (loss_sum - total[0]) / n + lam * penalty.value(alone)
            local, loss_at_point = total, float(total[0])
        rho_sum, correlation_S = float(local[1]), local[2:]
    else:
        correlation_S = correlation[support]
    rows = None if server else SupportRows(active, code, z, support, intercept,
                                           shard_slope(correlation_S, rho_sum, intercept))
    if groups and group_uses_hessian_free(k):
        # the numbers of H the model reads (diagonal blocks, the intercept's column),
        # then products from the workers' rows; the server broadcasts the target
        solve = None
        if server:
            block_sums = wire.reduce(np.empty(group_blocks_length(starts, intercept)),
                                     root_blank=True)

            def solve(hessian_times):
                target, used["products"] = hessian_free_group_move(
                    block_sums, hessian_times,
                    shard_slope(correlation_S, rho_sum, intercept), point, starts,
                    lam * weights_S, n, intercept)
                return target
        else:
            wire.reduce(group_hessian_blocks(rows, starts))
        target = _product_loop(wire, dim, solve,
                               None if server else rows.hessian_times_from_rows)
        if target is None:
            x[pruned] = saved
            return x, b, 0.0, used["products"]
        candidates = move_candidates(LINE, target, point, k)
    elif not groups and cg_products_from_shares(wire, k):
        positions = wire.bcast(
            preconditioner_coordinates(column_sq[support], intercept).astype(np.float64)
            if server else np.empty(preconditioner_size(k, intercept))).astype(np.int64)
        block_size = positions.shape[0] * (positions.shape[0] + 1) // 2
        solve, ending = None, {}
        if server:
            sums = wire.reduce(np.empty(dim + block_size), root_blank=True)
            diagonal = sums[:dim]
            block = (positions, from_upper_triangle(sums[dim:], positions.shape[0]))

            def solve(hessian_times):
                def counted(v):
                    used["products"] += 1
                    return hessian_times(v)

                kind, vector, _, ending["signs"] = support_move(
                    counted, diagonal, block, correlation_S, rho_sum, point, weights_S,
                    lam, n, intercept, signs)
                ending["kind"] = kind
                return vector
        else:
            wire.reduce(np.concatenate((rows.hessian_diagonal(),
                                        rows.hessian_block(positions))))
        vector = _product_loop(wire, dim, solve, None if server else rows.hessian_times)
        if vector is None:
            x[pruned] = saved
            return x, b, 0.0, used["products"]
        # the move's kind and the orthant its candidates keep
        tail = wire.bcast(np.append(float(ending["kind"]), ending["signs"]) if server
                          else np.empty(1 + k))
        signs = tail[1:]
        candidates = move_candidates(int(tail[0]), vector, point, k, signs)
    else:
        # [kind (-1: none), vector, the orthant of S (L1)]
        move = np.full(1 + dim + (0 if groups else k), -1.0)
        server_trials = code == SQUARED
        ids = features[support]
        plan = None if reduced is None else reduced.fresh(ids, intercept)
        fresh_numbers = 0 if plan is None else plan[0].shape[0] * dim   # none: no round
        if server:
            if plan is None:
                hessian = _summed_hessian(wire, dim, lower_only=not groups)
            else:
                hessian = reduced.assemble(plan, wire.reduce(
                    np.empty(fresh_numbers), root_blank=True)
                    if fresh_numbers else np.zeros(0))
            if groups:
                kind, vector = LINE, group_move(
                    hessian, shard_slope(correlation_S, rho_sum, intercept), point, starts,
                    lam * weights_S, n, intercept)
            else:
                kind, vector, _, signs = dense_move(hessian, correlation_S, rho_sum, point,
                                                    weights_S, lam, n, intercept, signs)
            if kind is not None and vector is not None:
                move[0], move[1:1 + dim] = kind, vector
                if not groups:
                    move[1 + dim:] = signs
        else:
            if plan is None:
                wire.reduce(rows.hessian_triangle())
            elif fresh_numbers:
                wire.reduce(rows.hessian_rows(plan[0]).ravel())
        if reduced is not None:
            reduced.keep(ids, intercept, hessian if server else None)
        move = wire.bcast(move)
        if move[0] < 0:
            x[pruned] = saved
            return x, b, 0.0, used["products"]
        if not groups:
            signs = move[1 + dim:]
        candidates = move_candidates(int(move[0]), move[1:1 + dim], point, k, signs)
    if server_trials:
        sums = None if not server else quadratic_trial_sums(
            loss_at_point, shard_slope(correlation_S, rho_sum, intercept), hessian,
            trial_moves(point, candidates))
    else:
        sums = wire.reduce(np.empty(candidates.shape[0] + 1) if server else
                           rows.trial_sums(point, candidates), root_blank=True)
    chosen = np.full(1, -1.0)
    if server:
        chosen[0] = best_candidate(sums, n, lam, weights_S, point[:k],
                                   candidates[:, :k], offset, starts)[0]
    index = int(wire.bcast(chosen)[0])
    if index < 0:
        x[pruned] = saved
        return x, b, 0.0, used["products"]
    return x, take_candidate(x, b, support, candidates[index], intercept), \
        float(STEP_GRID[index]), used["products"]


def _summed_hessian(wire, dim, lower_only=False):
    """The server's sum of the workers' Hessian shares (their ``upper_triangle``s, summed
    in place) as the symmetric dim x dim matrix, or with ``lower_only`` its lower
    triangle alone (``lower_from_upper_triangle``: all the L1 step reads, half the
    pages). Where each rank of the node has a core, the server's is idle while the
    workers form their shares, and it first maps the pages of the sum and of the
    matrix (``touch_pages``) so that the reduction and the unpacking write into mapped
    memory: 5.9 + 11.9 MB at |S| = 1,217 (CTR 200,000 x 100,000, 1e-3 lam_max), ~2.5 us
    a 4 kB page on the 2-core VM."""
    total, square = np.empty(dim * (dim + 1) // 2), np.empty((dim, dim))
    if wire.local_ranks <= wire.node_cores:
        touch_pages(total.view(np.uint8))
        memory = square.reshape(-1).view(np.uint8)
        if lower_only:
            touch_lower_triangle(memory, dim)
        else:
            touch_pages(memory)
    unpack = lower_from_upper_triangle if lower_only else from_upper_triangle
    return unpack(wire.reduce(total, root_blank=True), dim, out=square)


def _entering_coordinates(wire, x, correlation, n, lam, weights, column_sq):
    """The server's ``entering_coordinates`` for the L1 step: with the popular zeros
    (``column_sq``; None: none) where the step would still reduce the Hessian, not ask
    for products (``cg_products_from_shares``)."""
    limit = entering_limit(int(np.count_nonzero(x)))
    entering = entering_coordinates(x, correlation, n, lam, weights, limit, column_sq)
    if column_sq is not None and cg_products_from_shares(
            wire, int(np.count_nonzero(x)) + entering.shape[0]):
        entering = entering_coordinates(x, correlation, n, lam, weights, limit)
    return entering


def cg_products_from_shares(wire, support_size):
    """Whether the L1 step's CG asks the workers for every Hessian-vector product, each
    answered from the share it formed (``SupportRows.hessian_times``), rather than taking
    the shares' sum once and running the CG on the server (``dense_move``: the projected
    direction, CG on the server's Hessian, above 398 coordinates). Each worker forms its
    share either way; what differs is what a message costs. Across machines, its bytes:
    products where they send fewer than the sum's (|S| + 1)(|S| + 2) / 2 numbers a worker
    (``uses_hessian_free``). On one node (``Wire.one_node``), its round: a product is a
    broadcast and a reduction that every worker must wake for, and at mpirun -n 9 on 2
    cores (CTR 200,000 x 100,000, 1e-3 lam_max, |S| ~1,200, seeds 1-4) the steps took
    0.14-0.43 s with 38-127 products against 0.12-0.13 s with the sum, whose own CG
    products take 0.15 ms each; at -n 3, 0.05-0.07 s either way."""
    return not wire.one_node and uses_hessian_free(support_size)


def _product_loop(wire, dim, solve, answer):
    """The server's ``solve(hessian_times)`` (None on the workers), the workers answering
    the products it asks for: for each, the server broadcasts [1, v] and they reduce
    their shares ``answer(v)`` (H_shard v); [0, vector] ends the loop with the vector
    ``solve`` returned, [-1, ...] with None. Returns that vector, or None, on every
    rank."""
    if solve is not None:
        def hessian_times(v):
            wire.bcast(np.concatenate(([1.0], v)))
            return wire.reduce(np.empty(dim), root_blank=True)

        result = solve(hessian_times)
        found = result is not None
        wire.bcast(np.concatenate(([0.0 if found else -1.0],
                                   result if found else np.zeros(dim))))
        return result
    while True:
        message = wire.bcast(np.empty(1 + dim))
        if message[0] != 1.0:
            return message[1:] if message[0] == 0.0 else None
        wire.reduce(answer(message[1:]))


def _anchor_without_optimal_zeros(wire, step, x, eta, thresholds, block_indptr=None):
    """The epoch's anchor [mu_b, d mu] (``step``, the server's; None on the workers) on
    every rank, less the coordinates that ``freeze_optimal_zeros`` freezes (those of the
    frozen blocks: ``block_indptr``, None for L1's single coordinates): they stay at
    zero for the epoch whatever their mu_j, so the server broadcasts [mu_b, k] for the k
    others, then their k values followed by their coordinates (``write_index``: int32
    indices or their bitmap, whichever is shorter). Returns (mu_b,
    d mu with zeros where frozen, the thresholds (per block) with +inf at the frozen
    blocks), the same on every rank.
    CTR 200,000 x 100,000 at 1e-4 lam_max, 2 workers: 40% of the 100,000 coordinates
    are free at the first epoch, 11% at the fifth, 2-3% from the seventh, so the 0.8 MB
    per worker per epoch of the dense anchor falls to 0.03-0.3 MB."""
    p = x.shape[0]
    scratch = np.empty(bitmap_words(p), dtype=np.uint32)
    header = np.zeros(2)
    sizes = None if block_indptr is None else np.diff(block_indptr)
    if step is not None:
        frozen_blocks = optimal_zeros(x, eta, step[1:], thresholds, block_indptr)
        free = np.flatnonzero(~(frozen_blocks if sizes is None else
                                np.repeat(frozen_blocks, sizes))).astype(np.int32)
        header[:] = step[0], free.shape[0]
    header = wire.bcast(header)
    count = int(header[1])
    n_index = index_length(count, scratch)
    payload = np.empty(count + (n_index + 1) // 2)
    words = payload[count:].view(np.int32)[:n_index]
    if step is not None:
        payload[:count] = step[1:][free]
        write_index(free, words, scratch)
    if payload.shape[0]:
        payload = wire.bcast(payload)
        words = payload[count:].view(np.int32)[:n_index]
    if step is None:
        free = decode_index(words, count, p, np.empty(p, dtype=np.int32))
    weighted_mu = np.zeros(p)
    weighted_mu[free] = payload[:count]
    free_blocks = np.zeros(p, dtype=bool)
    free_blocks[free] = True
    if sizes is not None:           # a block is free as a whole: read its first feature
        free_blocks = free_blocks[block_indptr[:-1]]
    return float(header[0]), weighted_mu, np.where(free_blocks, thresholds, np.inf)


def _server_vector(wire, vector):
    """The server's float64 ``vector`` (None on the workers) on every rank: its length is
    broadcast, then its values when there are any."""
    count = np.array([0.0 if vector is None else float(vector.shape[0])])
    count = int(wire.bcast(count)[0])
    if not count:
        return np.zeros(0)
    return wire.bcast(vector if vector is not None else np.empty(count))


def _lipschitz(code):
    return 0.25 if code == LOGISTIC else 1.0


def overshoot_weights(contraction, n_workers, move_cap):
    """omega = min(1, 1 / (l (1 - e^{-C}))) per coordinate, C its contraction per batch:
    C_j = eta L_f B ||A_:j||^2 / n for a feature (B steps, each pulling x_j towards its
    coordinate minimum by the factor eta L_f a_ij^2), C = eta_b L_f B for the intercept.

    On the local quadratic model a batch moves a coordinate the fraction 1 - e^{-C} of the
    way to its minimum; l deltas computed side by side from the same x and summed move it
    l (1 - e^{-C}), past the minimum when that exceeds 1 and divergent past 2. The server
    sums deltas (as Hogwild sums updates) except where the sum would overshoot; there it
    scales the sum to land on the minimum. With n / (m l) rows per batch and m fixed
    (``default_batch`` beyond 4 workers), l C stays the same for every l: on CTR data with
    m = 50 it was ~4 for the intercept and ~20 popular features (m = 25 doubles it), and 8
    plain sums sent the intercept to -8e5 in the first epoch. (Averaging wherever a batch
    likely touches a coordinate instead slowed 2 and 4 workers to 2.3 and 4.5 times the
    epochs of one.)"""
    contraction = np.asarray(contraction, dtype=np.float64)
    return np.minimum(1.0, move_cap / np.maximum(n_workers * -np.expm1(-contraction), 1e-300))


def default_batch(n, n_workers, oversubscribed=True):
    """Local steps per message: n / (m l) with m = ceil(2.5 l) messages per worker per
    epoch for up to 4 workers, and beyond m = 25 on a node with more ranks than cores
    whose waits poll (``oversubscribed``: solve_mpi passes False where they sleep on
    doorbells), m = 10 elsewhere. Few messages hide the round trip (the server of an
    oversubscribed node answers late); many keep the deltas of l workers from
    compounding.

    On a crowded node whose waits sleep on doorbells (``wire.Doorbell``) m = 10 does
    better: CTR 200,000 x 100,000 at 1e-3 lam_max, mpirun -n 9 on 2 cores, three blocks
    of 5-8 interleaved runs (2026-11-26), median 0.522 / 0.461 / 0.436 s with m = 10
    against 0.571 / 0.494 / 0.513 s with m = 25 (m = 15: 0.504 / 0.513; m = 40: 0.530).

    With a core per rank the server answers at once, and it is the server that each
    message costs: every reply carries the coordinates the other workers changed since
    (most of x on CTR). CTR 200,000 x 100,000 at 1e-3 lam_max, 8 workers on 16 cores
    (bench_speedup, 2026-11-26): an inner loop took 24.5-26.6 ms an epoch with m = 25
    against 10.7 ms with m = 10 and 8.9-11.8 ms with m = 5, and the solve 0.42-0.53 s
    (7 epochs each) against 0.36 s (7 epochs) with m = 10, 0.31-0.37 s (5-8) with m = 5
    and 0.77 s (12) with m = 3.

    Measured on CTR 200,000 x 100,000 to gap 1e-6 (2 cores): 1 worker 0.96 s
    with m = 3 against 1.40 s with m = 50; with ``overshoot_weights`` and the staleness
    damping (2026-11-22), 2 workers 1.37-1.91 s with m = 5 against 1.69-2.01 s with
    m = 10 (18-20 epochs either way; m = 3 took 44 epochs once); 4 workers 3.4-3.5 s with
    m = 10 against 4.1-4.2 s with m = 20 and 5.3-5.7 s with m = 40 (23-26 epochs each);
    on CTR 20,000 x 10,000, 2 workers 0.96-1.02 s (m = 5) against 1.34-1.41 s (m = 10).
    Beyond 4 workers (two runs each): 5 workers 4.5 / 6.7 s with m = 25 against 5.4 / 6.2 s
    with m = 13 and 7.2 / 8.2 s with m = 50; 6 workers 7.9 / 6.8 s (m = 25), 7.2 / 8.2 s
    (m = 15), 9.0 / 10.3 s (m = 50); 7 workers 11.5 s (m = 18), 11.9 s (m = 35), 15.4 s
    (m = 50); 8 workers 13.4 / 13.4 s with m = 25 (38-40 epochs) against 13.7 / 13.6 s
    with m = 20 (45 epochs) and 19.0 / 16.0 s with m = 50 (33-36 epochs). (Once the
    active set is small a batch takes ~2 ms, shorter than a round trip on shared cores, so
    fewer, longer batches hide it.) At least one step per message (4 workers with 50-step
    batches on 400 rows stalled a group Lasso at gap 6e-4)."""
    messages = int(np.ceil(2.5 * n_workers)) if n_workers <= 4 else \
        25 if oversubscribed else 10
    return max(1, n // (messages * n_workers))


def staleness_damping(tau, n_workers, power=1.0):
    """The weight of a delta computed tau server versions ago: 1 up to tau = l (each other
    worker one message ahead, the normal round), then (l / tau)^power: power 1 is the
    staleness-aware rule of Zhang et al. (IJCAI 2016, step / tau, relative to the normal
    staleness l). Oversubscribed cores deschedule workers for many rounds; their deltas,
    taken from an x that moved l / tau rounds ago, pushed 8 workers on 2 cores into step
    halvings and 138 epochs (34 with the damping; 1 worker: 34). The server adapts the
    power during the run (``adapt_damping_power``)."""
    return 1.0 if tau <= n_workers else (n_workers / tau) ** power


def adapt_damping_power(power, calm, gap_rose):
    """The staleness damping power after an epoch: +1 (up to MAX_DAMPING_POWER = 4) when
    the epoch ended with a larger gap than it started with, -1 (not below 2) after
    CALM_EPOCHS = 4 epochs in a row without that; power 1 until the first rise. Returns
    (power, calm epochs so far). The bold-driver rule of step-size adaptation, applied to
    how much stale deltas count rather than to the step: a smaller step does not help,
    since ``overshoot_weights`` gives the popular coordinates the same summed move for any
    step.

    CTR 200,000 x 100,000, 8 workers on 2 cores (mpirun -n 9), to gap 1e-6: with power 1
    throughout, 24-83 epochs in 12 runs, depending on timing (the gap wandered at
    1e-3..4e-2 for up to 70 epochs); power 2 from the first rise on, 27-29 epochs in 7 of
    7 runs; this rule, 28-30 epochs in 5 of 5 runs. With waits that sleep without the 1 ms
    spin (another timing), power 2 from the first rise stalls at a gap of 1e-2 in 2 of 2
    runs (with a step cut to 1/8, or a halved move cap, too); this rule converges in 115
    epochs; raising the power without ever lowering it converges too, but slowly (7e-6
    after 115 epochs). 2 and 4 workers: 20 and 25 epochs (23-24 with power 1)."""
    if gap_rose:
        return min(power + 1.0, MAX_DAMPING_POWER), 0
    calm += 1
    if power > 2.0 and calm >= CALM_EPOCHS:
        return power - 1.0, 0
    return power, calm


def _serve_inner(channel, x, b, n_workers, omega, omega_intercept, damping_power,
                 orthant=None):
    """Apply deltas in arrival order until every worker has sent its last one; returns
    (x, b, steps, (mean tau, max tau), messages, bytes of the messages).

    ``orthant`` (``ddss.l1_prox_svrg``: the L1-penalized coordinates): a delta that
    takes such a coordinate across zero leaves it at zero. The L1 prox never crosses zero
    in one step, it stops there; deltas that l workers computed from about the same x,
    each taking x_j to zero, sum to a move l omega_j times as long, past zero, and the
    next batches pull it back: CTR 200,000 x 100,000 at 1e-3 lam_max, 8 workers, x kept
    1,710 non-zeros from the third epoch to the eighth (the solution has 1,010) and the
    Newton step came at |S| = 1,710.

    A worker's last delta is answered only once every worker has sent its own: that reply
    ("stop", the coordinates changed since its previous reply) leaves every worker with
    exactly the server's x and b, so the next outer iteration needs no broadcast of x."""
    version, steps, messages, message_bytes = 0, 0, 0, 0
    tau_sum, tau_max = 0, 0
    running = n_workers
    changed_at = np.zeros(x.shape[0], dtype=np.int64)
    run_source = np.zeros(x.shape[0], dtype=np.int32)     # see add_weighted_delta
    before_run = np.zeros(x.shape[0], dtype=np.int64)
    seen = np.zeros(n_workers + 1, dtype=np.int64)
    log = ChangeLog(x.shape[0], n_workers)
    decoded = np.empty(x.shape[0], dtype=np.int32)
    bitmap = np.empty(bitmap_words(x.shape[0]), dtype=np.uint32)
    while running:
        source, index, values = channel.wait_delta()
        message_bytes += index.nbytes + values.nbytes
        index = decode_index(index, values.shape[0] - HEADER, x.shape[0], decoded)
        log.add(index)
        tau = version - int(values[0])
        damping = staleness_damping(tau, n_workers, damping_power)
        version += 1
        add_weighted_delta(x, changed_at, index, values, HEADER, damping, omega, version,
                           source, run_source, before_run, orthant)
        b += damping * omega_intercept * values[2]
        tau_sum += tau * int(values[1])
        tau_max = max(tau_max, tau)
        steps += int(values[1])
        messages += 1
        if values[3] != 0:
            running -= 1
        else:
            _reply(channel, source, INNER, x, b, version, changed_at, seen, bitmap,
                   run_source, before_run, log)
    for source in range(1, n_workers + 1):
        _reply(channel, source, STOP, x, b, version, changed_at, seen, bitmap, run_source,
               before_run, log)
    channel.flush()
    return x, b, steps, (tau_sum / max(steps, 1), tau_max), messages, message_bytes


def _reply(channel, worker, control, x, b, version, changed_at, seen, bitmap, run_source,
           before_run, log):
    """Send ``worker`` the coordinates of x changed since its previous reply behind the
    header [control, version, b, full], in the shortest of three forms: their int32
    indices and values (12 B each), their bitmap (``bitmap``: uint32 scratch of
    ``bitmap_words(|x|)``) and values (n / 8 B + 8 B each), or the whole x (full, 8 n B).
    The coordinates that only this worker changed since, with weight 1, are left out
    (``changed_since``, from the ChangeLog ``log``): its copy holds them bit for bit."""
    fresh = log.owed(worker, changed_at, seen[worker], run_source, before_run)
    seen[worker] = version
    k = fresh.shape[0]
    n_index = index_length(k, bitmap)
    full = 8 * x.shape[0] <= 8 * k + 4 * n_index
    index, reply = channel.reply_buffers(worker, 0 if full else n_index,
                                         x.shape[0] if full else k)
    reply[0] = control
    reply[1] = version
    reply[2] = b
    reply[3] = full
    if full:
        reply[REPLY_HEADER:] = x
    else:
        write_index(fresh, index, bitmap)
        np.take(x, fresh, out=reply[REPLY_HEADER:])
    channel.post_reply(worker, index, reply)


def _work_inner(channel, rows, x, b, run_batch, rng, batch, movable=None):
    """One pass over the shard's ``rows`` in batches of local steps (``run_batch(x, b,
    samples)`` runs the method's kernel on the local copies); the last delta is flagged
    and answered with stop once every worker is done. Returns (x, b): the server's, exactly
    (the final reply assigns every coordinate that differs). ``movable``: the coordinates
    the epoch's steps can change (those of its unfrozen blocks, ascending; None: all),
    the only ones a delta is looked for in (``take_delta``).

    Pipelined: while a delta and its reply are in flight the worker already computes the
    next batch on its local x, so one message round trip hides behind one batch of work.
    The reply (the server's x on the coordinates that changed since the previous reply,
    this worker's own weighted delta included) replaces ``base`` there, and the local x
    keeps the steps taken since the send on top of it: x_local = x_server + (x_local -
    x_sent). Each delta carries the server version its batch started from, so the
    staleness the server measures includes this one message of lag."""
    order = epoch_rows(rng, rows, rows).astype(np.int64)
    position, version = 0, 0
    batch = max(1, int(batch))
    base = x.copy()                 # x as sent: the server's x plus this worker's deltas
    local = x.copy()
    intercept = np.array([b])
    intercept_base = b
    index_buf, values_buf = channel.delta_buffers()
    decoded = np.empty(x.shape[0], dtype=np.int32)
    bitmap = np.empty(bitmap_words(x.shape[0]), dtype=np.uint32)
    waiting = sent_last = False
    while True:
        if not sent_last:
            samples = order[position:position + batch]
            position += samples.shape[0]
            batch_version = version
            run_batch(local, intercept, samples)
        if waiting:
            fresh, reply = channel.wait_reply()
            if not reply[3]:
                fresh = decode_index(fresh, reply.shape[0] - REPLY_HEADER, x.shape[0],
                                     decoded)
            version = int(reply[1])
            intercept[0] = reply[2] + (intercept[0] - intercept_base)
            intercept_base = reply[2]
            apply_reply(local, base, fresh, reply, REPLY_HEADER, bool(reply[3]))
            if reply[0] == STOP:
                return local, float(intercept[0])
        if sent_last:
            continue
        # the delta buffers are free again: the server has answered the previous delta
        count = take_delta(local, base, index_buf, values_buf, HEADER, movable)
        n_index = encode_index(index_buf, count, bitmap)
        values_buf[0] = batch_version
        values_buf[1] = samples.shape[0]
        values_buf[2] = intercept[0] - intercept_base
        values_buf[3] = float(position >= rows)
        sent_last = position >= rows
        intercept_base = intercept[0]
        channel.post_delta(n_index, count)
        waiting = True


def null_intercept(wire, y, n, loss_code, fit_intercept):
    """The optimal intercept at x = 0 over every shard (``y``: this rank's labels, empty
    on the server): squared loss, the global mean of y; logistic, log(n+ / n-); 0 without
    an intercept. The same value on every rank."""
    if not fit_intercept:
        return 0.0
    if loss_code == SQUARED:
        return float(wire.allreduce(np.array([np.sum(y)]))[0]) / n
    positive = float(wire.allreduce(np.array([np.sum(y > 0)]))[0])
    return float(np.log(max(positive, 1e-300) / max(n - positive, 1e-300)))


def distributed_null_objective(wire, y, n, loss_code, fit_intercept):
    """P(0) = (1/n) sum_i f(b0, y_i) at the optimal intercept b0 (``null_intercept``) over
    every shard (``y`` None on the server), as ``Problem.null_objective``: the scale of
    the relative gap. The same value on every rank."""
    y = np.zeros(0) if y is None else y
    b = null_intercept(wire, y, n, loss_code, fit_intercept)
    local = mean_loss(loss_code, np.full(y.shape[0], b), y) * y.shape[0] if y.shape[0] \
        else 0.0
    return float(wire.allreduce(np.array([local]))[0]) / n


def distributed_lam_max(comm, problem, penalty, n, loss_code, fit_intercept):
    """lam_max = Omega^D(A^T rho(0)) / n over every shard (rank 0 holds none): rho(0) at
    x = 0 with the exact intercept (``null_intercept``). The same value on every rank."""
    wire = Wire(comm)
    y = np.zeros(0) if problem is None else problem.full_active_set().y
    b = null_intercept(wire, y, n, loss_code, fit_intercept)
    local = np.empty(penalty.ids.shape[0]) if problem is None else \
        problem.full_active_set().residual_correlation(loss_code, b)
    total = wire.reduce(local, root_blank=True)
    value = np.zeros(1)
    if comm.Get_rank() == 0:
        value[0] = penalty.restricted(np.arange(penalty.n_blocks)).dual_norm(total) / n
    return float(wire.bcast(value)[0])


def load_server_kernels(penalty, loss_code):
    """Load the numba kernels the server runs in every Dis-DDSS solve (from numba's cache,
    or compiled where it is cold), on tiny inputs of the solve's types. A process's first
    kernel also builds numba's typing and target contexts, ~0.2 s on the 2-core VM that
    the server otherwise spends inside the first certificate while every worker waits
    for its decision; a caller with idle time on the server calls this there (the command
    line, while the workers parse their byte ranges)."""
    empty = np.zeros(0)
    generalized_residual(loss_code, empty, empty, np.empty(0))
    penalty.value(np.zeros(penalty.ids.shape[0]))
    x, omega = np.zeros(1), np.ones(1)
    index, values = np.zeros(1, dtype=np.int32), np.zeros(HEADER + 1)
    changed_at, before_run = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    run_source = np.zeros(1, dtype=np.int32)
    for orthant in (None, np.ones(1, dtype=bool)) if penalty.is_l1 else (None,):
        add_weighted_delta(x, changed_at, index, values, HEADER, 1.0, omega, 1, 1,
                           run_source, before_run, orthant)
    log = ChangeLog(1, 1)
    log.add(index)
    log.owed(1, changed_at, 0, run_source, before_run)
