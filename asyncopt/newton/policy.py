"""The policy layer of the support Newton step: when it is tried (``StallWatch``), on
which coordinates (x's firm support, the zeros that enter S, the non-zeros pruned first)
and within which limits (|S| at most MAX_SUPPORT, HESSIAN_FREE_MAX_SUPPORT for the group
step; whether the direction comes from Hessian-vector products and how many a step may
take). Functions of x, A^T rho, the weights and counts; no rows are read.

The optimality condition these decisions test, for x minimising
P(x, b) = (1/n) sum_i f(a_i^T x + b) + lam sum_j w_j |x_j| with rho = -f'(z):
|A_j^T rho| <= n lam w_j at a zero x_j, = n lam w_j (with sign(x_j)) at a non-zero; for a
group penalty ||A_g^T rho|| <= n lam w_g at a zero group. For the positive L1 penalty
(x >= 0) the condition at a zero is one-sided, A_j^T rho <= n lam w_j, and every
coordinate enters S with the sign +1 (``positive`` below)."""
import numpy as np

from ..penalties import contiguous_block_norms, l1_dual_norms, per_feature

MAX_SUPPORT = 2000       # |S| above which the step is not tried
MIN_PRODUCTS = 100       # Hessian-vector products a step may take at least
STALL_RATIO = 0.5        # try the step after an epoch that cut the gap by less than 2x
SUPPORT_CHURN = 0.2      # try only when at most this share of S changed in the epoch
PRUNED_CHURN = 0.05      # ... this share where the step prunes x to its firm support
TRY_EPOCHS = 2           # ... or when at its rate the gap needs more epochs than this
DROP_MARGIN = 0.5        # non-zeros with |A_j^T rho| < n lam w_j / 2 go to zero at once
ENTERING_SHARE = 0.05    # zeros of x that violate the optimality condition, at most this
ENTERING_MIN = 10        # share of |S| (and at least this many), enter S with their sign
ENTERING_LEVEL = 0.9     # ... and zeros up to 10% below the condition's bound
POPULAR_SHARE = 0.1      # where the Hessian is summed, the zeros among this share of
                         # |S| largest columns too (``popular_zeros``)
CHAIN_STEPS = 2          # chained steps in a row at most (StallWatch.should_chain)
HESSIAN_FREE_MAX_SUPPORT = 8000   # |S| above which the group step is not tried


def settled_zeros(correlation_S, n, lam, weights_S, intercept):
    """Mask of the coordinates of S (and False for the intercept) whose |A_j^T rho| is
    below (1 - DROP_MARGIN) n lam w_j: at a solution every non-zero has it equal to
    n lam w_j, and these are the small non-zeros that asynchronous steps leave behind,
    which the step sets to zero rather than following each to zero along its path."""
    drop = np.abs(correlation_S) < (1.0 - DROP_MARGIN) * n * lam * weights_S
    return np.append(drop, False) if intercept else drop


def firm_support(x, correlation, n, lam, weights, block_indptr=None):
    """Mask of the non-zeros of x that are not ``settled_zeros``: |A_j^T rho| at least
    (1 - DROP_MARGIN) n lam w_j. ``StallWatch`` counts the changes of this set from one
    epoch to the next: asynchronous steps keep flipping small non-zeros, many more than
    of this set, and the step drops those anyway. For a group penalty (``block_indptr``:
    its groups' feature ranges, ``weights`` per group), per feature: whether its group
    is non-zero with ||A_g^T rho|| at least (1 - DROP_MARGIN) n lam w_g."""
    if block_indptr is None:
        return (x != 0) & ~settled_zeros(correlation, n, lam, weights, False)
    firm = (contiguous_block_norms(x, block_indptr) > 0.0) & \
        (contiguous_block_norms(correlation, block_indptr) >=
         (1.0 - DROP_MARGIN) * n * lam * np.asarray(weights, np.float64))
    return per_feature(firm, block_indptr)


def uses_hessian_free(support_size):
    """Whether the step finds its direction with Hessian-vector products alone
    (``model.hessian_free_direction``), not also from the Hessian's orthant path
    (``model.orthant_newton_target``), and under MPI across machines with products the
    workers answer (``solvers.mpi.cg_products_from_shares``): by bytes. The Hessian is
    (|S| + 1)(|S| + 2) / 2 numbers from every worker, a product 2 (|S| + 1) (v out, H v
    back), so products win once |S| + 2 > 4 MIN_PRODUCTS (and ``product_budget`` then
    allows the products that cost as much as the Hessian). On one process the Hessian is
    formed anyway: no bytes to save."""
    return support_size + 2 > 4 * MIN_PRODUCTS


