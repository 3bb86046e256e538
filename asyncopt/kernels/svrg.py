"""Sparse proximal SVRG inner loop (thesis eq. 3-6, 3-8) and its naive variant.

docs/design.md §2.

For a sampled row i with active support S_i, snapshot margins z~ and snapshot gradient mu:

    v_j = c_i (f'(a_i^T x + b) - f'(z~_i)) a_ij + d_g mu_j   (j in the blocks g touching S_i)
    x_g <- prox_{eta lam d_g w_g ||.||}(x_g - eta v_g)       (those blocks only)

with d_g = n / n_g (n_g: rows touching block g), so that E_i[v] = grad F(x) and
E_i[sum_{g touching S_i} d_g w_g ||x_g||] = Omega(x). c_i is row i's sample weight
(``rows.sample_weight``, ``losses.row_weight``; 1 without weights): rows are sampled
uniformly whatever their weight, and a row's step is on its weighted loss c_i f_i, so the
estimate stays unbiased for F(x) = (1/n) sum_i c_i f_i; the step's L_max carries
max_i c_i (``ActiveSet.max_row_sq_norm``); uniform sampling keeps the chunked reads of
``ddss.epoch_rows`` (docs/design.md §1, sample weights). The elastic net's L2 part
(``blocks.l2``: Omega_j(x_j) = w_j (|x_j| + l2 x_j^2 / 2)) is separable like the L1
part and reweighted alike, so it goes into the same lazy prox: the soft threshold at
eta lam d_j w_j, then the shrink 1 / (1 + eta lam l2 d_j w_j) = 1 / (1 + eta mu d_j w_j)
(``penalties.prox_elastic_net``); mu, the anchor's gradient and the step stay the
loss's.

The intercept is the unpenalized coordinate b' = b / s of a column of constant value s in
every row (d_b = 1): b <- b - eta s^2 (f'(z) - f'(z~_i) + mu_b), the kernels taking
``eta_intercept`` = eta s^2 (0 without intercept). The solver picks s^2 = the mean square
of the stored entries, so the intercept is conditioned like a typical feature and adds s^2,
not 1, to L_max (on unit-norm CTR rows this nearly doubles the step).

With ``variance_reduced=False`` this is DDSS-Naive: v_j = c_i f'(a_i^T x + b) a_ij, same
sparse prox (the caller passes a decaying step through the thresholds and eta).

The blocks of the compacted active problem are contiguous: block g holds features
block_indptr[g] .. block_indptr[g+1]-1 and feature_block[j] is the block of feature j.

Every epoch kernel takes ``(rows, blocks, step, x, intercept, samples)`` (the SVRG ones a
``clock`` after them), the groups of ``kernels.workspace``.
"""
import numpy as np
from numba import njit

from ..losses import loss_derivative, row_weight
from ..penalties import block_soft_threshold_, prox_elastic_net, prox_l1


@njit(cache=True, inline="always")
def row_margin(indptr, indices, data, x, b, i):
    """a_i^T x + b."""
    acc = b
    for k in range(indptr[i], indptr[i + 1]):
        acc += data[k] * x[indices[k]]
    return acc


@njit(cache=True, inline="always")
def gradient_difference(code, z, z_snap_i, y_i, c_i, variance_reduced):
    """c_i (f'(z) - f'(z~_i)) (variance reduced) or c_i f'(z) (naive): the scalar
    multiplying a_i, c_i the row's sample weight (1.0 without weights: the product is
    then exact)."""
    if variance_reduced:
        return c_i * (loss_derivative(code, z, y_i) - loss_derivative(code, z_snap_i, y_i))
    return c_i * loss_derivative(code, z, y_i)


@njit(cache=True)
def svrg_direction(i, indptr, indices, data, y, code, sample_weight, x, b, z_snap,
                   weighted_mu, block_indptr, feature_block, out):
    """Dense copy of the sparse estimate v (eq. 3-6) for row i into ``out``; returns the
    intercept component. ``weighted_mu[j] = d_g mu_j`` (zero outside the touched blocks);
    ``sample_weight``: the rows' c_i in the kernel form (``losses.row_weight``)."""
    out[:] = 0.0
    diff = gradient_difference(code, row_margin(indptr, indices, data, x, b, i),
                               z_snap[i], y[i], row_weight(sample_weight, i), True)
    for k in range(indptr[i], indptr[i + 1]):
        g = feature_block[indices[k]]
        for j in range(block_indptr[g], block_indptr[g + 1]):
            out[j] = weighted_mu[j]
    for k in range(indptr[i], indptr[i + 1]):
        out[indices[k]] += diff * data[k]
    return diff


