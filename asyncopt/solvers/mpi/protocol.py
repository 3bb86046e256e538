"""The collectives of Dis-DDSS's outer iteration that both roles run (docs/design.md §3).

Every rank takes part in each, the server contributing blanks (or zeros) to the sums:
  - ``shard_statistics``: once, the sums and maxima of the shards' statistics (rows,
    row and column norms, rows per block, stored entries per column);
  - the certificate (``certificate_sums``): [sum c f, sum rho, sum rho^2 / c, sum y rho,
    A^T rho] reduced to the server (c_i the rows' sample weights, 1 without them; each
    worker holds its rows' weights in its ActiveSet, ``sample_weight``); the logistic
    loss's intercept is refitted before it (``intercept_refit``), the squared loss's
    rides in it (``fold_intercept_shift``), and
    D is the server's from those sums (``squared_conjugate_sum``) or one more round at
    the dual scale (logistic);
  - the control word [status, blocks removed, the intercept's shift, eta, eta s^2] the
    server broadcasts after its decision (``CONTROL``), then the removed blocks'
    positions, then for an epoch its anchor (``send_anchor`` / ``receive_anchor``).
"""
import numpy as np

from ...comm.messages import decode_index, index_length, write_index, bitmap_words
from ...comm.wire import Wire, _mpi
from ...losses import UNWEIGHTED, intercept_sums, loss_of_code, mean_loss
from ...penalties import per_feature
from ...problem import refit_intercept

CERTIFICATE_SUMS = 4    # the scalars ahead of A^T rho in a certificate's reduction
CONTROL = 5             # [status, blocks removed, the intercept's shift, eta, eta s^2]


class ShardStatistics:
    """The shards' statistics, summed over the workers (every rank calls the
    constructor; ``active`` is the worker's ActiveSet, None on the server).

    n (rows), max_row_sq (max c_i ||a_i||^2), max_weight (max c_i), weight_total
    (sum c_i: n without sample weights), intercept_sq (s^2: the mean square of the
    stored entries, 0 without intercept), y_total (sum c_i y_i), block_rows (rows per
    block, on every rank), fewest (the fewest rows of a worker); the server's alone:
    column_sq (sum_i c_i a_ij^2), column_sums (A^T c, where the squared loss folds the
    intercept's refit into the certificate, else None) and column_counts (stored
    entries per column; an L1 penalty's rows per block). c_i: the rows' sample weights
    (the shards' ActiveSets' ``sample_weight``; 1 without them)."""

    def __init__(self, wire, active, penalty, n_features, fit_intercept, folded):
        server = active is None
        p = n_features
        local_rows = 0 if server else active.y.shape[0]
        row_sq = np.zeros(0) if server else active._row_sq_norms
        weights = UNWEIGHTED if server else active.sample_weight
        weighted = weights.shape[0] > 0
        y_sum = 0.0 if server else float(weights @ active.y if weighted
                                         else np.sum(active.y))
        n, sq_total, nnz_total, self.y_total, weight_total = wire.allreduce(np.array(
            [float(local_rows), row_sq.sum(), 0.0 if server else float(active.nnz),
             y_sum, float(np.sum(weights)) if weighted else float(local_rows)]))
        self.n, self.weight_total = int(n), float(weight_total)
        fewest, max_row_sq, max_weight = wire.allreduce(np.array(
            [-np.inf if server else -float(local_rows),
             (weights * row_sq if weighted else row_sq).max(initial=0.0),
             weights.max(initial=0.0) if weighted else float(local_rows > 0)]),
            _mpi().MAX)
        self.fewest, self.max_row_sq = -fewest, float(max_row_sq)
        self.max_weight = float(max_weight)
        self.column_sq = self.column_sums = self.column_counts = None
        self.block_rows = None
        self.intercept_sq = (sq_total / nnz_total if nnz_total else 1.0) \
            if fit_intercept else 0.0
        if self.fewest < 1:
            return
        count = np.int32 if self.n < 2 ** 31 else np.int64
        stats = wire.reduce(np.empty((1 + folded) * p) if server else np.concatenate(
            (active.column_sq_norms,) + ((active.column_sums,) if folded else ())),
            root_blank=True)
        if server:
            self.column_sq = stats[:p]
            self.column_sums = stats[p:] if folded else None
        self.block_rows = wire.allreduce(np.zeros(penalty.n_blocks, dtype=count) if server
                                         else active.block_row_counts.astype(count))
        if penalty.rows_are_column_counts:
            self.column_counts = self.block_rows if server else None
        else:
            self.column_counts = wire.reduce(np.empty(p, dtype=count) if server
                                             else active.column_counts.astype(count),
                                             root_blank=True)


