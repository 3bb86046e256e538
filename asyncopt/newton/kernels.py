"""The shard layer of the support Newton step: what one shard's rows give of the loss's
Hessian on S and of the losses at candidate points, and ``SupportRows``, what a step asks
for them.

S is a set of (size) feature columns, ``position[j]`` feature j's index in S (-1 outside
S); vectors and matrices over S carry the intercept last when it is fitted (dim = size +
intercept). For the rows i of a shard at margins z, with sample weights c_i (the
kernels' ``sample_weight`` in the kernel form, ``losses.row_weight``; 1 without them):
    H_sum = sum_i c_i f''(z_i) [a_iS, 1] [a_iS, 1]^T,   slope = sum_i c_i f'(z_i) [a_iS, 1],
    losses(m) = sum_i c_i f(z_i + [a_iS, 1]^T m)
(the loss's part of the step's model: its Hessian and gradient before the 1/n). The
numba passes form them from the CSR rows (the whole triangle, some rows of it, the
diagonal group blocks, products), the helpers move a symmetric matrix between its packed
upper triangle (what a worker reduces) and its square forms, and the caches reuse a
previous step's sum (squared loss). Nothing here decides or solves (``policy``,
``model``)."""
import numpy as np
from numba import njit
from scipy.linalg.blas import dsymv

from ..kernels.linalg import row_ranges, run_in_parallel
from ..losses import loss_of_code, loss_second_derivative, loss_value, mean_loss, row_weight

PARALLEL_HESSIAN_BYTES = 2 ** 28   # the threads' partial Hessians take at most this


@njit(cache=True, inline="always")
def _insert_sorted(where, value, first, end, q, v):
    """Insert (q, v) into where[first:end] (sorted) and value[first:end] at q's place,
    shifting the larger ones up by one (insertion sort's step)."""
    b = end - 1
    while b >= first and where[b] > q:
        where[b + 1] = where[b]
        value[b + 1] = value[b]
        b -= 1
    where[b + 1] = q
    value[b + 1] = v


@njit(cache=True, inline="always")
def _row_in_support(indptr, indices, data, position, i, where, value, first):
    """Row i's entries in S (``position[j]`` >= 0) written from ``first`` into ``where``
    (their positions in S) and ``value``, sorted by position (``_insert_sorted``, a
    no-op on rows stored in column order); returns where they end. What every kernel
    that forms Hessian sums on S reads of a row."""
    end = first
    for k in range(indptr[i], indptr[i + 1]):
        q = position[indices[k]]
        if q >= 0:
            _insert_sorted(where, value, first, end, q, data[k])
            end += 1
    return end


