"""Block coordinate descent on column-major data: the inner loop of the PSE baselines
(parallel static screening + asynchronous grouped coordinate descent, docs/design.md §4).

For a block g with columns A_g (CSC), margins z = A x + b kept up to date:

    grad_g = (1/n) A_g^T (c f'(z))
    x_g   <- prox_{(lam w_g / L_g) ||.||}(x_g - grad_g / L_g)
    z     += A_g (x_g_new - x_g_old)

with L_g = L_f ||C^(1/2) A_g||_F^2 / n.

c_i are the sample weights (C = diag(c); all 1 without them).
||A_g||_F^2 bounds the spectral norm squared, so the step is safe for groups and exact
(one-dimensional Lipschitz constant) for L1. With ``positive`` (the L1 penalty with
x >= 0) the prox is that of the block soft-threshold of max(u, 0), for one coordinate
max(u - t, 0). Threads that share z and own disjoint blocks
run this lock-free: x stays consistent (one writer per coordinate) while racing additions
to z may be lost, so the caller recomputes z exactly after every epoch.
"""
from numba import njit

from ..losses import loss_derivative, row_weight
from ..penalties import block_soft_threshold_
from .svrg import INTERCEPT_SYNC, block_buffers


@njit(cache=True, nogil=True)
def cd_epoch(col_indptr, col_rows, col_data, y, code, sample_weight, x, z, intercept,
             column_means, order, block_indptr, block_lipschitz, thresholds, positive):
    """One block coordinate descent update per block in ``order`` (x, z, intercept in
    place); z = A x holds the margins without the intercept, c_i f' is taken at z + b
    (c_i = ``losses.row_weight`` of ``sample_weight``, the kernel form).
    thresholds[g] = lam w_g; ``positive``: x >= 0 (module docstring). A block whose
    columns are empty (L_g = 0) is set to zero.

    column_means[j] = the c-weighted mean of column j, sum_i c_i a_ij / sum_i c_i,
    profiles the intercept out for the squared loss:
    b = sum_i c_i (y - A x)_i / sum_i c_i moves by -m_j delta_j with every update, which
    makes this exact coordinate descent on the centred columns a_j - m_j (pass L_g of
    the centred block);
    zeros keep b fixed (logistic loss or no intercept: the outer loop refits it).
    Like the SVRG kernels, each call steps a private b and adds its delta to the shared
    ``intercept[0]`` every INTERCEPT_SYNC blocks: threads sharing b see each other's
    moves within a few blocks, and a racing add is rare enough to lose almost nothing."""
    n = z.shape[0]
    old, new, local_ids = block_buffers(block_indptr)
    b = intercept[0]
    b_delta = 0.0
    for t in range(order.shape[0]):
        if t % INTERCEPT_SYNC == INTERCEPT_SYNC - 1:
            intercept[0] += b_delta
            b = intercept[0]
            b_delta = 0.0
        g = order[t]
        start = block_indptr[g]
        size = block_indptr[g + 1] - start
        lipschitz = block_lipschitz[g]
        if lipschitz <= 0.0:
            for q in range(size):
                x[start + q] = 0.0
            continue
        for q in range(size):
            j = start + q
            grad = 0.0
            for k in range(col_indptr[j], col_indptr[j + 1]):
                r = col_rows[k]
                grad += col_data[k] * row_weight(sample_weight, r) * \
                    loss_derivative(code, z[r] + b, y[r])
            old[q] = x[j]
            new[q] = old[q] - grad / (n * lipschitz)
            if positive:
                new[q] = max(new[q], 0.0)
        block_soft_threshold_(new, local_ids, 0, size, thresholds[g] / lipschitz)
        for q in range(size):
            delta = new[q] - old[q]
            if delta != 0.0:
                j = start + q
                x[j] = new[q]
                b -= column_means[j] * delta
                b_delta -= column_means[j] * delta
                for k in range(col_indptr[j], col_indptr[j + 1]):
                    z[col_rows[k]] += col_data[k] * delta
    intercept[0] += b_delta