def certificate_sums(active, code, x, b, z, y, rho):
    """A worker's share of the certificate's reduction, [sum c f, sum rho, sum rho^2 / c,
    sum y rho, A^T rho] over its rows (the two sums of squares only for the squared
    loss, where rho = c (y - z) and sum rho^2 / c = rho^T (y - z), the rows with c = 0
    adding nothing), at margins ``z`` and residual ``rho``; c: the rows' sample weights
    (``active.sample_weight``, all 1 without them)."""
    weights = active.sample_weight
    local = np.zeros(CERTIFICATE_SUMS + x.shape[0])
    local[0] = mean_loss(code, z, y, weights) * z.shape[0]
    local[1] = np.sum(rho)
    if loss_of_code(code).quadratic:
        local[2] = rho @ (y - z) if weights.shape[0] else rho @ rho
        local[3] = y @ rho
    local[CERTIFICATE_SUMS:] = active.residual_correlation_at(x, code, b, rho)
    return local


def frozen_from_free(free, p, block_indptr):
    """The frozen blocks (a mask per block) from the free coordinates ``free``."""
    free_features = np.zeros(p, dtype=bool)
    free_features[free] = True
    return ~(free_features if block_indptr is None else free_features[block_indptr[:-1]])


def send_anchor(wire, plan, block_indptr):
    """The server's half of the epoch's frozen anchor: [mu_b, k] for the k coordinates
    outside the frozen blocks (``plan.frozen``), then their k values of d mu followed by
    their positions (``write_index``: int32 indices or their bitmap, whichever is
    shorter). A frozen coordinate stays at zero for the epoch whatever its mu_j."""
    p = plan.weighted_mu.shape[0]
    free = np.flatnonzero(~per_feature(plan.frozen, block_indptr)).astype(np.int32)
    wire.bcast(np.array([plan.mu_intercept, float(free.shape[0])]))
    scratch = np.empty(bitmap_words(p), dtype=np.uint32)
    count = free.shape[0]
    n_index = index_length(count, scratch)
    payload = np.empty(count + (n_index + 1) // 2)
    payload[:count] = plan.weighted_mu[free]
    write_index(free, payload[count:].view(np.int32)[:n_index], scratch)
    if payload.shape[0]:
        wire.bcast(payload)


def receive_anchor(wire, p, group_indptr):
    """A worker's half of ``send_anchor``: (mu_b, d mu with zeros where frozen, the
    frozen blocks; ``group_indptr`` None for L1's single coordinates)."""
    header = wire.bcast(np.zeros(2))
    count = int(header[1])
    n_index = index_length(count, np.empty(bitmap_words(p), dtype=np.uint32))
    payload = np.empty(count + (n_index + 1) // 2)
    if payload.shape[0]:
        payload = wire.bcast(payload)
    free = decode_index(payload[count:].view(np.int32)[:n_index], count, p,
                        np.empty(p, dtype=np.int32))
    weighted_mu = np.zeros(p)
    weighted_mu[free] = payload[:count]
    return float(header[0]), weighted_mu, frozen_from_free(free, p, group_indptr)


def squared_conjugate_sum(rho_sq, y_rho, scale):
    """sum_i c_i f*(-theta_i / c_i) for the squared loss at theta = rho / scale, from
    sum rho^2 / c (``rho_sq``) and sum y rho: f*(u) = u^2 / 2 + u y gives
    sum rho^2 / c / (2 s^2) - sum y rho / s (without sample weights c = 1). The workers
    send both sums in the certificate's one reduction, so the server finds D at any scale
    with no second round (the scale's broadcast and the conjugate's reduction that other
    losses need)."""
    return rho_sq / (2.0 * scale * scale) - y_rho / scale


def fold_intercept_shift(sums, shift, weight, y_sum, column_sums):
    """The certificate's sums [sum c f, sum rho, sum rho^2 / c, sum y rho, A^T rho] of the
    squared loss over rows of total weight ``weight`` = sum c (their count without
    sample weights) at the intercept b + shift, in place, from those at b: every margin
    rises by the shift and rho_i = c_i (y_i - z_i) falls by c_i shift, so with S = sum rho,
    sum c f = sum rho^2 / c / 2 changes by weight shift^2 / 2 - shift S, sum rho^2 / c by
    twice that, sum y rho by -shift sum c y (``y_sum``), S by -weight shift and A^T rho
    by -shift A^T c (``column_sums``). With shift = S / sum c over all rows this is the
    exact refit b += sum c (y - z) / sum c, folded into the certificate's one reduction
    instead of a round of its own before it."""
    s = float(sums[1])
    sums[0] += 0.5 * weight * shift * shift - shift * s
    sums[2] += weight * shift * shift - 2.0 * shift * s
    sums[3] -= shift * y_sum
    sums[1] -= weight * shift
    sums[CERTIFICATE_SUMS:] -= shift * column_sums


def intercept_refit(wire, code, z, y, b, n, sample_weight=UNWEIGHTED):
    """The exact intercept optimum over all shards (``problem.refit_intercept`` on the
    reduced sums; every rank calls it, the server with no rows; ``n``: the total weight
    of the rows, ``sample_weight`` this rank's in the kernel form); z (margins with b)
    shifted in place to the new b, which is returned. Not for a quadratic loss, whose
    refit rides in the certificate's reduction (``fold_intercept_shift``)."""
    z0 = z - b
    local = intercept_sums(code, z0, y, sample_weight)
    new_b = refit_intercept(lambda at: wire.allreduce(local(at)), b, n)
    z += new_b - b
    return new_b


def close_channel(wire, channel):
    """Detach the channel's collectives from ``wire`` and close it (collective: every
    rank calls it at the same point)."""
    wire.detach()
    channel.close()


def server_vector(wire, vector):
    """The server's float64 ``vector`` (None on the workers) on every rank: its length is
    broadcast, then its values when there are any."""
    count = np.array([0.0 if vector is None else float(vector.shape[0])])
    count = int(wire.bcast(count)[0])
    if not count:
        return np.zeros(0)
    return wire.bcast(vector if vector is not None else np.empty(count))


def null_intercept(wire, y, loss_code, fit_intercept, sample_weight=UNWEIGHTED):
    """The optimal intercept at x = 0 over every shard (``y``: this rank's labels, empty
    on the server; ``sample_weight``: its rows' weights c in the kernel form): squared
    loss, the global c-weighted mean of y; logistic, log(W+ / W-), W+- the weights of
    the rows labelled +1 and -1 (their counts without weights); 0 without an intercept.
    The same value on every rank."""
    if not fit_intercept:
        return 0.0
    if sample_weight.shape[0]:
        local = [float(sample_weight @ y), float(np.sum(sample_weight[y > 0])),
                 float(np.sum(sample_weight))]
    else:
        local = [float(np.sum(y)), float(np.sum(y > 0)), float(y.shape[0])]
    y_sum, positive, total = wire.allreduce(np.array(local))
    return loss_of_code(loss_code).null_intercept(float(y_sum), float(positive),
                                                  float(total))


def distributed_null_objective(wire, y, n, loss_code, fit_intercept,
                               sample_weight=UNWEIGHTED):
    """P(0) = (1/n) sum_i c_i f(b0, y_i) at the optimal intercept b0 (``null_intercept``)
    over every shard (``y`` None on the server; ``sample_weight``: this rank's c in the
    kernel form), as ``Problem.null_objective``: the scale of the relative gap. The same
    value on every rank."""
    y = np.zeros(0) if y is None else y
    b = null_intercept(wire, y, loss_code, fit_intercept, sample_weight)
    local = mean_loss(loss_code, np.full(y.shape[0], b), y, sample_weight) * y.shape[0] \
        if y.shape[0] else 0.0
    return float(wire.allreduce(np.array([local]))[0]) / n


def distributed_lam_max(comm, problem, penalty, n, loss_code, fit_intercept):
    """lam_max = Omega^D(A^T rho(0)) / n over every shard (rank 0 holds none): rho(0) at
    x = 0 with the exact intercept (``null_intercept``; the shards' sample weights in
    it). The same value on every rank."""
    wire = Wire(comm)
    y = np.zeros(0) if problem is None else problem.full_active_set().y
    weights = UNWEIGHTED if problem is None else problem.full_active_set().sample_weight
    b = null_intercept(wire, y, loss_code, fit_intercept, weights)
    local = np.empty(penalty.ids.shape[0]) if problem is None else \
        problem.full_active_set().residual_correlation(loss_code, b)
    total = wire.reduce(local, root_blank=True)
    value = np.zeros(1)
    if comm.Get_rank() == 0:
        value[0] = penalty.restricted(np.arange(penalty.n_blocks)).dual_norm(total) / n
    return float(wire.bcast(value)[0])