@njit(cache=True)
def block_buffers(block_indptr):
    """(old, new, local_ids) work buffers sized for the largest block."""
    max_size = 0
    for g in range(block_indptr.shape[0] - 1):
        max_size = max(max_size, block_indptr[g + 1] - block_indptr[g])
    return np.empty(max_size), np.empty(max_size), np.arange(max_size)


@njit(cache=True, inline="always")
def add_block_prox_delta(x, start, size, scratch, mu, eta, threshold, old, new, local_ids):
    """Form prox_{threshold ||.||}(x_g - eta (scratch_g + mu_g)) from one read of x_g in the
    private buffer ``new`` and add its delta to x_g (eq. 3-10): a thread sharing x never
    shrinks a block another thread has half-updated."""
    for q in range(size):
        old[q] = x[start + q]
        new[q] = old[q] - eta * (scratch[start + q] + mu[start + q])
    block_soft_threshold_(new, local_ids, 0, size, threshold)
    for q in range(size):
        x[start + q] += new[q] - old[q]


@njit(cache=True)
def scatter_buffers(n_features, block_indptr):
    """(scratch, stamp, touched) work buffers of scatter_row."""
    n_blocks = block_indptr.shape[0] - 1
    return (np.zeros(n_features), np.full(n_blocks, -1, dtype=np.int64),
            np.empty(n_blocks, dtype=np.int64))


@njit(cache=True, inline="always")
def scatter_row(indptr, indices, data, i, diff, scratch, feature_block, stamp, touched, t):
    """scratch += diff a_i and list in ``touched`` the blocks row i touches (each once,
    ``stamp[g] == t`` marking those seen at step t); returns how many."""
    n_touched = 0
    for k in range(indptr[i], indptr[i + 1]):
        j = indices[k]
        scratch[j] += diff * data[k]
        g = feature_block[j]
        if stamp[g] != t:
            stamp[g] = t
            touched[n_touched] = g
            n_touched += 1
    return n_touched


INTERCEPT_SYNC = 32


@njit(cache=True, inline="always")
def step_intercept(intercept, b, delta, step, t, shared):
    """b -= step; with ``shared`` (the tracked kernels) the delta is also published to
    ``intercept[0]`` every INTERCEPT_SYNC steps and b re-read. Returns (b, delta)."""
    b -= step
    if shared:
        delta -= step
        if (t + 1) % INTERCEPT_SYNC == 0:
            intercept[0] += delta
            b = intercept[0]
            delta = 0.0
    return b, delta


@njit(cache=True, inline="always")
def finish_intercept(intercept, b, delta, shared):
    """At the end of an epoch: with ``shared`` add the delta not yet published to
    ``intercept[0]`` (other threads' steps stay in it); without, store the local b."""
    if shared:
        intercept[0] += delta
    else:
        intercept[0] = b


CLOCK_SYNC = 32


@njit(cache=True, inline="always")
def tick(clock, last, pending, staleness, track, force):
    """With ``track``: one more step of this thread; every CLOCK_SYNC of them (or with
    ``force``, at the end of its slice) it adds them to the shared ``clock`` and charges
    the steps the other threads added since its last visit (clock[0] - last) to
    staleness = [sum of tau, max]: each step's tau counts the other threads' steps that
    finished between its read of x and its write, and the steps of one window cover it
    back to back, so those steps are the window's sum of tau exactly (up to the other
    threads' own windows) and an upper bound on any one tau in it. The window keeps the
    clock's cache line from moving between the cores at every step. Returns (last,
    pending)."""
    if track:
        pending += 1
        if pending == CLOCK_SYNC or force:
            now = clock[0]
            others = now - last
            staleness[0] += others
            staleness[1] = max(staleness[1], others)
            last = now + pending
            clock[0] = last
            pending = 0
    return last, pending


