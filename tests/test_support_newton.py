"""The support Newton step (asyncopt/newton/): its pieces against direct
computations, its path against the quadratic model, and what it does to DDSS on data with
nearly equal columns (a9a's degree-2 features), certified by the independent references
of conftest."""
import numpy as np
import pytest
import scipy.sparse as sp

from asyncopt.data.embedded import load_a9a
from asyncopt.losses import UNWEIGHTED
from asyncopt.penalties import L1
from asyncopt.problem import Problem
from asyncopt.solvers.ddss import solve_ddss
import asyncopt.newton.kernels as newton_kernels
import asyncopt.newton.model as newton_model
import asyncopt.newton.policy as newton_policy
import asyncopt.newton.step as newton_step
from asyncopt.newton.kernels import (HessianCache, ReducedHessian, SupportRows,
                                     from_upper_triangle, support_hessian_sums,
                                     upper_triangle)
from asyncopt.newton.model import (LINE, PROJECTED, STEP_GRID, best_candidate,
                                   block_preconditioner, dense_move, hessian_free_direction,
                                   linear_candidates, move_candidates,
                                   orthant_newton_target, preconditioner_coordinates,
                                   projected_candidates, support_move)
from asyncopt.newton.policy import (CHAIN_STEPS, DROP_MARGIN, MAX_SUPPORT, MIN_PRODUCTS,
                                    POPULAR_SHARE, PRUNED_CHURN, STALL_RATIO, SUPPORT_CHURN,
                                    TRY_EPOCHS, StallWatch, firm_support, settled_zeros,
                                    uses_hessian_free)


def _second_derivative(loss, z):
    if loss == "squared":
        return np.ones_like(z)
    e = np.exp(-np.abs(z))
    return e / (1.0 + e) ** 2


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("intercept", [True, False])
def test_support_hessian_sums_is_the_weighted_gram_of_the_support(loss, intercept, ref):
    rng = np.random.default_rng(3)
    X = sp.random(60, 25, density=0.3, random_state=3, format="csr")
    y = np.where(rng.random(60) < 0.5, -1.0, 1.0) if loss == "logistic" \
        else rng.standard_normal(60)
    z = rng.standard_normal(60)
    support = np.array([2, 5, 7, 11, 19, 24])
    position = np.full(25, -1, dtype=np.int64)
    position[support] = np.arange(support.shape[0])
    code = 0 if loss == "squared" else 1
    got = support_hessian_sums(X.indptr, X.indices, X.data, position, code, z, y,
                               UNWEIGHTED, support.shape[0], intercept)
    B = X[:, support].toarray()
    if intercept:
        B = np.column_stack([B, np.ones(60)])
    want = B.T @ (_second_derivative(loss, z)[:, None] * B)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_threads", [1, 2, 3, 7])
@pytest.mark.parametrize("intercept", [True, False])
def test_parallel_hessian_triangle_adds_the_row_blocks_to_the_whole_sum(n_threads,
                                                                       intercept, ref):
    """parallel_hessian_triangle: the threads' blocks of rows (rows with no entry, more
    threads than some blocks can fill) sum to the packed upper triangle, column by
    column, of the weighted Gram matrix over all rows."""
    rng = np.random.default_rng(12)
    X = sp.random(9, 40, density=0.3, random_state=12, format="csr")
    X = sp.vstack([X, sp.csr_matrix((3, 40)), X]).tocsr()          # empty rows between
    y, z = rng.standard_normal(X.shape[0]), rng.standard_normal(X.shape[0])
    support = np.array([0, 2, 3, 8, 13, 21, 34, 39])
    position = np.full(40, -1, dtype=np.int64)
    position[support] = np.arange(support.shape[0])
    args = (X.indptr, X.indices, X.data, position, 1, z, y, UNWEIGHTED, support.shape[0],
            intercept)
    B = X[:, support].toarray()
    if intercept:
        B = np.column_stack([B, np.ones(X.shape[0])])
    gram = B.T @ (_second_derivative("logistic", z)[:, None] * B)
    want = np.concatenate([gram[:j + 1, j] for j in range(gram.shape[0])])
    np.testing.assert_allclose(newton_kernels.parallel_hessian_triangle(*args, n_threads),
                               want, rtol=1e-13, atol=1e-14)


def test_hessian_triangle_with_s_in_any_order():
    """support_hessian_triangle where S's positions do not follow the columns' order
    (S listed in a shuffled order, rows with unsorted indices): the same packed Gram
    matrix of the columns taken in S's order."""
    rng = np.random.default_rng(5)
    X = sp.random(40, 30, density=0.4, random_state=5, format="csr")
    X.indices = X.indices.copy()
    for i in range(X.shape[0]):                    # unsorted indices in every row
        lo, hi = X.indptr[i], X.indptr[i + 1]
        order = rng.permutation(hi - lo)
        X.indices[lo:hi], X.data[lo:hi] = X.indices[lo:hi][order], X.data[lo:hi][order]
    X.has_sorted_indices = False
    y, z = rng.standard_normal(40), rng.standard_normal(40)
    support = rng.permutation(30)[:12]              # S's order: not ascending
    position = np.full(30, -1, dtype=np.int64)
    position[support] = np.arange(support.shape[0])
    B = np.column_stack([X[:, support].toarray(), np.ones(40)])
    gram = B.T @ (_second_derivative("logistic", z)[:, None] * B)
    np.testing.assert_allclose(
        newton_kernels.support_hessian_triangle(X.indptr, X.indices, X.data, position, 1,
                                                z, y, UNWEIGHTED, support.shape[0],
                                                True),
        upper_triangle(gram), rtol=1e-13, atol=1e-14)


class _Shard:
    """The ActiveSet fields SupportRows reads."""

    def __init__(self, X, y, features=None):
        self.indptr, self.indices, self.data = X.indptr, X.indices, X.data
        self.n_features, self.y = X.shape[1], y
        self.features = np.arange(X.shape[1]) if features is None else features
        self.sample_weight = UNWEIGHTED


@pytest.mark.parametrize("intercept", [True, False])
def test_hessian_cache_extends_the_last_support_to_the_direct_sum(intercept):
    """Squared loss: a step on S' after one on S forms only S' \\ S's rows and columns and
    lands on support_hessian_sums of S', also after the columns were renumbered (a
    compaction: the cache goes by original feature id); the logistic loss never uses it."""
    rng = np.random.default_rng(5)
    X = sp.random(80, 30, density=0.3, random_state=5, format="csr")
    y = rng.standard_normal(80)
    cache = HessianCache()
    first = SupportRows(_Shard(X, y), 0, rng.standard_normal(80),
                        np.array([1, 4, 6, 9, 13, 22, 27]), intercept, None, cache)
    first.hessian_sums()
    kept = np.setdiff1d(np.arange(30), [2, 6, 17])          # columns 2, 6, 17 screened
    compact = sp.csr_matrix(X[:, kept])
    support = np.searchsorted(kept, [1, 4, 9, 11, 13, 22, 27])   # 6 left, 11 entered
    rows = SupportRows(_Shard(compact, y, kept), 0, rng.standard_normal(80), support,
                       intercept, None, cache)
    calls = []
    forming = newton_kernels.parallel_hessian_triangle
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(newton_kernels, "parallel_hessian_triangle",
                      lambda *a: calls.append(1) or forming(*a))
        got = rows.hessian_sums()
        assert not calls                      # extended, not formed anew
        SupportRows(_Shard(compact, y, kept), 0, np.zeros(80), support, intercept,
                    None).hessian_sums()
        assert calls                          # without the cache: formed
    original = newton_kernels.support_hessian_sums
    position = np.full(compact.shape[1], -1, dtype=np.int64)
    position[support] = np.arange(support.shape[0])
    want = original(compact.indptr, compact.indices, compact.data, position, 0,
                    np.zeros(80), y, UNWEIGHTED, support.shape[0], intercept)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(cache.ids, kept[support])
    assert SupportRows(_Shard(X, np.sign(y)), 1, np.zeros(80), support, intercept, None,
                       cache).cache is None
    # mostly new coordinates: formed anew
    fresh = np.arange(8, 8 + 2 * support.shape[0] + 2)
    assert cache.extended(fresh, intercept, None) is None