def product_budget(dim):
    """Hessian-vector products one step may take: as many as cost the bytes of the
    Hessian's upper triangle under MPI ((dim + 1) / 4 products of 2 dim numbers for
    dim (dim + 1) / 2 numbers), at least MIN_PRODUCTS."""
    return max(MIN_PRODUCTS, (dim + 1) // 4)


def group_uses_hessian_free(support_size):
    """Whether the group step finds its target from Hessian-vector products, each a pass
    over the rows restricted to S (``group_model.hessian_free_group_minimum``; under MPI
    the workers' products), rather than from the Hessian itself
    (``group_model.group_model_minimum``): above MAX_SUPPORT coordinates, on every
    backend, where the Hessian is over 16 MB a worker to form and send. Below, the dense
    model stays: its block coordinate descent copes with nearly equal columns, where the
    model from products does not."""
    return support_size > MAX_SUPPORT


def entering_limit(support_size):
    """How many zeros of x may enter S with ``entering_coordinates``: ENTERING_SHARE of
    |S|, at least ENTERING_MIN, and no more than MAX_SUPPORT - |S|."""
    return int(max(0, min(max(ENTERING_MIN, np.ceil(ENTERING_SHARE * support_size)),
                          MAX_SUPPORT - support_size)))


def violating_zeros(x, correlation, n, lam, weights, block_indptr=None, level=1.0,
                    positive=False):
    """(the zeros j of x with |A_j^T rho| > level n lam w_j, the ratio |A_j^T rho| /
    (n lam w_j) of every coordinate; ``positive``: max(A_j^T rho, 0) for |A_j^T rho|);
    for a group penalty (``block_indptr``, ``weights`` per group), the zero groups g
    with ||A_g^T rho|| > level n lam w_g and the ratio of every group. level 1: the
    zeros that violate the optimality condition."""
    if block_indptr is None:
        magnitude, zero = l1_dual_norms(correlation, positive), x == 0
    else:
        magnitude = contiguous_block_norms(correlation, block_indptr)
        zero = contiguous_block_norms(x, block_indptr) == 0.0
    ratio = magnitude / (n * lam * np.asarray(weights, np.float64))
    return np.flatnonzero(zero & (ratio > level)), ratio


def entering_coordinates(x, correlation, n, lam, weights, limit, column_sq=None,
                         positive=False):
    """The zeros of x that violate the optimality condition |A_j^T rho| <= n lam w_j, or
    come within 10% of violating it (ENTERING_LEVEL), the ``limit`` largest by
    |A_j^T rho| / (n lam w_j), each with the sign it would enter with, sign(A_j^T rho):
    coded as (j + 1) sign (float64, by j) so that one broadcast carries both. A step on
    the non-zeros of x alone cannot certify while such a coordinate is missing, and a
    coordinate close below the bound can be one of the solution's. ``positive`` (x >=
    0): the condition A_j^T rho <= n lam w_j, and every coordinate enters with +1 (the
    popular zeros too).

    Given ``column_sq`` (||A_:j||^2; the squared loss where the step sums the Hessian),
    the ``popular_zeros`` enter too, whatever their |A_j^T rho|, with the sign of A_j^T
    rho (+1 at 0). Most stay at zero: the projected direction holds a zero whose
    gradient points out of its orthant, and the move's second solve
    (``model._with_violating_zeros``) lets in those that violate at its end, which it
    can tell only for coordinates of S: without them a step can leave a frequent feature
    of the solution at zero and need a chained one. S stays within MAX_SUPPORT: the
    largest columns' zeros first. The logistic loss goes without them
    (benchmarks/notes/newton.md)."""
    violating, ratio = violating_zeros(x, correlation, n, lam, weights,
                                       level=ENTERING_LEVEL, positive=positive)
    if violating.shape[0] > limit:
        violating = np.sort(violating[np.argpartition(-ratio[violating],
                                                      limit - 1)[:limit]]) \
            if limit > 0 else violating[:0]
    if column_sq is not None:
        room = MAX_SUPPORT - int(np.count_nonzero(x)) - violating.shape[0]
        violating = np.union1d(violating, popular_zeros(x, column_sq, max(room, 0)))
    if positive:
        return violating + 1.0
    return (violating + 1.0) * np.where(correlation[violating] < 0.0, -1.0, 1.0)


def popular_zeros(x, column_sq, most=None):
    """The zeros of x among the POPULAR_SHARE |x's non-zeros| columns of the largest
    norm (``column_sq``: ||A_:j||^2), at most ``most`` of them (the largest columns'),
    sorted: the features that asynchronous epochs can leave at zero while the solution
    has them (``entering_coordinates``)."""
    count = min(int(np.ceil(POPULAR_SHARE * np.count_nonzero(x))), x.shape[0])
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    column_sq = np.asarray(column_sq)
    largest = np.argpartition(-column_sq, count - 1)[:count]
    zeros = largest[x[largest] == 0.0]
    if most is not None and zeros.shape[0] > most:
        zeros = zeros[np.argsort(-column_sq[zeros], kind="stable")[:most]]
    return np.sort(zeros)


def entering_groups(x, correlation, n, lam, weights, block_indptr, max_support=None):
    """The zero groups of x that violate the optimality condition most (largest
    ||A_g^T rho|| / (n lam w_g)): at most ENTERING_SHARE of the non-zero groups (at least
    ENTERING_MIN), and no more than keeps |S| within ``max_support`` coordinates (default
    MAX_SUPPORT). Sorted; as float64 (what the server broadcasts)."""
    violating, ratio = violating_zeros(x, correlation, n, lam, weights, block_indptr)
    sizes = np.diff(block_indptr)
    nonzero = np.flatnonzero(contiguous_block_norms(x, block_indptr))
    limit = int(max(ENTERING_MIN, np.ceil(ENTERING_SHARE * nonzero.shape[0])))
    order = violating[np.argsort(-ratio[violating], kind="stable")][:limit]
    room = (MAX_SUPPORT if max_support is None else max_support) - \
        int(sizes[nonzero].sum())
    order = order[np.cumsum(sizes[order]) <= room]
    return np.sort(order).astype(np.float64)


class StallWatch:
    """When to try the step: after an epoch that cut the certified gap by less than
    1 / STALL_RATIO (or, given the goal, that left it more than TRY_EPOCHS epochs from
    it), that changed at most SUPPORT_CHURN |S| of x's firm support S (``firm_support``;
    the backends count the changes and pass |S|), or PRUNED_CHURN |S| where the step
    would first prune x (``prunes_for_step``), with 1 <= |S| <= ``max_support`` (default
    MAX_SUPPORT; the group step: HESSIAN_FREE_MAX_SUPPORT). After a try that did not cut
    the gap to STALL_RATIO times what it was, the next try waits 2, 4, 8... epochs (each
    try costs a pass over the data and a Hessian over S or up to ``product_budget``
    products with it, under MPI sums from every worker).

    The churn rule keeps the step from being tried while the support still moves (each
    try then costs a Hessian on a large S and rarely certifies); at SUPPORT_CHURN the step
    comes while x still sheds its last extra non-zeros and certifies from there, which
    also serves asynchronous runs whose support shrinks slowly. Where the step would
    prune x the limit is the stricter PRUNED_CHURN (the choice of both:
    benchmarks/notes/newton.md)."""

    def __init__(self, max_support=None):
        self.max_support = MAX_SUPPORT if max_support is None else int(max_support)
        self.previous_gap = None
        self.wait_until = 0
        self.backoff = 1
        self.chained = 0

    def should_try(self, epoch, gap, support_size, support_changes, goal=None,
                   pruned=False):
        """``support_changes``: coordinates that entered or left x's firm support in the
        last epoch (None when unknown). ``goal``: the gap the run stops at; with it an
        epoch also counts as slow when, at its rate, more than TRY_EPOCHS epochs would
        still be needed to reach the goal (a gap falling fast but from far away).
        ``pruned``: whether the step would prune x (``pruned_coordinates``: more than
        MAX_SUPPORT non-zeros, or a group penalty)."""
        stalled = False
        if self.previous_gap is not None and gap > 0.0:
            rate = gap / self.previous_gap
            stalled = rate > STALL_RATIO
            if goal is not None and 0.0 < goal < gap and not stalled:
                stalled = np.log(gap / goal) > TRY_EPOCHS * -np.log(rate)
        self.previous_gap = gap
        settled = support_changes is not None and \
            support_changes <= (PRUNED_CHURN if pruned else SUPPORT_CHURN) * support_size
        return stalled and settled and 1 <= support_size <= self.max_support and \
            epoch >= self.wait_until

    def should_chain(self, t, violating):
        """After a step, whether to take another at once, before any epoch: when the step
        was full (t = 1: it landed on the model's minimum over S's orthant, for the
        squared loss that of P) and zeros of x now ``violating`` the optimality
        condition keep the gap up, the next step lets them enter; at most CHAIN_STEPS in
        a row."""
        if t == 1.0 and violating and self.chained < CHAIN_STEPS:
            self.chained += 1
            return True
        self.chained = 0
        return False

    def tried(self, epoch, gap_before, gap_after):
        if gap_after <= STALL_RATIO * gap_before:
            self.backoff = 1
        else:
            self.backoff *= 2
            self.wait_until = epoch + self.backoff
        self.previous_gap = gap_after


def pruned_coordinates(x, firm, always=False):
    """The non-zeros of x outside its firm support (``firm_support``), to be set to zero
    before the step, when x has more than MAX_SUPPORT non-zeros (else none): StallWatch
    judges |S| by the firm support, and asynchronous steps can leave thousands of small
    non-zeros behind it. The step then starts from the pruned x and its candidates are
    compared with P of the unpruned one. ``always``: whatever the count (the group step,
    whose model needs the Hessian on every coordinate of S, where the L1 step drops its
    settled zeros inside the model)."""
    if not prunes_for_step(x, always):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((x != 0) & ~firm)


def prunes_for_step(x, always=False):
    """Whether a step from x sets the non-zeros outside its firm support to zero first
    (``pruned_coordinates``): x has more than MAX_SUPPORT non-zeros, or ``always``."""
    return bool(always) or int(np.count_nonzero(x)) > MAX_SUPPORT