def _make_epoch_kernels(track_staleness, elastic=False):
    """The L1 and group epoch kernels; with track_staleness (a compile-time constant, so
    the serial kernels carry no trace of it) every step also measures its delay tau: the
    steps other threads finished on the shared ``clock`` between this step's read of x and
    its write (Assumption 3), accumulated as staleness = [sum tau, max tau] a window of
    CLOCK_SYNC steps at a time (``tick``).

    The tracked kernels are the ones threads run together, so they also share the
    intercept: each keeps a private b and every INTERCEPT_SYNC steps adds its accumulated
    delta to the shared ``intercept[0]`` and re-reads it. (A private b per thread for the
    whole epoch would lag n/T steps behind the others; a write to the shared cell every
    step would bounce its cache line between cores.) A racing add that loses an update
    only delays b: the outer loop refits it exactly.

    ``elastic`` (a compile-time constant too): the L1 kernel applies the elastic net's
    shrink, reading ``blocks.l2`` (``penalties.prox_elastic_net``); without it the
    kernel's prox is the L1 prox alone, the Lasso's code with no trace of the shrink, and
    it refuses blocks with l2 > 0 (a ValueError, once per call). The penalty picks the
    kernel (``BlockPenalty.svrg_kernel``).

    The kernels close over the flags alone: numba keys its on-disk cache of a closure by a
    hash of the closed-over values, and closed-over dispatchers hash differently in every
    process, so each process would compile the kernels again."""

    @njit(cache=True, nogil=True)
    def epoch_l1(rows, blocks, step, x, intercept, samples, clock):
        indptr, indices, data, y, code, sample_weight = rows
        positive = blocks.positive
        if not elastic and blocks.l2 > 0.0:
            raise ValueError("an L2 strength (blocks.l2 > 0) needs the elastic kernel")
        l2 = blocks.l2 if elastic else 0.0
        z_snap, weighted_mu, mu_intercept, thresholds, eta, eta_intercept, \
            variance_reduced = step
        steps, staleness = clock
        b, delta = intercept[0], 0.0
        last, pending = (steps[0] if track_staleness else 0), 0
        n_steps = samples.shape[0]
        for t in range(n_steps):
            i = samples[t]
            z = row_margin(indptr, indices, data, x, b, i)
            diff = gradient_difference(code, z, z_snap[i], y[i],
                                       row_weight(sample_weight, i), variance_reduced)
            for k in range(indptr[i], indptr[i + 1]):
                j = indices[k]
                if thresholds[j] < np.inf:        # +inf: frozen at zero for the epoch
                    x[j] = prox_elastic_net(
                        x[j] - eta * (diff * data[k] + weighted_mu[j]), thresholds[j],
                        positive, l2)
            b, delta = step_intercept(intercept, b, delta,
                                      eta_intercept * (diff + mu_intercept), t,
                                      track_staleness)
            last, pending = tick(steps, last, pending, staleness, track_staleness,
                                 t == n_steps - 1)
        finish_intercept(intercept, b, delta, track_staleness)

    @njit(cache=True, nogil=True)
    def epoch_group(rows, blocks, step, x, intercept, samples, clock):
        indptr, indices, data, y, code, sample_weight = rows
        block_indptr, feature_block = blocks.indptr, blocks.feature_block
        z_snap, weighted_mu, mu_intercept, thresholds, eta, eta_intercept, \
            variance_reduced = step
        steps, staleness = clock
        scratch, stamp, touched = scatter_buffers(x.shape[0], block_indptr)
        old, new, local_ids = block_buffers(block_indptr)
        b, delta = intercept[0], 0.0
        last, pending = (steps[0] if track_staleness else 0), 0
        n_steps = samples.shape[0]
        for t in range(n_steps):
            i = samples[t]
            z = row_margin(indptr, indices, data, x, b, i)
            diff = gradient_difference(code, z, z_snap[i], y[i],
                                       row_weight(sample_weight, i), variance_reduced)
            n_touched = scatter_row(indptr, indices, data, i, diff, scratch, feature_block,
                                    stamp, touched, t)
            for m in range(n_touched):
                g = touched[m]
                if thresholds[g] == np.inf:       # frozen at zero for the epoch
                    continue
                start = block_indptr[g]
                add_block_prox_delta(x, start, block_indptr[g + 1] - start, scratch,
                                     weighted_mu, eta, thresholds[g], old, new, local_ids)
            for k in range(indptr[i], indptr[i + 1]):
                scratch[indices[k]] = 0.0
            b, delta = step_intercept(intercept, b, delta,
                                      eta_intercept * (diff + mu_intercept), t,
                                      track_staleness)
            last, pending = tick(steps, last, pending, staleness, track_staleness,
                                 t == n_steps - 1)
        finish_intercept(intercept, b, delta, track_staleness)

    return epoch_l1, epoch_group