@pytest.mark.parametrize("intercept", [True, False])
def test_reduced_hessian_from_the_new_rows_is_the_sum_of_the_shares(intercept):
    """Dis-DDSS's server keeps the summed Hessian of the last step (squared loss); a step
    on S' whose coordinates are mostly known gets from the workers only their shares' rows
    of the new ones, and the assembled sum is support_hessian_sums over all rows on S'.
    Feature ids are the original ones (a compaction renumbers the columns in between);
    the kept sum holds its lower triangle alone; mostly new coordinates, another
    intercept or nothing kept: the whole triangle."""
    rng = np.random.default_rng(8)
    X = sp.random(90, 30, density=0.3, random_state=8, format="csr")
    y = rng.standard_normal(90)
    shards = (slice(0, 40), slice(40, 90))

    def direct(matrix, support, rows=slice(None)):
        part = sp.csr_matrix(matrix[rows])
        position = np.full(matrix.shape[1], -1, dtype=np.int64)
        position[support] = np.arange(support.shape[0])
        return support_hessian_sums(part.indptr, part.indices, part.data, position, 0,
                                    np.zeros(part.shape[0]), y[rows], UNWEIGHTED,
                                    support.shape[0], intercept)

    server, worker = ReducedHessian(), ReducedHessian()
    first = np.array([1, 4, 6, 9, 13, 22, 27, 29])
    assert server.fresh(first, intercept) is None
    summed = sum(direct(X, first, rows) for rows in shards)
    # the server keeps the lower triangle alone (``lower_from_upper_triangle``)
    server.keep(first, intercept,
                np.tril(summed) + np.triu(np.full_like(summed, np.nan), 1))
    worker.keep(first, intercept)
    kept = np.setdiff1d(np.arange(30), [2, 6, 17])          # columns 2, 6, 17 screened
    compact = sp.csr_matrix(X[:, kept])
    support = np.searchsorted(kept, [1, 3, 4, 9, 11, 13, 22, 27, 29])  # 6 left; 3, 11 in
    ids = kept[support]
    plan = server.fresh(ids, intercept)
    np.testing.assert_array_equal(plan[0], [1, 4])
    np.testing.assert_array_equal(worker.fresh(ids, intercept)[1], plan[1])
    rows = sum(direct(compact, support, part)[plan[0]] for part in shards)
    got = server.assemble(plan, rows.ravel())
    np.testing.assert_allclose(got, direct(compact, support), rtol=1e-13, atol=1e-13)
    assert server.fresh(ids, not intercept) is None
    assert server.fresh(np.r_[ids[:4], np.arange(30, 36)], intercept) is None


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("intercept", [True, False])
def test_support_rows_products_diagonal_and_losses_are_the_dense_ones(loss, intercept, ref):
    rng = np.random.default_rng(4)
    X = sp.random(70, 30, density=0.25, random_state=4, format="csr")
    y = np.where(rng.random(70) < 0.5, -1.0, 1.0) if loss == "logistic" \
        else rng.standard_normal(70)
    z = rng.standard_normal(70)
    support = np.array([0, 3, 4, 9, 17, 29])
    code = 0 if loss == "squared" else 1
    rho = -ref.loss_derivatives(loss, z, y)        # the certificate's sums at z
    rows = SupportRows(_Shard(X, y), code, z, support, intercept,
                       newton_kernels.shard_slope(X[:, support].T @ rho, np.sum(rho),
                                                  intercept))
    B = X[:, support].toarray()
    if intercept:
        B = np.column_stack([B, np.ones(70)])
    gram = B.T @ (_second_derivative(loss, z)[:, None] * B)
    packed = SupportRows(_Shard(X, y), code, z, support, intercept, None)
    np.testing.assert_allclose(packed.hessian_triangle(),
                               np.concatenate([gram[:j + 1, j] for j in range(len(gram))]),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(packed.hessian_rows(np.array([4, 1])), gram[[4, 1]],
                               rtol=1e-12, atol=1e-12)
    assert packed._hessian is None                   # no square matrix formed or kept
    np.testing.assert_allclose(rows.hessian_sums(), gram, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rows.hessian_triangle(), packed.hessian_triangle(),
                               rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(rows.hessian_diagonal(), np.diag(gram), rtol=1e-12)
    v = rng.standard_normal(B.shape[1])
    np.testing.assert_allclose(rows.hessian_times(v), gram @ v, rtol=1e-12, atol=1e-12)
    point = rng.standard_normal(B.shape[1])
    candidates = point + rng.standard_normal((len(STEP_GRID), B.shape[1]))
    got = rows.trial_sums(point, candidates)
    want = [np.sum(ref.loss_values(loss, z + B @ (c - point), y)) for c in candidates]
    np.testing.assert_allclose(got[:-1], want, rtol=1e-12)
    assert got[-1] == pytest.approx(np.sum(ref.loss_values(loss, z, y)), rel=1e-13)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("intercept", [True, False])
def test_products_and_trial_losses_from_the_rows_need_no_hessian(loss, intercept, ref):
    """SupportRows' products from the rows restricted to S (rows stored out of column
    order, rows with no entry in S) equal the dense Hessian's, and without a Hessian
    formed the squared loss's trial sums come from the rows and are exact."""
    rng = np.random.default_rng(6)
    X = sp.random(90, 40, density=0.2, random_state=6, format="csr")
    X.indices[X.indptr[3]:X.indptr[4]] = X.indices[X.indptr[3]:X.indptr[4]][::-1].copy()
    X.data[X.indptr[3]:X.indptr[4]] = X.data[X.indptr[3]:X.indptr[4]][::-1].copy()
    y = np.where(rng.random(90) < 0.5, -1.0, 1.0) if loss == "logistic" \
        else rng.standard_normal(90)
    z = rng.standard_normal(90)
    support = np.array([1, 2, 7, 11, 20, 33, 39])
    code = 0 if loss == "squared" else 1
    rho = -ref.loss_derivatives(loss, z, y)
    slope = newton_kernels.shard_slope(X[:, support].T @ rho, np.sum(rho), intercept)
    rows = SupportRows(_Shard(X, y), code, z, support, intercept, slope)
    B = X[:, support].toarray()
    assert np.any(~B.any(axis=1))                       # rows with nothing in S
    if intercept:
        B = np.column_stack([B, np.ones(90)])
    gram = B.T @ (_second_derivative(loss, z)[:, None] * B)
    v = rng.standard_normal(B.shape[1])
    np.testing.assert_allclose(rows.hessian_times_from_rows(v), gram @ v, rtol=1e-12,
                               atol=1e-12)
    point = rng.standard_normal(B.shape[1])
    candidates = point + rng.standard_normal((len(STEP_GRID), B.shape[1]))
    got = rows.trial_sums(point, candidates)
    assert rows._hessian is None                       # no Hessian was formed
    want = [np.sum(ref.loss_values(loss, z + B @ (c - point), y)) for c in candidates]
    np.testing.assert_allclose(got[:-1], want, rtol=1e-12)


@pytest.mark.parametrize("intercept", [True, False])
def test_server_trial_sums_from_the_reduced_sums_are_the_losses_over_all_rows(intercept,
                                                                             ref):
    """Dis-DDSS's server, squared loss: quadratic_trial_sums from the shards' summed
    loss, slope and Hessian (what it reduces) is the loss over all rows at every
    candidate, then at the point."""
    rng = np.random.default_rng(9)
    X = sp.random(100, 35, density=0.25, random_state=9, format="csr")
    y, z = rng.standard_normal(100), rng.standard_normal(100)
    support = np.array([0, 5, 6, 12, 20, 31])
    shards = (slice(0, 45), slice(45, 100))
    loss_sum, slope, hessian = 0.0, 0.0, 0.0
    for part in shards:
        rho = y[part] - z[part]
        rows = SupportRows(_Shard(sp.csr_matrix(X[part]), y[part]), 0, z[part], support,
                           intercept, None)
        loss_sum += 0.5 * float(rho @ rho)
        slope = slope + newton_kernels.shard_slope(X[part][:, support].T @ rho,
                                                   np.sum(rho), intercept)
        hessian = hessian + from_upper_triangle(rows.hessian_triangle(),
                                                support.shape[0] + intercept)
    B = X[:, support].toarray()
    if intercept:
        B = np.column_stack([B, np.ones(100)])
    point = rng.standard_normal(B.shape[1])
    candidates = point + rng.standard_normal((len(STEP_GRID), B.shape[1]))
    got = newton_kernels.quadratic_trial_sums(
        loss_sum, slope, hessian, newton_kernels.trial_moves(point, candidates))
    want = [np.sum(ref.loss_values("squared", z + B @ (c - point), y))
            for c in candidates] + [np.sum(ref.loss_values("squared", z, y))]
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("dim", [1, 2, 63, 64, 65, 130])
def test_a_packed_upper_triangle_unpacks_to_its_symmetric_matrix(dim):
    rng = np.random.default_rng(dim)
    a = rng.standard_normal((dim, dim))
    matrix = a + a.T
    packed = upper_triangle(matrix)
    assert packed.shape == (dim * (dim + 1) // 2,)
    np.testing.assert_array_equal(from_upper_triangle(packed, dim), matrix)
    out = np.full((dim, dim), np.nan)          # every entry written, into ``out``
    assert from_upper_triangle(packed, dim, out) is out
    np.testing.assert_array_equal(out, matrix)


def test_symmetric_times_is_the_product_with_the_symmetric_matrix():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((40, 40))
    matrix, v = a + a.T, rng.standard_normal(40)
    np.testing.assert_allclose(newton_kernels.symmetric_times(matrix, v), matrix @ v,
                               rtol=1e-13, atol=1e-13)
    # a product reads the lower triangle: the upper one may hold anything
    lower_only = np.tril(matrix) + np.triu(np.full((40, 40), np.nan), 1)
    np.testing.assert_allclose(newton_kernels.symmetric_times(lower_only, v), matrix @ v,
                               rtol=1e-13, atol=1e-13)


def test_the_lower_triangle_unpacked_serves_every_read_of_the_servers_step():
    """lower_from_upper_triangle fills row j's first j + 1 entries from the packed upper
    triangle and writes nothing above the diagonal; from that lower triangle alone
    symmetric_submatrix gives any block (positions in any order), symmetric_from_lower
    the whole matrix, quadratic_trial_sums the exact quadratic model, and dense_move the
    same move as from the full matrix, on the orthant path (|S| <= 398) too; the pages
    touch_lower_triangle maps are those the triangle lies in."""
    from asyncopt.runtime import touch_lower_triangle
    rng = np.random.default_rng(3)
    a = rng.standard_normal((9, 30))
    matrix = a.T @ a + np.eye(30)
    packed = newton_kernels.upper_triangle(matrix)
    lower = newton_kernels.lower_from_upper_triangle(packed, 30,
                                                     out=np.full((30, 30), np.nan))
    np.testing.assert_array_equal(np.tril(lower), np.tril(matrix))
    assert np.isnan(lower[np.triu_indices(30, 1)]).all()
    positions = np.array([17, 2, 29, 5])
    np.testing.assert_array_equal(newton_kernels.symmetric_submatrix(lower, positions),
                                  matrix[np.ix_(positions, positions)])
    np.testing.assert_array_equal(newton_kernels.symmetric_from_lower(lower.copy()),
                                  matrix)
    moves = rng.standard_normal((4, 30))
    np.testing.assert_allclose(
        newton_kernels.quadratic_trial_sums(2.0, np.ones(30), lower, moves),
        2.0 + moves.sum(axis=1) + 0.5 * np.einsum("ij,jk,ik->i", moves, matrix, moves),
        rtol=1e-12)
    corr, point = rng.standard_normal(29) * 5, np.r_[rng.standard_normal(20), np.zeros(10)]
    for n in (1, 50):
        got, want = (dense_move(h, corr, 0.3, point, np.ones(29), 1.0, n, True)
                     for h in (lower.copy(), matrix.copy()))
        assert got[0] == want[0] and got[0] is not None
        np.testing.assert_allclose(got[1], want[1], rtol=1e-10, atol=1e-12)
    dim = 1500
    memory = np.ones(dim * dim * 8, dtype=np.uint8)
    touch_lower_triangle(memory, dim)
    touched = np.unique(np.flatnonzero(memory == 0) // 4096)
    starts = np.arange(dim) * dim * 8
    holds = np.zeros(-(-memory.shape[0] // 4096), dtype=bool)
    for j, start in enumerate(starts):
        holds[start // 4096:(start + 8 * (j + 1) - 1) // 4096 + 1] = True
    np.testing.assert_array_equal(touched, np.flatnonzero(holds))
    assert touched.shape[0] < 0.8 * holds.shape[0]


def test_candidates_along_the_line_and_projected_onto_the_orthant():
    point = np.array([1.0, -2.0, 0.5])          # the last entry free (an intercept)
    target = np.array([0.0, -1.0, 3.0])
    line = linear_candidates(point, target)
    assert np.array_equal(line[0], target)
    np.testing.assert_allclose(line, point + STEP_GRID[:, None] * (target - point))
    direction = np.array([-4.0, 1.0, -2.0])
    projected = projected_candidates(point, direction, 2)
    free = point + STEP_GRID[:, None] * direction
    # coordinate 0 crosses zero for t > 1/4 and stops there; the intercept goes anywhere
    np.testing.assert_array_equal(projected[:, 0], np.where(STEP_GRID > 0.25, 0.0,
                                                            free[:, 0]))
    np.testing.assert_array_equal(projected[:, 1:], free[:, 1:])
    # d_j = -x_j lands on zero exactly
    assert np.all(projected_candidates(point, -point, 2)[0] == 0.0)


def _model(H, g, d):
    return g @ d + 0.5 * d @ H @ d


def test_orthant_newton_target_by_hand():
    # q = 2 d0 + |d|^2 / 2 from (1, 1): the Newton point (-1, 1) crosses zero at t = 1/2;
    # coordinate 0 stops at 0, and coordinate 1 is already at its minimum
    target, predicted, pieces = orthant_newton_target(np.eye(2), np.array([2.0, 0.0]),
                                                      np.array([1.0, 1.0]), 2)
    np.testing.assert_allclose(target, [0.0, 1.0], atol=1e-12)
    assert target[0] == 0.0
    assert predicted == pytest.approx(-1.5)
    # the same with the second entry free (an intercept): nothing stops it
    target, _, _ = orthant_newton_target(np.eye(2), np.array([0.5, 3.0]),
                                         np.array([1.0, 1.0]), 1)
    np.testing.assert_allclose(target, [0.5, -2.0], atol=1e-9)


def test_orthant_newton_target_descends_and_keeps_the_orthant():
    rng = np.random.default_rng(5)
    for trial in range(200):
        k = int(rng.integers(1, 12))
        M = rng.standard_normal((k + 3, k))
        if trial % 3 == 0:                # exactly equal columns: a singular H
            M[:, -1] = M[:, 0]
        H = M.T @ M
        g = rng.standard_normal(k)
        start = rng.standard_normal(k)
        n_penalized = k - 1 if trial % 2 else k
        target, predicted, _ = orthant_newton_target(H, g, start, n_penalized)
        change = target - start
        assert predicted == pytest.approx(_model(H, g, change), abs=1e-9)
        assert predicted <= 1e-12
        pen = slice(0, n_penalized)
        # a penalized coordinate keeps its sign or stops at exactly zero
        assert np.all((np.sign(target[pen]) == np.sign(start[pen])) | (target[pen] == 0.0))
        # where nothing stopped at zero and H is regular, the target is the Newton point
        if trial % 3 and np.all(target[pen] != 0.0):
            np.testing.assert_allclose(target, start - np.linalg.solve(H, g),
                                       rtol=1e-6, atol=1e-6)


def test_best_candidate_is_the_lowest_exact_objective_and_never_a_rise():
    n, lam = 10, 0.5
    w = np.array([1.0, 2.0])
    start, target = np.array([1.0, -1.0]), np.array([0.0, -0.5])
    candidates = linear_candidates(start, target)
    # penalties along the line: t = 1 gives lam * (0 + 2 * 0.5) = 0.5, x itself 1.5
    sums = np.array([30.0, 20.0, 22.0, 24.0, 26.0, 28.0, 29.0, 30.0])
    index, change = best_candidate(sums, n, lam, w, start, candidates)
    pen = [lam * w @ np.abs(c) for c in candidates] + [lam * w @ np.abs(start)]
    objective = sums / n + np.array(pen)
    assert index == np.argmin(objective[:-1])
    assert change == pytest.approx(objective.min() - objective[-1])
    # when every candidate is worse than x, none
    index, change = best_candidate(np.array([90.0] * 7 + [1.0]), n, lam, w, start,
                                   candidates)
    assert index == -1 and change == 0.0


def test_stall_watch_tries_after_a_slow_epoch_on_a_settled_support():
    watch = StallWatch()
    assert not watch.should_try(0, 1.0, 10, None)          # no previous gap yet
    assert not watch.should_try(1, 0.1, 10, 0)             # a fast epoch
    assert not watch.should_try(2, 0.1 * STALL_RATIO * 1.01, 10, None)   # churn unknown
    assert not watch.should_try(3, 0.05 * 1.01, 1000, 1 + int(SUPPORT_CHURN * 1000))
    assert watch.should_try(4, 0.05, 1000, int(SUPPORT_CHURN * 1000))
    watch.tried(4, 0.05, 0.04)                             # it failed: wait 2 epochs
    assert not watch.should_try(5, 0.039, 10, 0)
    assert watch.should_try(6, 0.0389, 10, 0)
    watch.tried(6, 0.0389, 0.001)                          # it worked: no wait
    assert watch.should_try(7, 0.0009, 10, 0)
    assert not watch.should_try(8, 0.00089, MAX_SUPPORT + 1, 0)
    assert not watch.should_try(9, 0.00088, 0, 0)


def test_stall_watch_asks_a_step_that_prunes_x_for_a_support_that_changed_less():
    """A support changing 10-15% an epoch (CTR at 1e-3 lam_max, the third epoch) is
    tried; where the step would prune x (more than MAX_SUPPORT non-zeros, or a group
    penalty: ``prunes_for_step``) only below PRUNED_CHURN |S|."""
    changes = int(0.15 * 1000)
    assert PRUNED_CHURN * 1000 < changes <= SUPPORT_CHURN * 1000
    watch = StallWatch()
    watch.should_try(0, 0.11, 1000, None)
    assert watch.should_try(1, 0.10, 1000, changes)
    for pruned in (True, newton_policy.prunes_for_step(np.ones(MAX_SUPPORT + 1)),
                   newton_policy.prunes_for_step(np.ones(10), always=True)):
        watch = StallWatch()
        watch.should_try(0, 0.11, 1000, None)
        assert not watch.should_try(1, 0.10, 1000, changes, pruned=pruned)
        assert watch.should_try(2, 0.095, 1000, int(PRUNED_CHURN * 1000), pruned=pruned)
    assert not newton_policy.prunes_for_step(np.ones(MAX_SUPPORT))


def test_stall_watch_with_a_goal_tries_a_fast_epoch_that_is_still_far_from_it():
    # the gap falls 4x an epoch: 1e-2 -> 1e-6 needs log(1e4) / log(4) = 6.6 epochs
    watch = StallWatch()
    watch.should_try(0, 4e-2, 10, None, 1e-6)
    assert watch.should_try(1, 1e-2, 10, 0, 1e-6)
    # near the goal the same rate needs fewer than TRY_EPOCHS more: no try
    watch = StallWatch()
    watch.should_try(0, 4e-6 * 4 ** (TRY_EPOCHS - 1), 10, None, 1e-6)
    assert not watch.should_try(1, 1e-6 * 4 ** (TRY_EPOCHS - 1) * 0.99, 10, 0, 1e-6)
    # and the support must still have settled
    watch = StallWatch()
    watch.should_try(0, 4e-2, 1000, None, 1e-6)
    assert not watch.should_try(1, 1e-2, 1000, 1 + int(SUPPORT_CHURN * 1000), 1e-6)


def test_stall_watch_chains_a_full_step_that_left_violating_zeros():
    watch = StallWatch()
    for _ in range(CHAIN_STEPS):
        assert watch.should_chain(1.0, 2)
    assert not watch.should_chain(1.0, 2)        # CHAIN_STEPS in a row at most
    assert watch.should_chain(1.0, 1)            # the count starts again
    assert not watch.should_chain(0.5, 1)        # a damped step: the epochs go on
    assert not watch.should_chain(1.0, 0)        # nothing missing: nothing to add


def test_firm_support_is_the_non_zeros_that_are_not_settled_zeros():
    x = np.array([1.0, 0.0, -2.0, 0.5, 3.0])
    corr = np.array([0.4, 5.0, -1.0, 0.6, 0.5])
    weights = np.array([1.0, 1.0, 1.0, 1.0, 2.0])
    firm = firm_support(x, corr, 2, 0.5, weights)        # n lam w = [1, 1, 1, 1, 2]
    np.testing.assert_array_equal(firm, [False, False, True, True, False])
    support = np.flatnonzero(x)
    np.testing.assert_array_equal(firm[support],
                                  ~settled_zeros(corr[support], 2, 0.5, weights[support],
                                                 intercept=False))


def test_dense_move_takes_the_projected_direction_where_the_drop_costs_the_path():
    # coordinate 0 has |A_0^T rho| = 0.4 < n lam / 2 (a settled zero), but the coupling
    # of H puts the model's minimum at x + d = [7.3, 8.7] (inside the orthant): dropped
    # first, the path reaches only -0.705; the projected direction is the Newton step
    H = np.array([[1.0, -0.9], [-0.9, 1.0]])
    x, corr = np.array([1.0, 1.0]), np.array([0.4, 3.0])
    kind, vector, predicted, _ = dense_move(H, corr, 0.0, x, np.ones(2), 1.0, 1, False)
    g = -corr + 1.0
    newton = x - np.linalg.solve(H, g)
    assert kind == PROJECTED
    candidates = move_candidates(kind, vector, x, 2)
    np.testing.assert_allclose(candidates[0], newton, rtol=1e-9)
    assert predicted == pytest.approx(-0.5 * g @ np.linalg.solve(H, g), rel=1e-9)
    target, path_predicted, _ = orthant_newton_target(H, g, x, 2,
                                                      settled_zeros(corr, 1, 1.0,
                                                                    np.ones(2), False))
    assert path_predicted == pytest.approx(-0.705) and path_predicted > predicted
    # without the coupling, from x_0 = 0.3 the Newton step (0.3 - 0.6) crosses zero:
    # the model's minimum on the orthant has x_0 = 0 exactly, and both moves reach it
    kind, vector, _, _ = dense_move(np.eye(2), corr, 0.0, np.array([0.3, 1.0]), np.ones(2),
                                 1.0, 1, False)
    best = move_candidates(kind, vector, np.array([0.3, 1.0]), 2)[0]
    assert best[0] == 0.0 and best[1] == pytest.approx(3.0)


def test_dense_move_never_models_worse_than_the_path():
    rng = np.random.default_rng(8)
    for trial in range(100):
        k = int(rng.integers(2, 25))
        M = rng.standard_normal((k + 4, k))
        H = M.T @ M
        x = rng.standard_normal(k)
        corr = rng.standard_normal(k) * 2.0
        weights = 0.5 + rng.random(k)
        kind, vector, predicted, signs = dense_move(H, corr, 0.0, x, weights, 1.0, 1, False)
        g = -corr + weights * np.sign(x)
        _, path_predicted, _ = orthant_newton_target(
            H, g, x, k, settled_zeros(corr, 1, 1.0, weights, False))
        if kind is None:
            assert not path_predicted < 0.0
            continue
        first = move_candidates(kind, vector, x, k, signs)[0]
        move = first - x
        # the loss's quadratic model plus the exact change of the penalty
        exact = -corr @ move + 0.5 * move @ H @ move + weights @ (np.abs(first) - np.abs(x))
        assert predicted == pytest.approx(exact, rel=1e-9, abs=1e-12)
        assert predicted <= min(path_predicted, 0.0) + 1e-12
        assert np.all(first * signs >= 0.0)           # in the orthant the move reports
        if kind == LINE:        # the path's, or a solve with violating zeros entering
            np.testing.assert_array_equal(signs, np.where(first != 0.0, np.sign(first),
                                                          np.sign(x)))
        assert kind in (LINE, PROJECTED)



def test_dense_move_on_a_large_support_is_the_projected_newton_step():
    """From |S| where the step under MPI goes Hessian-free, dense_move forms no path
    (LINE) but the projected direction: where the Newton step stays in x's orthant it is
    that step (against a direct solve), where it crosses, the end point keeps the
    orthant and models no worse than the Newton step clipped at zero."""
    k = 4 * MIN_PRODUCTS
    assert uses_hessian_free(k)
    rng = np.random.default_rng(3)
    M = rng.standard_normal((k + 50, k)) / np.sqrt(k)
    H = M.T @ M + 0.5 * np.eye(k)
    x = 5.0 + rng.random(k)
    weights = 0.5 + rng.random(k)
    corr = weights + 0.1 * rng.standard_normal(k)        # near optimal: a small move
    kind, vector, predicted, signs = dense_move(H, corr, 0.0, x, weights, 1.0, 1, False)
    g = -corr + weights
    assert kind == PROJECTED
    first = move_candidates(kind, vector, x, k, signs)[0]
    np.testing.assert_allclose(first, x - np.linalg.solve(H, g), rtol=1e-8, atol=1e-10)
    assert predicted == pytest.approx(-0.5 * g @ np.linalg.solve(H, g), rel=1e-8)
    x[:20] = 1e-3                                         # these cross zero
    kind, vector, predicted, signs = dense_move(H, corr, 0.0, x, weights, 1.0, 1, False)
    assert kind == PROJECTED
    first = move_candidates(kind, vector, x, k, signs)[0]
    assert np.all(first * signs >= 0.0) and np.any(first[:20] == 0.0)
    clipped = np.maximum(x - np.linalg.solve(H, g), 0.0) - x
    assert predicted <= g @ clipped + 0.5 * clipped @ H @ clipped + 1e-12

@pytest.mark.parametrize("wrong_sided", [0, 5])
def test_the_move_from_products_is_the_move_from_the_summed_hessian(wrong_sided):
    """Across machines the server has products of the Hessian sum, not the sum
    (``support_move``, what solvers/mpi.py runs there); on one node, the sum
    (``dense_move``). Above 398 coordinates both are the same maths: the same kind, move
    and orthant from the same H, n = 50; also with 5 coordinates of x on the wrong side
    of zero (what asynchronous epochs leave), which the projected move takes to zero
    and the second solve with the violating zeros to their side (the model -17.7 ->
    -24.4). Each model value and CG iteration is one product."""
    k, n = 4 * MIN_PRODUCTS + 10, 50
    rng = np.random.default_rng(5)
    M = rng.standard_normal((k + 50, k)) / np.sqrt(k)
    H_sum = n * (M.T @ M + 0.5 * np.eye(k))
    x = 0.5 + rng.random(k)
    weights = 0.5 + rng.random(k)
    corr = n * (weights + 0.3 * rng.standard_normal(k))
    x[:wrong_sided] = -0.01
    corr[:wrong_sided] = 2.5 * n * weights[:wrong_sided]
    products = []

    def times(v):
        products.append(1)
        return H_sum @ v

    diagonal = np.diag(H_sum).copy()
    positions = preconditioner_coordinates(diagonal, False)
    block = (positions, H_sum[np.ix_(positions, positions)])
    want = dense_move(H_sum, corr, 0.0, x, weights, 1.0, n, False)
    got = support_move(times, diagonal, block, corr, 0.0, x, weights, 1.0, n, False)
    assert got[0] == want[0] and want[0] is not None
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9, atol=1e-12)
    assert got[2] == pytest.approx(want[2], rel=1e-9) and want[2] < 0.0
    np.testing.assert_array_equal(got[3], want[3])
    assert len(products) >= 2
    if wrong_sided:     # the projected move leaves them at zero; the second solve not
        end = move_candidates(got[0], got[1], x, k, got[3])[0]
        assert got[0] == LINE and np.all(end[:wrong_sided] > 0.0)


def test_settled_zeros_are_the_non_zeros_far_below_the_threshold():
    corr = np.array([3.0, 0.4, 0.6, -2.0])
    weights = np.array([1.0, 1.0, 1.0, 2.0])
    # n lam w = [1, 1, 1, 2]: ratios [3, 0.4, 0.6, 1.0]
    drop = settled_zeros(corr, 2, 0.5, weights, intercept=True)
    np.testing.assert_array_equal(drop, [False, 0.4 < 1 - DROP_MARGIN,
                                         0.6 < 1 - DROP_MARGIN, False, False])


def test_orthant_newton_target_with_dropped_coordinates():
    # q = |d|^2 / 2 + g^T d, H = I: dropping coordinate 1 sets it to 0 and the others
    # go to their Newton values (no coupling)
    g = np.array([1.0, -0.5, 2.0])
    start = np.array([3.0, 1.0, 5.0])
    target, predicted, _ = orthant_newton_target(np.eye(3), g, start, 3,
                                                 np.array([False, True, False]))
    np.testing.assert_allclose(target, [2.0, 0.0, 3.0], atol=1e-9)
    assert predicted == pytest.approx(_model(np.eye(3), g, target - start))


def _hessian_free(H, g, start, n_penalized, drop=None):
    direction, products, _ = hessian_free_direction(lambda v: H @ v, np.diag(H).copy(), g,
                                                    start, n_penalized, drop)
    return direction, products


def test_hessian_free_direction_frees_what_fixing_every_crossing_at_once_overfixes():
    # H couples the two negatively: the Newton point (-1, -0.2) crosses zero in both
    # coordinates; fixed at zero together, coordinate 1's model gradient points back
    # into the orthant, so it is freed and solved again: (0, 0.7), the end of the
    # Hessian's path (which stops coordinate 0 first, at t = 1/2)
    H = np.array([[1.0, -0.9], [-0.9, 1.0]])
    start = np.array([1.0, 1.0])
    g = -H @ np.array([-2.0, -1.2])
    direction, _ = _hessian_free(H, g, start, 2)
    np.testing.assert_allclose(start + direction, [0.0, 0.7], atol=1e-9)
    assert start[0] + direction[0] == 0.0
    target, _, _ = orthant_newton_target(H, g, start, 2)
    np.testing.assert_allclose(start + direction, target, atol=1e-9)


def test_hessian_free_direction_is_the_newton_step_where_nothing_crosses():
    rng = np.random.default_rng(6)
    for trial in range(100):
        k = int(rng.integers(2, 40))
        M = rng.standard_normal((k + 5, k))
        H = M.T @ M / k + 0.1 * np.eye(k)
        start = rng.choice([-1.0, 1.0], k) * (5.0 + rng.random(k))
        g = -H @ (0.5 * rng.standard_normal(k))        # the Newton step stays in the orthant
        n_penalized = k - trial % 2
        direction, products = _hessian_free(H, g, start, n_penalized)
        target, _, _ = orthant_newton_target(H, g, start, n_penalized)
        np.testing.assert_allclose(start + direction, target, rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(start + direction, start - np.linalg.solve(H, g),
                                   rtol=1e-7, atol=1e-7)
        assert products <= newton_policy.MIN_PRODUCTS + 1


def test_preconditioner_coordinates_are_the_largest_ranked_and_the_intercept():
    ranking = np.arange(200.0)[::-1] % 97          # ties broken by position
    top = preconditioner_coordinates(ranking, intercept=False)
    assert top.shape[0] == newton_model.PRECONDITIONER_BLOCK
    np.testing.assert_array_equal(top, np.sort(np.argsort(-ranking, kind="stable")[:50]))
    assert np.all(np.diff(top) > 0)
    assert ranking[top].min() >= np.delete(ranking, top).max()
    with_b = preconditioner_coordinates(ranking, intercept=True)
    np.testing.assert_array_equal(with_b, np.append(top, 200))
    np.testing.assert_array_equal(preconditioner_coordinates(np.ones(3), True),
                                  [0, 1, 2, 3])
    for size in (0, 3, 50, 51, 400):          # what the workers receive under MPI
        for intercept in (False, True):
            assert newton_model.preconditioner_size(size, intercept) == \
                preconditioner_coordinates(np.arange(float(size)), intercept).shape[0]


def test_block_preconditioner_inverts_the_block_and_the_diagonal_of_the_free_part():
    rng = np.random.default_rng(11)
    dim = 12
    M = rng.standard_normal((30, dim))
    H = M.T @ M
    ridge = 1e-3
    positions = np.array([1, 4, 5, 9, 11])
    free = np.ones(dim, dtype=bool)
    free[[0, 5, 7]] = False
    block = (positions, H[np.ix_(positions, positions)])
    apply = block_preconditioner(np.diag(H), ridge, free, block)
    # M restricted to the free coordinates: H + ridge I on the free members of the block,
    # its diagonal elsewhere
    F = np.flatnonzero(free)
    model = np.diag(np.diag(H)[F] + ridge)
    inside = np.isin(F, positions)
    model[np.ix_(inside, inside)] = H[np.ix_(F[inside], F[inside])] + ridge * np.eye(
        int(inside.sum()))
    r = rng.standard_normal(F.shape[0])
    np.testing.assert_allclose(apply(r), np.linalg.solve(model, r), rtol=1e-10)
    # no block, or one that is not positive definite: Jacobi
    jacobi = r / (np.diag(H)[F] + ridge)
    np.testing.assert_allclose(block_preconditioner(np.diag(H), ridge, free, None)(r),
                               jacobi)
    indefinite = -np.eye(positions.shape[0])
    np.testing.assert_allclose(block_preconditioner(np.diag(H), ridge, free,
                                                    (positions, indefinite))(r), jacobi)


def test_the_block_preconditioner_halves_cgs_products_on_ctr_like_columns():
    """make_ctr's 500 most frequent features and the intercept, as CTR 200,000 x 100,000's
    support (``preconditioner_coordinates``): the intercept's direction stands far above
    the rest of the Jacobi-scaled spectrum. The same Newton step in 24 products instead
    of 46."""
    from asyncopt.data import make_ctr
    X, _, _ = make_ctr(6000, 3000, nnz_per_row=30, random_state=0)
    X = X.tocsc()
    S = np.sort(np.argsort(-np.diff(X.indptr), kind="stable")[:500])
    A = np.hstack([X[:, S].toarray(), np.ones((X.shape[0], 1))])
    H = A.T @ A / X.shape[0]
    dim = H.shape[0]
    rng = np.random.default_rng(0)
    start = np.append(rng.choice([-1.0, 1.0], dim - 1) * 100.0, 0.3)   # nothing crosses
    g = -H @ (0.1 * rng.standard_normal(dim))
    diagonal = np.diag(H).copy()
    positions = preconditioner_coordinates(diagonal[:-1], intercept=True)
    newton = -np.linalg.solve(H, g)
    jacobi, jacobi_products, _ = hessian_free_direction(lambda v: H @ v, diagonal, g,
                                                        start, dim - 1, None)
    block, block_products, _ = hessian_free_direction(
        lambda v: H @ v, diagonal, g, start, dim - 1, None, None,
        (positions, H[np.ix_(positions, positions)]))
    np.testing.assert_allclose(jacobi, newton, atol=1e-8)
    np.testing.assert_allclose(block, newton, atol=1e-8)
    assert block_products <= 0.6 * jacobi_products


def test_upper_triangle_round_trip():
    """upper_triangle packs (i, j), i <= j, column by column (LAPACK's packed "U" order,
    entry j (j + 1) / 2 + i), of any square matrix; from_upper_triangle restores a
    symmetric one."""
    rng = np.random.default_rng(2)
    M = rng.standard_normal((6, 6))
    np.testing.assert_array_equal(upper_triangle(M),
                                  [M[i, j] for j in range(6) for i in range(j + 1)])
    H = M + M.T
    values = upper_triangle(H)
    assert values.shape[0] == 21
    np.testing.assert_array_equal(from_upper_triangle(values, 6), H)


def test_hessian_free_direction_solves_the_quadratic_program_on_the_orthant(monkeypatch):
    """Given pieces enough, the end point satisfies the KKT conditions of min q(d) over
    the orthant of x (sigma_j (x_j + d_j) >= 0 for the penalized j): the model gradient
    r = g + H d is zero on the coordinates off zero, and sigma_j r_j >= 0 on those at
    zero (they would rise only out of the orthant); the dropped ones included, since
    the model frees them when it wants them back. Singular H (equal columns) too, with
    g as in the Lasso (-A^T rho / n + lam w sigma): bounded on the orthant."""
    monkeypatch.setattr(newton_model, "CG_PIECES", 60)
    monkeypatch.setattr(newton_policy, "MIN_PRODUCTS", 10 ** 6)
    rng = np.random.default_rng(7)
    for trial in range(150):
        k = int(rng.integers(2, 30))
        M = rng.standard_normal((k + 3, k))
        if trial % 5 == 0:
            M[:, -1] = M[:, 0]
        H = M.T @ M
        start = rng.standard_normal(k)
        n_penalized = k - trial % 2
        g = M.T @ rng.standard_normal(k + 3)
        g[:n_penalized] += 0.3 * np.sign(start[:n_penalized])
        drop = (np.arange(k) < n_penalized) & (rng.random(k) < 0.2)
        direction, _ = _hessian_free(H, g, start, n_penalized,
                                     drop if trial % 3 else None)
        if direction is None:          # x is already the model's minimum on the orthant
            continue
        assert g @ direction < 0.0
        moved = start + direction
        pen = slice(0, n_penalized)
        assert np.all((np.sign(moved[pen]) == np.sign(start[pen])) | (moved[pen] == 0.0))
        r = g + H @ direction
        scale = 1e-6 * (1.0 + np.abs(g).max())
        off_zero = np.ones(k, dtype=bool)
        off_zero[pen] = moved[pen] != 0.0
        assert np.all(np.abs(r[off_zero]) <= scale)
        assert np.all(np.sign(start[pen]) * r[pen] >= -scale)


def test_products_take_over_where_they_cost_fewer_bytes_than_the_hessian():
    # |S| + 1 numbers each way per product, (|S| + 1)(|S| + 2) / 2 for the upper triangle
    bound = 4 * newton_policy.MIN_PRODUCTS - 2
    assert not uses_hessian_free(bound) and uses_hessian_free(bound + 1)
    for size in (bound + 1, 1700):
        dim = size + 1
        assert newton_policy.product_budget(dim) * 2 * dim <= dim * (dim + 1) // 2


def _a9a_degree_2(rows):
    X, y = load_a9a(degree=2)
    X, y = X[:rows], y[:rows]
    return X[:, np.flatnonzero(np.diff(X.tocsc().indptr))].tocsr(), y


@pytest.mark.parametrize("loss,fit_intercept", [("squared", True), ("logistic", False)])
def test_newton_step_ends_the_plateau_of_nearly_equal_columns(loss, fit_intercept, ref):
    """a9a degree 2 (3,000 rows): prox-SVRG epochs alone need more than 1,000 epochs to
    reach 1e-9 (the gap stays put while weight drifts between nearly equal columns); with
    the step DDSS needs at most 40, and the independent certificate at its solution
    confirms the gap."""
    X, y = _a9a_degree_2(3000)
    base = Problem(X, y, loss, L1(X.shape[1]), 1.0, fit_intercept)
    problem = base.with_lam(1e-2 * base.lam_max())
    plain = solve_ddss(problem, tol=1e-9, max_epochs=200, random_state=0,
                       support_newton=False)
    assert not plain.converged
    res = solve_ddss(problem, tol=1e-9, max_epochs=200, random_state=0)
    assert res.converged and res.n_iter <= 40
    assert any(h["newton_step"] > 0 for h in res.history)
    assert res.primal < plain.primal
    cert = ref.certificate(X, y, loss, problem.penalty, problem.lam, fit_intercept,
                           res.coef)
    p0 = problem.null_objective()
    assert cert.gap <= 1e-9 * p0
    assert abs(cert.primal - res.primal) <= 1e-12 * p0


def test_entering_coordinates_are_the_worst_violating_zeros_with_their_sign():
    x = np.array([0.0, 1.5, 0.0, 0.0, -2.0, 0.0, 0.0])
    correlation = np.array([3.0, 9.0, -1.0, -5.0, 0.5, 2.5, 0.9])
    weights = np.ones(7)
    # n lam w = 2: zeros 0 (1.5x), 3 (2.5x, negative) and 5 (1.25x) violate; 2, 6 do not
    code = newton_policy.entering_coordinates(x, correlation, 1, 2.0, weights, 10)
    np.testing.assert_array_equal(code, [1.0, -4.0, 6.0])      # (j + 1) sign, by j
    assert list(newton_policy.entering_coordinates(x, correlation, 1, 2.0, weights, 2)) \
        == [1.0, -4.0]
    assert newton_policy.entering_coordinates(x, correlation, 1, 2.0, weights, 0).size == 0
    support, point, signs = newton_model.support_point(x, 0.7, True, code)
    np.testing.assert_array_equal(support, [0, 1, 3, 4, 5])
    np.testing.assert_array_equal(point, [0.0, 1.5, 0.0, -2.0, 0.0, 0.7])
    np.testing.assert_array_equal(signs, [1.0, 1.0, -1.0, -1.0, 1.0])
    assert newton_policy.entering_limit(100) == 10
    assert newton_policy.entering_limit(1000) == 50
    assert newton_policy.entering_limit(MAX_SUPPORT - 3) == 3



def test_popular_zeros_enter_with_the_sign_of_their_correlation():
    """Given the columns' norms, the zeros among the POPULAR_SHARE |x's non-zeros|
    largest columns enter S as well, with sign(A_j^T rho) (+1 at 0), beside the
    violating zeros; a popular non-zero is not entering."""
    x = np.zeros(40)
    x[[3, 8, 11, 20, 25, 30, 33, 36, 38, 39, 2, 14]] = 1.0   # 12 non-zeros: 2 popular
    column_sq = np.arange(40, dtype=np.float64)
    column_sq[[5, 9]] = [100.0, 90.0]                          # the two largest columns
    correlation = np.zeros(40)
    correlation[9] = -0.3
    correlation[0] = 2.5                                       # violating (n lam w = 2)
    assert POPULAR_SHARE * 12 <= 2 < POPULAR_SHARE * 12 + 1
    np.testing.assert_array_equal(newton_policy.popular_zeros(x, column_sq), [5, 9])
    code = newton_policy.entering_coordinates(x, correlation, 1, 2.0, np.ones(40), 10,
                                              column_sq)
    np.testing.assert_array_equal(code, [1.0, 6.0, -10.0])
    np.testing.assert_array_equal(newton_policy.popular_zeros(x, column_sq, 1), [5])
    x[5] = -1.0                                # a popular non-zero: not entering
    np.testing.assert_array_equal(newton_policy.popular_zeros(x, column_sq), [9])
    assert newton_policy.entering_coordinates(x, correlation, 1, 2.0, np.ones(40), 10) \
        .tolist() == [1.0]
    # S stays within MAX_SUPPORT: the largest columns' zeros first
    x = np.zeros(MAX_SUPPORT + 100)
    x[100:MAX_SUPPORT + 99] = 1.0                 # MAX_SUPPORT - 1 non-zeros
    column_sq = np.where(x != 0, 10.0, 1.0)
    column_sq[[3, 7, 9]] = [60.0, 80.0, 70.0]
    code = newton_policy.entering_coordinates(x, np.zeros_like(x), 1, 2.0,
                                              np.ones_like(x), 10, column_sq)
    np.testing.assert_array_equal(code, [8.0])


def test_entering_coordinates_take_zeros_within_ten_percent_of_violating():
    x = np.array([0.0, 1.5, 0.0, 0.0])
    correlation = np.array([3.0, 9.0, -1.85, 1.75])
    # n lam w = 2: zero 0 violates (1.5x), zero 2 is within 10% (0.925x), zero 3 is not
    code = newton_policy.entering_coordinates(x, correlation, 1, 2.0, np.ones(4), 10)
    np.testing.assert_array_equal(code, [1.0, -3.0])
    np.testing.assert_array_equal(
        newton_policy.entering_coordinates(x, correlation, 1, 2.0, np.ones(4), 1), [1.0])


def test_a_coordinate_the_model_puts_on_the_other_side_changes_sign():
    """hessian_free_direction with the penalty: from x_0 = -0.01 with A_0^T rho = 2.5 >
    n lam w = 2, the step in x's orthant stops at zero, where the model's slope (-4.49)
    beats the penalty with the other sign: the orthant flips and the direction ends at
    the new side's minimum, 0.49; the candidates go through zero (short steps move it a
    little). Without the penalty it stays at zero; dense_move (path and projected)
    reports the flipped orthant with the projected move."""
    H, point = np.eye(1), np.array([-0.01])
    g = np.array([-2.5 + 2.0 * -1.0])
    direction, _, signs = hessian_free_direction(lambda v: H @ v, np.ones(1), g, point, 1,
                                                 None, None, None, np.array([2.0]))
    np.testing.assert_allclose(point + direction, [0.49], rtol=1e-8)
    np.testing.assert_array_equal(signs, [1.0])
    direction, _, signs = hessian_free_direction(lambda v: H @ v, np.ones(1), g, point, 1,
                                                 None)
    np.testing.assert_allclose(point + direction, [0.0], atol=1e-15)
    np.testing.assert_array_equal(signs, [-1.0])
    kind, vector, predicted, signs = dense_move(H, np.array([2.5]), 0.0, point, np.ones(1),
                                                2.0, 1, False)
    assert kind == PROJECTED
    np.testing.assert_array_equal(signs, [1.0])
    candidates = move_candidates(kind, vector, point, 1, signs)
    np.testing.assert_allclose(candidates[:, 0], -0.01 + 0.5 * STEP_GRID, rtol=1e-8)
    # exact: -2.5 * 0.5 + 0.5^2 / 2 + 2 (0.49 - 0.01)
    assert predicted == pytest.approx(-1.25 + 0.125 + 0.96, rel=1e-8)


def _lasso_solution(ref, make_data, seed=4):
    X, y = make_data.random_data(seed, 120, 40, fmt="csr", n_informative=10)
    base = Problem(X, y, "squared", L1(40), 1.0, True)
    problem = base.with_lam(0.05 * base.lam_max())
    exact = solve_ddss(problem, tol=1e-14, max_epochs=20000, random_state=0)
    p0 = problem.null_objective()
    assert ref.certificate(X, y, "squared", problem.penalty, problem.lam, True,
                           exact.coef).gap <= 1e-12 * p0
    return problem, exact, p0


def _solution_without_its_largest(ref, make_data):
    """(problem, its solution, P(0), the solution with its largest coefficient set to zero
    and the others moved 5%, that coefficient's index)."""
    problem, exact, p0 = _lasso_solution(ref, make_data)
    rng = np.random.default_rng(0)
    start = exact.coef * (1.0 + 0.05 * rng.standard_normal(40))
    missing = int(np.argmax(np.abs(exact.coef)))
    start[missing] = 0.0
    return problem, exact, p0, start, missing


def test_a_missing_coordinate_enters_the_step_with_its_sign(ref, make_data, monkeypatch):
    """x is the Lasso solution with its largest coefficient set to zero and the others
    moved 5%: a step on the non-zeros of x alone cannot certify, the step with the
    violating zero entering lands on the solution."""
    problem, exact, p0, start, missing = _solution_without_its_largest(ref, make_data)
    active = problem.full_active_set()

    def step(x):
        cert = active.certificate(x, exact.intercept)
        moved = newton_step.support_newton_step(active, cert, x)
        assert moved is not None
        return active.certificate(x, moved[0])

    with monkeypatch.context() as patch:
        patch.setattr(newton_policy, "ENTERING_MIN", 0)
        patch.setattr(newton_policy, "ENTERING_SHARE", 0.0)
        alone = start.copy()
        assert step(alone).gap > 1e-3 * p0 and alone[missing] == 0.0
    x = start.copy()
    cert = step(x)
    assert cert.gap <= 1e-8 * p0      # the ridge and CG's tolerance: 2e-10 here
    assert np.sign(x[missing]) == np.sign(exact.coef[missing])
    np.testing.assert_allclose(x, exact.coef, rtol=0, atol=1e-6 * np.abs(exact.coef).max())


@pytest.mark.parametrize("flipped,scale", [(1, 0.5), (3, 0.5), (3, 2.0)])
def test_non_zeros_on_the_wrong_side_of_zero_change_sign_within_one_step(ref, make_data,
                                                                        flipped, scale):
    """x is the Lasso solution with its smallest non-zeros put on the wrong side of zero
    (-scale times their value) and the others moved 5%, what asynchronous epochs left on
    CTR's popular features: the move takes them to zero, they then violate the model's
    optimality condition, and dense_move's second solve with them entering on their other
    side lands on the solution in the same step."""
    problem, exact, p0 = _lasso_solution(ref, make_data)
    active = problem.full_active_set()
    rng = np.random.default_rng(0)
    x = exact.coef * (1.0 + 0.05 * rng.standard_normal(40))
    support = np.flatnonzero(exact.coef)
    wrong = support[np.argsort(np.abs(exact.coef[support]))[:flipped]]
    x[wrong] = -scale * exact.coef[wrong]
    b, t = newton_step.support_newton_step(active, active.certificate(
        x, exact.intercept), x)
    assert active.certificate(x, b).gap <= 1e-8 * p0
    np.testing.assert_array_equal(np.sign(x), np.sign(exact.coef))


def test_a_full_step_that_missed_a_coordinate_is_chained_to_one_that_certifies(
        ref, make_data, monkeypatch):
    """The case StallWatch.should_chain is for: a step without the missing coordinate
    takes t = 1, lands on the optimum over its support, and leaves that coordinate
    violating; the chained steps, with the run's HessianCache, let it in and certify."""
    problem, exact, p0, x, missing = _solution_without_its_largest(ref, make_data)
    active = problem.full_active_set()
    n, lam = problem.n_samples, problem.lam
    cache, watch = HessianCache(), StallWatch()
    with monkeypatch.context() as patch:
        patch.setattr(newton_policy, "ENTERING_MIN", 0)
        patch.setattr(newton_policy, "ENTERING_SHARE", 0.0)
        b, t = newton_step.support_newton_step(
            active, active.certificate(x, exact.intercept), x, cache)
    cert = active.certificate(x, b)
    violating, _ = newton_policy.violating_zeros(x, cert.correlation, n, lam,
                                                 active.weights)
    assert t == 1.0 and cert.gap > 1e-3 * p0 and missing in violating
    steps = 1
    while watch.should_chain(t, violating.shape[0]):
        b, t = newton_step.support_newton_step(active, cert, x, cache)
        cert = active.certificate(x, b)
        violating, _ = newton_policy.violating_zeros(x, cert.correlation, n, lam,
                                                     active.weights)
        steps += 1
    # the second step lets the missing one in; the coordinate of S its move took to zero
    # and left violating (a third step before dense_move solved again with it) enters
    # within it
    assert steps == 2 and cert.gap <= 1e-8 * p0
    assert missing in cache.ids


def test_small_non_zeros_beyond_max_support_are_pruned_before_the_step(ref, make_data,
                                                                       monkeypatch):
    """More than MAX_SUPPORT non-zeros, most of them tiny ones outside the firm support:
    the step sets those to zero first, then lands on the solution; with a P that no
    candidate beats, x is left exactly as it was."""
    problem, exact, p0 = _lasso_solution(ref, make_data)
    active = problem.full_active_set()
    solution = np.flatnonzero(exact.coef)
    monkeypatch.setattr(newton_policy, "MAX_SUPPORT", solution.shape[0] + 2)
    rng = np.random.default_rng(1)
    x = exact.coef * (1.0 + 0.005 * rng.standard_normal(40))
    zeros = np.flatnonzero(exact.coef == 0)
    x[zeros] = 1e-7 * rng.standard_normal(zeros.shape[0])
    cert = active.certificate(x, exact.intercept)
    firm = firm_support(x, cert.correlation, problem.n_samples, problem.lam,
                        active.weights)
    pruned = newton_policy.pruned_coordinates(x, firm)
    assert pruned.shape[0] >= zeros.shape[0] - 2 and not np.any(np.isin(pruned, solution))
    moved = newton_step.support_newton_step(active, cert, x)
    assert moved is not None
    assert active.certificate(x, moved[0]).gap <= 1e-10 * p0
    assert np.count_nonzero(x) == solution.shape[0]
    # at the solution plus the tiny ones, the pruned point is P* itself but nothing
    # improves on it by more than the rounding: x keeps its tiny non-zeros
    monkeypatch.setattr(newton_step, "best_candidate",
                        lambda *args, **kwargs: (-1, 0.0))
    noisy = exact.coef.copy()
    noisy[zeros] = 1e-7 * rng.standard_normal(zeros.shape[0])
    kept = noisy.copy()
    cert = active.certificate(noisy, exact.intercept)
    assert newton_step.support_newton_step(active, cert, noisy) is None
    np.testing.assert_array_equal(noisy, kept)
