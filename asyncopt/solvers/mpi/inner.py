"""Dis-DDSS's asynchronous inner epoch (thesis Algorithms 5 and 6, docs/design.md §3).

A worker runs ``batch`` sparse prox-SVRG steps on its copy of x (kernels/svrg.py), sends
the sparse delta (int32 indices, or their bitmap once it is shorter, and float64 values
behind the header [version, steps, intercept delta, last]) and, while it travels, runs its
next batch; the server applies deltas in arrival order and replies with the coordinates
of x that changed since the worker's previous reply, less those only this worker changed
(behind [control, version, b, full]; the whole x where that is shorter). Each worker
makes exactly one pass over its shard per epoch and flags its last delta, which the
server answers with "stop" once every worker has sent its own: every row is visited once
per epoch, as in the serial solver, and every worker ends the epoch holding exactly the
server's x and b. Staleness tau = server version at apply - the version the worker
computed on.

The server sums deltas (as Hogwild sums updates) with two weights: ``overshoot_weights``
caps the summed move of a coordinate that one batch already moves most of the way to its
minimum, and ``staleness_damping`` scales a delta computed more than l versions ago by
(l / tau)^k, k adapted per epoch (``adapt_damping_power``). The messages go through
``comm.channels`` (a shared-memory window on one node, MPI messages across nodes); each
side's vector work per message is one pass of ``comm.messages``.
"""
import numpy as np

from ...comm.messages import (ChangeLog, add_weighted_delta, apply_reply, bitmap_words,
                              decode_index, encode_index, index_length, take_delta,
                              write_index)
from ..ddss import EPOCH, STOP, epoch_rows

MOVE_CAP, MIN_MOVE_CAP = 1.9, 0.45
MAX_DAMPING_POWER, CALM_EPOCHS = 4.0, 4
HEADER = 4          # [version, steps, intercept delta, last] in front of a delta's values
REPLY_HEADER = 4    # [control, version, b, full] in front of a reply's values


def overshoot_weights(contraction, n_workers, move_cap):
    """omega = min(1, cap / (l (1 - e^{-C}))) per coordinate, C its contraction per batch:
    C_j = eta L_f B ||A_:j||^2 / n for a feature (B steps, each pulling x_j towards its
    coordinate minimum by the factor eta L_f a_ij^2), C = eta_b L_f B for the intercept;
    ``move_cap`` is cap (MOVE_CAP = 1.9, halved after a rejected epoch).
    
    On the local quadratic model a batch moves a coordinate the fraction 1 - e^{-C} of the
    way to its minimum; l deltas computed side by side from the same x and summed move it
    l (1 - e^{-C}), past the minimum when that exceeds 1 and divergent past 2. The server
    sums deltas (as Hogwild sums updates) except where the sum would overshoot; there it
    scales the sum to land within the cap. Returns an array shaped like ``contraction``."""
    contraction = np.asarray(contraction, dtype=np.float64)
    return np.minimum(1.0, move_cap / np.maximum(n_workers * -np.expm1(-contraction), 1e-300))


def default_batch(n, n_workers, oversubscribed=True):
    """Local steps per message: n / (m l) for l workers, so that each worker sends about m
    messages an epoch: m = 2.5 l up to 4 workers; beyond, m = 25 on a node with more ranks
    than cores whose waits poll (``oversubscribed``; solve_mpi passes False where they sleep
    on doorbells), m = 10 elsewhere. Few messages hide the round trip (the server of an
    oversubscribed node answers late); many keep the deltas of l workers from compounding.
    At least one step per message."""
    messages = int(np.ceil(2.5 * n_workers)) if n_workers <= 4 else \
        25 if oversubscribed else 10
    return max(1, n // (messages * n_workers))


def staleness_damping(tau, n_workers, power=1.0):
    """The weight of a delta computed tau server versions ago: 1 up to tau = l (each other
    worker one message ahead, the normal round), then (l / tau)^power; power 1 is the
    staleness-aware rule of Zhang et al. (IJCAI 2016, step / tau, relative to the normal
    staleness l). The server adapts the power during the run (``adapt_damping_power``)."""
    return 1.0 if tau <= n_workers else (n_workers / tau) ** power


def adapt_damping_power(power, calm, gap_rose):
    """The staleness damping power after an epoch: +1 (up to MAX_DAMPING_POWER = 4) when
    the epoch ended with a larger gap than it started with, -1 (not below 2) after
    CALM_EPOCHS = 4 epochs in a row without that; power 1 until the first rise. Returns
    (power, calm epochs so far). The bold-driver rule of step-size adaptation, applied to
    how much stale deltas count rather than to the step: a smaller step does not help,
    since ``overshoot_weights`` gives the popular coordinates the same summed move for any
    step."""
    if gap_rose:
        return min(power + 1.0, MAX_DAMPING_POWER), 0
    calm += 1
    if power > 2.0 and calm >= CALM_EPOCHS:
        return power - 1.0, 0
    return power, calm


def serve_epoch(channel, x, b, n_workers, omega, omega_intercept, damping_power,
                 orthant=None, positive=False):
    """Apply deltas in arrival order until every worker has sent its last one; returns
    (x, b, steps, (mean tau, max tau), messages, bytes of the messages). x is updated in
    place (mid-epoch it is a valid iterate: the driver checkpoints it when interrupted).
    
    ``orthant`` (``ddss.l1_prox_svrg``: the L1-penalized coordinates): a delta that
    takes such a coordinate across zero leaves it at zero. The L1 prox never crosses zero
    in one step, it stops there; deltas that l workers computed from about the same x,
    each taking x_j to zero, sum to a move l omega_j times as long, past zero.
    ``positive`` (the positive L1 penalty, any method): a sum below zero lands on zero,
    so that the server's x stays in x >= 0 whatever the deltas' staleness.
    
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
                           source, run_source, before_run, orthant, positive)
        b += damping * omega_intercept * values[2]
        tau_sum += tau * int(values[1])
        tau_max = max(tau_max, tau)
        steps += int(values[1])
        messages += 1
        if values[3] != 0:
            running -= 1
        else:
            _reply(channel, source, EPOCH, x, b, version, changed_at, seen, bitmap,
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


def work_epoch(channel, rows, x, b, run_batch, rng, batch, movable=None):
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