svrg_epoch_l1, svrg_epoch_group = _make_epoch_kernels(False)
svrg_epoch_l1.__doc__ = """Sparse prox-SVRG steps (``workspace.SvrgStep`` ``step``) for the
rows (``workspace.Rows``) in ``samples``, L1: blocks of size 1 (of ``blocks``, only
``positive`` is read: the prox max(u - t, 0) keeps x >= 0; l2 must be 0, see
``svrg_epoch_l1_elastic``); x and
intercept (length-1 array, step eta_intercept) updated in place; thresholds[j] =
eta lam d_j w_j, or +inf for a coordinate frozen at zero for the epoch
(``ddss.freeze_optimal_zeros``), which the steps skip. ``clock`` (``workspace.Clock``) is
ignored (see the tracked twin)."""
svrg_epoch_group.__doc__ = """Sparse prox-SVRG steps for contiguous blocks
(``workspace.Blocks``, group penalty), thresholds[g] = eta lam d_g w_g, or +inf for a
block frozen at zero for the epoch (``ddss.freeze_optimal_zeros``), which the steps
skip, forming no prox for them. Each touched
block's new value is formed in a private buffer from one read of x_g and only its delta
is added to x (eq. 3-10), so threads sharing x never shrink a block another thread has
half-updated."""
svrg_epoch_l1_tracked, svrg_epoch_group_tracked = _make_epoch_kernels(True)
# the elastic net's L1 kernels: ``svrg_epoch_l1``'s steps with the prox of
# ``penalties.prox_elastic_net`` at ``blocks.l2`` (the shrink 1 / (1 + t l2) after the
# soft threshold t = eta lam d_j w_j); the group kernels of these calls are not used
svrg_epoch_l1_elastic = _make_epoch_kernels(False, True)[0]
svrg_epoch_l1_elastic_tracked = _make_epoch_kernels(True, True)[0]


@njit(cache=True, nogil=True)
def saga_epoch_l1(rows, blocks, step, x, intercept, samples):
    """Sparse proximal SAGA steps (ProxASAGA, Pedregosa et al. 2017) for L1 blocks.

    memory[i] holds the last c_i f'(z_i) computed for row i (c_i its sample weight,
    ``rows.sample_weight``) and ``average`` = (1/n) A^T memory (average_intercept[0] its
    intercept component). For row i, with g = c_i f'(z):
        v_j = (g - memory[i]) a_ij + d_j average_j,   x_j <- prox(x_j - eta v_j)
    then average += (g - memory[i]) a_i / n and memory[i] = g; the intercept moves
    with eta_intercept (private per call; the caller sums the deltas of parallel calls).
    ``step`` is a ``workspace.SagaStep``; ``blocks.positive``: the prox keeps x >= 0.
    """
    indptr, indices, data, y, code, sample_weight = rows
    positive = blocks.positive
    memory, average, average_intercept, reweight, thresholds, eta, eta_intercept = step
    n = memory.shape[0]
    b = intercept[0]
    for t in range(samples.shape[0]):
        i = samples[t]
        z = row_margin(indptr, indices, data, x, b, i)
        grad = row_weight(sample_weight, i) * loss_derivative(code, z, y[i])
        diff = grad - memory[i]
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            x[j] = prox_l1(x[j] - eta * (diff * data[k] + reweight[j] * average[j]),
                           thresholds[j], positive)
            average[j] += diff * data[k] / n
        b -= eta_intercept * (diff + average_intercept[0])
        average_intercept[0] += diff / n
        memory[i] = grad
    intercept[0] = b