@njit(cache=True, nogil=True)
def support_hessian_triangle(indptr, indices, data, position, code, z, y, sample_weight,
                             size, intercept):
    """The upper triangle, column by column (``upper_triangle``'s order), of sum_i
    c_i f''(z_i) [a_iS, 1] [a_iS, 1]^T for S of (size + intercept) coordinates:
    ``position[j]`` is feature j's index in S (-1 when j is not in S). What a Dis-DDSS
    worker reduces of its Hessian share; ``support_hessian_sums`` unpacks it.

    One pass over the rows; each row's S-entries are sorted by position (insertion, a
    no-op on rows stored in column order) and their products (sum_i m_i^2 / 2 for m_i
    entries of row i in S) summed into the packed triangle by offset. Column by column,
    the products among the first coordinates of S lie together at the start, where row
    by row they spread over the first rows' whole length: where S lists the frequent
    features first, most products fall there (benchmarks/notes/newton.md)."""
    dim = size + 1 if intercept else size
    flat = np.zeros(dim * (dim + 1) // 2)
    where = np.empty(size, dtype=np.int64)
    value = np.empty(size)
    last = size * (size + 1) // 2       # where the intercept's column starts
    for i in range(indptr.shape[0] - 1):
        weight = row_weight(sample_weight, i) * loss_second_derivative(code, z[i], y[i])
        m = _row_in_support(indptr, indices, data, position, i, where, value, 0)
        for c in range(m):
            column = where[c] * (where[c] + 1) // 2     # entry (q, c), q <= c
            vc = weight * value[c]
            for a in range(c + 1):
                flat[column + where[a]] += vc * value[a]
            if intercept:
                flat[last + where[c]] += vc
        if intercept:
            flat[last + size] += weight
    return flat


def support_hessian_sums(indptr, indices, data, position, code, z, y, sample_weight, size,
                         intercept, n_threads=1):
    """sum_i c_i f''(z_i) [a_iS, 1] [a_iS, 1]^T as a dense (size + intercept) square matrix
    (``support_hessian_triangle`` unpacked; on ``n_threads`` threads:
    ``parallel_hessian_triangle``)."""
    return from_upper_triangle(parallel_hessian_triangle(
        indptr, indices, data, position, code, z, y, sample_weight, size, intercept,
        n_threads), size + 1 if intercept else size)


@njit(cache=True)
def support_hessian_rows(indptr, indices, data, position, code, z, y, sample_weight, size,
                         intercept, fresh):
    """The rows of ``support_hessian_sums`` of the coordinates of S at the positions
    ``fresh`` (distinct), as a len(fresh) x (size + intercept) matrix: one pass over the
    rows, sum_i m_i f_i products for m_i entries of row i in S of which f_i are fresh.
    What a step on S' forms when it has the sum on S and S' \\ S is small
    (``HessianCache``, ``ReducedHessian``; ``place_rows`` puts them in)."""
    dim = size + 1 if intercept else size
    out = np.zeros((fresh.shape[0], dim))
    flat = out.reshape(fresh.shape[0] * dim)
    fresh_row = np.full(size, -1, dtype=np.int64)
    for r in range(fresh.shape[0]):
        fresh_row[fresh[r]] = r
    where = np.empty(size, dtype=np.int64)
    value = np.empty(size)
    for i in range(indptr.shape[0] - 1):
        m = _row_in_support(indptr, indices, data, position, i, where, value, 0)
        touched = False
        for a in range(m):
            touched = touched or fresh_row[where[a]] >= 0
        if not touched:
            continue
        weight = row_weight(sample_weight, i) * loss_second_derivative(code, z[i], y[i])
        for a in range(m):
            r = fresh_row[where[a]]
            if r >= 0:
                va = weight * value[a]
                row = r * dim
                for c in range(m):
                    flat[row + where[c]] += va * value[c]
                if intercept:
                    flat[row + size] += va
    return out


def place_rows(matrix, positions, rows):
    """A symmetric matrix's rows and columns at ``positions`` set to ``rows`` (their
    ``support_hessian_rows``), in place; returns the matrix."""
    matrix[positions] = rows
    matrix[:, positions] = rows.T
    return matrix


def parallel_hessian_triangle(indptr, indices, data, position, code, z, y, sample_weight,
                              size, intercept, n_threads=1):
    """``support_hessian_triangle`` on ``n_threads`` threads: each forms the sum over its
    contiguous block of the rows (``asyncopt.kernels.linalg.row_ranges``, as the threads'
    certificate passes split them), and the blocks' triangles are added. The threads'
    partial triangles take at most PARALLEL_HESSIAN_BYTES together (fewer threads for a
    larger S)."""
    n = indptr.shape[0] - 1
    dim = size + 1 if intercept else size
    threads = int(max(1, min(n_threads, n,
                             PARALLEL_HESSIAN_BYTES // max(4 * dim * (dim + 1), 1))))
    if threads == 1:
        return support_hessian_triangle(indptr, indices, data, position, code, z, y,
                                        sample_weight, size, intercept)
    parts = run_in_parallel([
        lambda lo=lo, hi=hi: support_hessian_triangle(
            indptr[lo:hi + 1], indices, data, position, code, z[lo:hi], y[lo:hi],
            sample_weight[lo:hi] if sample_weight.shape[0] else sample_weight, size,
            intercept)
        for lo, hi in row_ranges(n, threads)])
    return np.sum(parts, axis=0)


@njit(cache=True)
def candidate_loss_sums(indptr, indices, data, position, code, z, y, sample_weight, moves,
                        size, intercept):
    """sum_i c_i f(z_i + [a_iS, 1]^T m) for every row m of ``moves`` (the candidates' moves
    from the point, entry ``size`` the intercept's; ``position`` as in
    ``support_hessian_sums``)."""
    out = np.zeros(moves.shape[0])
    where = np.empty(size, dtype=np.int64)
    value = np.empty(size)
    for i in range(indptr.shape[0] - 1):
        # the row's entries in S, read once for every move
        m = _row_in_support(indptr, indices, data, position, i, where, value, 0)
        c = row_weight(sample_weight, i)
        for s in range(moves.shape[0]):
            dz = moves[s, size] if intercept else 0.0
            for a in range(m):
                dz += value[a] * moves[s, where[a]]
            out[s] += c * loss_value(code, z[i] + dz, y[i])
    return out


@njit(cache=True)
def restricted_rows(indptr, indices, data, position, code, z, y, sample_weight):
    """The rows restricted to S, each entry's column replaced by its position in S
    (``position[j]``, -1 outside S) and sorted by it within the row (insertion, a no-op
    on rows stored in column order), with each row's c_i f''(z_i): (indptr, positions,
    data, weights). What products with the Hessian from the rows read."""
    n = indptr.shape[0] - 1
    count = 0
    for k in range(indptr[n]):
        if position[indices[k]] >= 0:
            count += 1
    out_indptr = np.empty(n + 1, dtype=np.int64)
    positions = np.empty(count, dtype=np.int32)
    values = np.empty(count)
    weights = np.empty(n)
    at = 0
    out_indptr[0] = 0
    for i in range(n):
        at = _row_in_support(indptr, indices, data, position, i, positions, values, at)
        out_indptr[i + 1] = at
        weights[i] = row_weight(sample_weight, i) * loss_second_derivative(code, z[i], y[i])
    return out_indptr, positions, values, weights


@njit(cache=True)
def restricted_hessian_times(indptr, positions, data, weights, v, size, intercept):
    """sum_i c_i f''(z_i) [a_iS, 1] [a_iS, 1]^T v in one pass over the ``restricted_rows``
    (each row's margin along v, then its share of the product), without the Hessian."""
    out = np.zeros(v.shape[0])
    for i in range(indptr.shape[0] - 1):
        along = v[size] if intercept else 0.0
        for k in range(indptr[i], indptr[i + 1]):
            along += data[k] * v[positions[k]]
        along *= weights[i]
        if along != 0.0:
            for k in range(indptr[i], indptr[i + 1]):
                out[positions[k]] += data[k] * along
            if intercept:
                out[size] += along
    return out


@njit(cache=True)
def restricted_curvatures(indptr, positions, data, weights, moves, size, intercept):
    """sum_i c_i f''(z_i) ([a_iS, 1]^T m)^2 for every row m of ``moves``, from the
    ``restricted_rows``: m^T H m without the Hessian."""
    out = np.zeros(moves.shape[0])
    for i in range(indptr.shape[0] - 1):
        for s in range(moves.shape[0]):
            along = moves[s, size] if intercept else 0.0
            for k in range(indptr[i], indptr[i + 1]):
                along += data[k] * moves[s, positions[k]]
            out[s] += weights[i] * along * along
    return out


def shard_slope(correlation_S, rho_sum, intercept):
    """sum_i f'(z_i) [a_iS, 1] over a shard's rows from its certificate's sums: -[A_S^T
    rho, sum rho] (rho = -f'(z)); the intercept's entry only when it is fitted."""
    slope = -np.asarray(correlation_S, np.float64)
    return np.append(slope, -rho_sum) if intercept else slope


def symmetric_times(matrix, v):
    """matrix @ v for a symmetric float64 matrix, read from its lower triangle (BLAS dsymv
    on the upper triangle of the transposed view, which is Fortran-ordered: no copy): half
    the memory a general product reads, and all that ``lower_from_upper_triangle`` fills
    in."""
    return dsymv(1.0, np.asfortranarray(matrix.T), np.asarray(v, np.float64), lower=0)


def symmetric_submatrix(lower, positions):
    """The symmetric matrix's block on ``positions`` (any order) from its lower
    triangle (``lower``: a square matrix whose entries above the diagonal are not read)."""
    block = lower[np.ix_(positions, positions)]
    return np.where(positions[:, None] >= positions[None, :], block, block.T)


def symmetric_from_lower(matrix):
    """``matrix`` with its entries above the diagonal set from those below, in place."""
    for j in range(matrix.shape[0] - 1):
        matrix[j, j + 1:] = matrix[j + 1:, j]
    return matrix


@njit(cache=True)
def copy_submatrix(source, source_at, target_at, out):
    """out[target_at[a], target_at[c]] = source[source_at[a], source_at[c]] for every a, c
    (``np.ix_`` on both sides, without its copies): the kept part of a cached Hessian."""
    for a in range(source_at.shape[0]):
        source_row, target_row = source[source_at[a]], out[target_at[a]]
        for c in range(source_at.shape[0]):
            target_row[target_at[c]] = source_row[source_at[c]]


def reusable_positions(kept_ids, kept_intercept, ids, intercept, share):
    """Where each feature id of ``ids`` (a step's S') stands in ``kept_ids`` (the S of
    a kept Hessian; -1 where it is new), or None when nothing is kept, the intercept
    differs, S' is empty or more than ``share`` of it is new: what ``HessianCache`` and
    ``ReducedHessian`` reuse a kept Hessian by."""
    if kept_ids is None or kept_intercept != bool(intercept) or not ids.shape[0]:
        return None
    where = np.full(int(max(ids.max(), kept_ids.max(initial=0))) + 1, -1, dtype=np.int64)
    where[kept_ids] = np.arange(kept_ids.shape[0])
    old = where[ids]
    if np.count_nonzero(old < 0) > share * ids.shape[0]:
        return None
    return old


def kept_entries(kept, old):
    """The square matrix on S' holding a kept Hessian's entries where both coordinates
    were kept (``old``: each one's position in ``kept``, -1 where new, as
    ``reusable_positions`` gives, the intercept's appended) and zeros in the new ones'
    rows and columns, which ``HessianCache`` forms and ``ReducedHessian`` is sent."""
    known = np.flatnonzero(old >= 0)
    out = np.zeros((old.shape[0], old.shape[0]))
    copy_submatrix(kept, old[known], known, out)
    return out


class HessianCache:
    """The Hessian sum of one shard's last step, by original feature id, for the squared
    loss, where it depends on the rows alone (f'' = 1):
    H_S = sum_i c_i [a_iS, 1] [a_iS, 1]^T (c_i the rows' sample weights, fixed for the
    run).
    A later step on S' takes the entries on S' and S from it and forms only the rows and
    columns of the coordinates new to S' (``support_hessian_rows``). Serial DDSS keeps one
    (Dis-DDSS workers reduce only the new rows instead: ``ReducedHessian``)."""

    REUSE_SHARE = 0.5     # form anew when more than this share of S' is new

    def __init__(self):
        self.ids, self.intercept, self.hessian = None, None, None

    def keep(self, ids, intercept, hessian):
        self.ids, self.intercept, self.hessian = np.asarray(ids), bool(intercept), hessian

    def reusable(self, ids, intercept):
        """Where each of ``ids`` stands in the kept sum (-1: new), or None where
        ``extended`` would form the sum anew (``reusable_positions``)."""
        return reusable_positions(self.ids, self.intercept, np.asarray(ids), intercept,
                                  self.REUSE_SHARE)

    def extended(self, ids, intercept, args):
        """H on ``ids`` from the kept one plus the new coordinates' rows and columns
        (``args``: those of ``support_hessian_sums`` for S'), or None when nothing is kept,
        the intercept differs or too much of S' is new."""
        old = reusable_positions(self.ids, self.intercept, ids, intercept, self.REUSE_SHARE)
        if old is None:
            return None
        fresh = np.flatnonzero(old < 0)
        hessian = kept_entries(self.hessian, np.append(old, self.ids.shape[0]) if intercept
                               else old)
        return hessian if not fresh.shape[0] else place_rows(hessian, fresh, support_hessian_rows(*args, fresh))


class ReducedHessian:
    """The Hessian sum a Dis-DDSS step last reduced from the workers' shares, by original
    feature id, for the squared loss, where it depends on the rows alone (f'' = 1), so a
    later step on S' finds the entries on S' and S unchanged: every rank keeps S's ids,
    the server the sum. When at most REUSE_SHARE of S' is new (``fresh``: the same
    answer on every rank), each worker reduces only its share's rows of the new
    coordinates N, |N| (|S'| + 1) numbers where the upper triangle is (|S'| + 1)(|S'| +
    2) / 2, and the server fills in the rest from the kept sum (``assemble``): what a
    chained step (``policy.StallWatch.should_chain``), on the same S plus a few
    coordinates, reduces."""

    REUSE_SHARE = HessianCache.REUSE_SHARE

    def __init__(self):
        self.ids, self.intercept, self.hessian = None, None, None

    def fresh(self, ids, intercept):
        """(the positions in S' of its coordinates new since the kept sum, the kept sum's
        positions of the others by their position in S', -1 at the new ones, the
        intercept's last), or None when the whole upper triangle is to be reduced."""
        old = reusable_positions(self.ids, self.intercept, np.asarray(ids, dtype=np.int64),
                                 intercept, self.REUSE_SHARE)
        if old is None:
            return None
        fresh = np.flatnonzero(old < 0)
        if intercept:
            old = np.append(old, self.ids.shape[0])
        return fresh, old

    def assemble(self, plan, rows):
        """The server's sum on S' from ``plan`` (``fresh``'s) and ``rows``, the summed
        shares' rows of the new coordinates (|N| x (|S'| + 1), flat). The kept sum may
        hold only its lower triangle (``lower_from_upper_triangle``): it is completed
        first, as S' need not list the kept coordinates in the same order."""
        fresh, old = plan
        return place_rows(kept_entries(symmetric_from_lower(self.hessian), old), fresh,
                          rows.reshape(fresh.shape[0], old.shape[0]))

    def keep(self, ids, intercept, hessian=None):
        """After a step's reduction on S' = ``ids``: the server passes the sum."""
        self.ids = np.asarray(ids, dtype=np.int64)
        self.intercept, self.hessian = bool(intercept), hessian


class SupportRows:
    """What a step needs from one shard's rows (an ActiveSet: all rows on one process, a
    worker's under MPI) at the margins z, for S = ``support``: the sum of its Hessian on S
    (formed once: at most ``policy.MAX_SUPPORT`` + 1 rows), products with it, and the
    losses at candidate points. Vectors over S carry the intercept last when it is fitted.
    ``slope``: sum_i f'(z_i) [a_iS, 1] over these rows (``shard_slope``); ``cache``: a
    HessianCache of this shard's previous step (squared loss); ``n_threads``: the threads
    that form the Hessian (``parallel_hessian_triangle``)."""

    def __init__(self, active, code, z, support, intercept, slope, cache=None, n_threads=1):
        self.active, self.code, self.z, self.slope = active, code, z, slope
        self.n_threads = n_threads
        self.position = np.full(active.n_features, -1, dtype=np.int64)
        self.position[support] = np.arange(support.shape[0])
        self.size, self.intercept = support.shape[0], bool(intercept)
        self.cache = cache if loss_of_code(code).quadratic else None
        self.ids = None if self.cache is None else active.features[support]
        self._hessian = None
        self._restricted = None

    def _kernel_args(self):
        active = self.active
        return (active.indptr, active.indices, active.data, self.position, self.code,
                self.z, active.y, active.sample_weight, self.size, self.intercept)

    def hessian_sums(self):
        """sum_i c_i f''(z_i) [a_iS, 1] [a_iS, 1]^T (``support_hessian_sums``), formed on
        the first call; with a cache, what it holds of it is reused
        (``HessianCache.extended``)."""
        if self._hessian is None:
            args = self._kernel_args()
            self._hessian = None if self.cache is None else \
                self.cache.extended(self.ids, self.intercept, args)
            if self._hessian is None:
                self._hessian = support_hessian_sums(*args, self.n_threads)
            if self.cache is not None:
                self.cache.keep(self.ids, self.intercept, self._hessian)
        return self._hessian

    def hessian_triangle(self):
        """The Hessian sum's ``upper_triangle``, formed packed from the rows (the square
        matrix is neither formed nor kept): what a Dis-DDSS worker reduces."""
        return parallel_hessian_triangle(*self._kernel_args(), self.n_threads)

    def hessian_rows(self, fresh):
        """The Hessian sum's rows at the positions ``fresh`` (``support_hessian_rows``),
        from the rows: what a Dis-DDSS worker reduces for ``ReducedHessian``."""
        return support_hessian_rows(*self._kernel_args(), np.asarray(fresh, np.int64))

    def hessian_times(self, v):
        """The Hessian sum times v (``symmetric_times``). A worker forms its share once
        and answers each of the server's CG products with a dense product, cheaper than a
        pass over the rows per product."""
        return symmetric_times(self.hessian_sums(), v)

    def restricted(self):
        """These rows restricted to S with their f'' (``restricted_rows``), formed on the
        first call: what products from the rows read."""
        if self._restricted is None:
            active = self.active
            self._restricted = restricted_rows(active.indptr, active.indices, active.data,
                                               self.position, self.code, self.z,
                                               active.y, active.sample_weight)
        return self._restricted

    def hessian_times_from_rows(self, v):
        """The Hessian sum times v in a pass over the rows restricted to S, with no
        Hessian formed (``restricted_hessian_times``): for supports whose Hessian would
        be too large to form."""
        return restricted_hessian_times(*self.restricted(), np.asarray(v, np.float64),
                                        self.size, self.intercept)

    def hessian_diagonal(self):
        """The diagonal of the Hessian sum (CG's preconditioner)."""
        return np.diag(self.hessian_sums()).copy()

    def hessian_block(self, positions):
        """The Hessian sum's upper triangle on ``positions`` (``upper_triangle``), the
        block of CG's preconditioner (``model.preconditioner_coordinates``)."""
        return upper_triangle(self.hessian_sums()[np.ix_(positions, positions)])

    def trial_sums(self, point, candidates):
        """The loss sums at every candidate, then at ``point`` itself (the last entry).

        Squared loss: ``quadratic_trial_sums`` with the Hessian sum the step has formed,
        so no pass over the rows at all; where the step formed no Hessian (its products
        came from the rows), m^T H m from the rows restricted to S
        (``restricted_curvatures``). Logistic loss: ``candidate_loss_sums``."""
        active = self.active
        moves = trial_moves(point, candidates)
        if not loss_of_code(self.code).quadratic:
            return candidate_loss_sums(active.indptr, active.indices, active.data,
                                       self.position, self.code, self.z, active.y,
                                       active.sample_weight, moves, self.size,
                                       self.intercept)
        at_point = mean_loss(self.code, self.z, active.y, active.sample_weight) * \
            self.z.shape[0]
        if self._hessian is None and self._restricted is not None:
            curvatures = restricted_curvatures(*self._restricted, moves, self.size,
                                               self.intercept)
            return quadratic_model_sums(at_point, self.slope, moves, curvatures)
        return quadratic_trial_sums(at_point, self.slope, self.hessian_sums(), moves)


def trial_moves(point, candidates):
    """The moves m = candidate - point, one row each, then a zero row (the point's own):
    what ``SupportRows.trial_sums`` and ``quadratic_trial_sums`` sum the losses at."""
    return np.vstack([candidates - point, np.zeros((1, point.shape[0]))])


def quadratic_trial_sums(loss_sum, slope, hessian, moves):
    """sum_i f(z_i + [a_iS, 1]^T m) = sum_i f(z_i) + g^T m + m^T H m / 2 for each row m
    of ``moves`` (``trial_moves``): exact for the squared loss (f'' = 1), ``loss_sum`` =
    sum_i f(z_i), g = ``slope`` (``shard_slope``) and H = ``hessian`` the sums over the
    same rows, read from its lower triangle (``symmetric_times``). Dis-DDSS's server
    takes them from the reduced sums (no round of the workers' trial losses)."""
    return quadratic_model_sums(loss_sum, slope, moves, np.array(
        [move @ symmetric_times(hessian, move) for move in moves]))


def quadratic_model_sums(loss_sum, slope, moves, curvatures):
    """``quadratic_trial_sums`` from the curvatures m^T H m of the rows m of ``moves``,
    however they were summed."""
    return loss_sum + moves @ slope + 0.5 * curvatures


def upper_triangle(matrix):
    """The upper triangle of a square matrix, column by column: entry (i, j), i <= j,
    at j (j + 1) / 2 + i (LAPACK's packed "U" order; what a worker reduces of its
    Hessian share, ``support_hessian_triangle``); ``from_upper_triangle`` inverts it for
    a symmetric one. A slice copy per column."""
    dim = matrix.shape[0]
    out = np.empty(dim * (dim + 1) // 2, dtype=matrix.dtype)
    for j in range(dim):
        out[j * (j + 1) // 2:(j + 1) * (j + 2) // 2] = matrix[:j + 1, j]
    return out


def lower_from_upper_triangle(values, dim, out=None):
    """The lower triangle of the symmetric dim x dim matrix whose ``upper_triangle`` is
    ``values`` (into ``out`` when given), the entries above the diagonal left unwritten:
    column j's piece of the packed triangle is row j's first j + 1 entries, one
    contiguous copy each, where ``from_upper_triangle`` also writes each column across
    the rows. What the Dis-DDSS server's step reads of its summed Hessian
    (``model.dense_move``, ``symmetric_times``)."""
    matrix = np.empty((dim, dim)) if out is None else out
    _fill_lower(values, matrix)
    return matrix


@njit(cache=True, nogil=True)
def _fill_lower(values, matrix):
    """Row j's first j + 1 entries of ``matrix`` from column j's piece of the packed
    upper triangle ``values``."""
    start = 0
    for j in range(matrix.shape[0]):
        for i in range(j + 1):
            matrix[j, i] = values[start + i]
        start += j + 1


def from_upper_triangle(values, dim, out=None):
    """The symmetric dim x dim matrix whose ``upper_triangle`` is ``values`` (into
    ``out`` when given, C-ordered): each column's piece copied into the row
    (``lower_from_upper_triangle``), then the lower triangle mirrored above the
    diagonal (``_mirror_lower``)."""
    matrix = lower_from_upper_triangle(values, dim, out)
    _mirror_lower(matrix)
    return matrix


@njit(cache=True, nogil=True)
def _mirror_lower(matrix):
    """matrix[i, j] = matrix[j, i] for i < j, in tiles of MIRROR_TILE x MIRROR_TILE, so
    that the rows read and the rows written stay in cache."""
    dim = matrix.shape[0]
    for top in range(0, dim, MIRROR_TILE):
        for left in range(top, dim, MIRROR_TILE):
            for i in range(top, min(top + MIRROR_TILE, dim)):
                for j in range(max(left, i + 1), min(left + MIRROR_TILE, dim)):
                    matrix[i, j] = matrix[j, i]


MIRROR_TILE = 64            # 32 KB of doubles: one tile's rows fit in L1/L2


@njit(cache=True)
def _group_hessian_blocks(indptr, positions, data, weights, starts, group_of, offsets,
                          size, intercept, out):
    """Add each row's share of the Hessian's diagonal group blocks (row-major from
    ``offsets[k]``), then of its intercept column (from ``offsets[-1]``) and corner,
    into ``out``; rows as ``restricted_rows`` gives them (positions sorted, so a group's
    entries are adjacent)."""
    column = offsets[offsets.shape[0] - 1]
    for i in range(indptr.shape[0] - 1):
        w = weights[i]
        end = indptr[i + 1]
        for a in range(indptr[i], end):
            q = positions[a]
            k = group_of[q]
            m = starts[k + 1] - starts[k]
            base = offsets[k] + (q - starts[k]) * m - starts[k]
            va = w * data[a]
            c = a
            while c < end and group_of[positions[c]] == k:
                out[base + positions[c]] += va * data[c]
                c += 1
            b = a - 1
            while b >= indptr[i] and group_of[positions[b]] == k:
                out[base + positions[b]] += va * data[b]
                b -= 1
            if intercept:
                out[column + q] += va
        if intercept:
            out[column + size] += w


def _block_offsets(starts):
    """Where each group's m_k x m_k block starts among ``group_hessian_blocks``' numbers
    (and, last, where the intercept's column starts)."""
    sizes = np.diff(starts)
    return np.concatenate(([0], np.cumsum(sizes * sizes))).astype(np.int64)


def group_blocks_length(starts, intercept):
    """How many numbers ``group_hessian_blocks`` gives: sum_k m_k^2, plus |S| + 1 with an
    intercept (what every rank knows without being told)."""
    return int(_block_offsets(starts)[-1]) + (int(starts[-1]) + 1 if intercept else 0)


def group_hessian_blocks(rows, starts):
    """From a shard's SupportRows: its Hessian sum's diagonal blocks on S's groups
    (``starts``; each m_k x m_k block row-major, one after another), then, when the
    intercept is fitted, the Hessian's column on it over S and its corner: the numbers
    of H that ``group_model.hessian_free_group_minimum`` reads (``group_blocks_length``
    of them; no column or corner without an intercept). One pass over the rows
    restricted to S."""
    sizes = np.diff(starts)
    group_of = np.repeat(np.arange(sizes.shape[0]), sizes)
    out = np.zeros(group_blocks_length(starts, rows.intercept))
    _group_hessian_blocks(*rows.restricted(), np.asarray(starts, np.int64), group_of,
                          _block_offsets(starts), rows.size, rows.intercept, out)
    return out


def split_group_blocks(values, starts, intercept):
    """``group_hessian_blocks``' numbers -> (the list of diagonal blocks, the intercept's
    column over S or None, its corner)."""
    sizes = np.diff(starts)
    offsets = _block_offsets(starts)
    blocks = [values[offsets[k]:offsets[k + 1]].reshape(m, m) for k, m in enumerate(sizes)]
    if not intercept:
        return blocks, None, 0.0
    k = int(starts[-1])
    tail = values[offsets[-1]:]
    return blocks, tail[:k], float(tail[k])