@njit(cache=True, nogil=True)
def dense_svrg_epoch(rows, blocks, step, x, intercept, samples):
    """Proximal SVRG with dense steps (the ProxASVRG baseline: no sparse prox, no
    reweighting): for row i, v = c_i (f'(z) - f'(z~_i)) a_i + mu over every coordinate and
    x <- prox_{eta lam Omega}(x - eta v) over every block (thresholds[g] = eta lam w_g),
    added as deltas so threads may share x (with ``blocks.positive``, each sum clipped
    at 0: a racing thread's delta may not take x below the constraint). O(p) per step:
    the cost DDSS's sparse step removes. ``step`` is a ``workspace.SvrgStep`` whose
    weighted_mu is mu."""
    indptr, indices, data, y, code, sample_weight = rows
    block_indptr, positive = blocks.indptr, blocks.positive
    z_snap, mu, mu_intercept, thresholds, eta, eta_intercept, _ = step
    n_blocks = block_indptr.shape[0] - 1
    scratch = np.zeros(x.shape[0])
    old, new, local_ids = block_buffers(block_indptr)
    singletons = n_blocks == x.shape[0]
    b = intercept[0]
    for t in range(samples.shape[0]):
        i = samples[t]
        z = row_margin(indptr, indices, data, x, b, i)
        diff = gradient_difference(code, z, z_snap[i], y[i], row_weight(sample_weight, i),
                                   True)
        for k in range(indptr[i], indptr[i + 1]):
            scratch[indices[k]] += diff * data[k]
        if singletons:      # the L1 penalty: the scalar prox, no block norm
            for j in range(n_blocks):
                before = x[j]
                moved = x[j] + (prox_l1(before - eta * (scratch[j] + mu[j]),
                                        thresholds[j], positive) - before)
                x[j] = max(moved, 0.0) if positive else moved
        else:
            for g in range(n_blocks):
                start = block_indptr[g]
                add_block_prox_delta(x, start, block_indptr[g + 1] - start, scratch, mu,
                                     eta, thresholds[g], old, new, local_ids)
        for k in range(indptr[i], indptr[i + 1]):
            scratch[indices[k]] = 0.0
        b -= eta_intercept * (diff + mu_intercept)
    intercept[0] = b


@njit(cache=True, nogil=True)
def saga_epoch_group(rows, blocks, step, x, intercept, samples):
    """Sparse proximal SAGA steps (ProxASAGA) for contiguous blocks (group penalty).

    As saga_epoch_l1, with the step taken per touched block g:
        v_g = (f'(z) - memory[i]) a_i,g + d_g average_g,
        x_g <- prox_{thresholds[g]}(x_g - eta v_g)
    formed from one read of x_g and added as a delta (eq. 3-10), like the SVRG group kernel.
    """
    indptr, indices, data, y, code, sample_weight = rows
    block_indptr, feature_block = blocks.indptr, blocks.feature_block
    memory, average, average_intercept, reweight, thresholds, eta, eta_intercept = step
    n = memory.shape[0]
    scratch, stamp, touched = scatter_buffers(x.shape[0], block_indptr)
    no_shift = np.zeros(x.shape[0])
    old, new, local_ids = block_buffers(block_indptr)
    b = intercept[0]
    for t in range(samples.shape[0]):
        i = samples[t]
        z = row_margin(indptr, indices, data, x, b, i)
        grad = row_weight(sample_weight, i) * loss_derivative(code, z, y[i])
        diff = grad - memory[i]
        n_touched = scatter_row(indptr, indices, data, i, diff, scratch, feature_block,
                                stamp, touched, t)
        for m in range(n_touched):
            g = touched[m]
            start = block_indptr[g]
            stop = block_indptr[g + 1]
            for j in range(start, stop):
                scratch[j] += reweight[j] * average[j]
            add_block_prox_delta(x, start, stop - start, scratch, no_shift, eta,
                                 thresholds[g], old, new, local_ids)
            for j in range(start, stop):
                scratch[j] = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            average[indices[k]] += diff * data[k] / n
        b -= eta_intercept * (diff + average_intercept[0])
        average_intercept[0] += diff / n
        memory[i] = grad
    intercept[0] = b
