"""The support Newton step for group penalties (asyncopt/newton/): the model's
minimiser against an independent proximal gradient solve, the support it works on, and
what it does to DDSS on the group Lasso and the group-penalised logistic regression,
certified by the independent references of conftest."""
import numpy as np
import pytest
import scipy.sparse as sp

import asyncopt.newton.group_model as group_model
import asyncopt.newton.kernels as newton_kernels
import asyncopt.newton.policy as newton_policy
import asyncopt.newton.step as newton_step
from asyncopt.newton.group_model import (group_model_minimum, group_starts,
                                         group_support_point, model_optimality)
from asyncopt.newton.model import best_candidate
from asyncopt.newton.policy import (DROP_MARGIN, entering_groups, firm_support,
                                    violating_zeros)
from asyncopt.newton.step import group_support_newton_step
from asyncopt.losses import UNWEIGHTED
from asyncopt.penalties import GroupL1
from asyncopt.problem import Problem
from asyncopt.solvers.ddss import solve_ddss


def _model_by_proximal_gradient(hessian, gradient, point, sizes, lam_weights, intercept,
                                iterations=20000):
    """The model's minimiser by FISTA on u = [u_S, b] (prox: block soft-thresholding of
    the groups, the intercept free), independent of asyncopt.newton."""
    starts = np.concatenate(([0], np.cumsum(sizes)))
    k = int(starts[-1])
    step = 1.0 / np.linalg.eigvalsh(hessian)[-1]

    def prox(v):
        out = v.copy()
        for g in range(len(sizes)):
            block = v[starts[g]:starts[g + 1]]
            norm = np.linalg.norm(block)
            out[starts[g]:starts[g + 1]] = 0.0 if norm <= step * lam_weights[g] else \
                block * (1.0 - step * lam_weights[g] / norm)
        return out

    u, previous, t = point.copy(), point.copy(), 1.0
    for _ in range(iterations):
        t_next = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
        y = u + (t - 1.0) / t_next * (u - previous)
        grad = gradient + hessian @ (y - point)
        previous, u, t = u, prox(y - step * grad), t_next
        if intercept:
            assert u.shape[0] == k + 1
    return u


def _small_model(intercept):
    """A model of 6 groups of sizes 1-5 (two nearly equal columns, a zero group)."""
    rng = np.random.default_rng(0)
    sizes = np.array([3, 1, 4, 2, 5, 3])
    k = int(sizes.sum())
    dim = k + int(intercept)
    A = rng.standard_normal((60, dim))
    if intercept:
        A[:, -1] = 1.0
    A[:, 1] = A[:, 0] + 0.05 * rng.standard_normal(60)     # two nearly equal columns
    hessian = A.T @ A / 60
    gradient = rng.standard_normal(dim) * 0.5
    point = rng.standard_normal(dim)
    point[3:4] = 0.0                  # a zero group
    return sizes, hessian, gradient, point, 0.4 * np.sqrt(sizes)


def _hessian_free(hessian, gradient, point, starts, lam_weights, intercept, budget=5000):
    """hessian_free_group_minimum given what the workers would reduce of ``hessian``,
    counting the products it asks for."""
    k = int(starts[-1])
    calls = []

    def times(v):
        calls.append(1)
        return hessian @ v
    blocks = [hessian[a:b, a:b] for a, b in zip(starts[:-1], starts[1:])]
    column, corner = (hessian[:k, k], hessian[k, k]) if intercept else (None, 0.0)
    out = group_model.hessian_free_group_minimum(times, blocks, column, corner, gradient,
                                                 point, starts, lam_weights, intercept,
                                                 budget)
    assert out[3] == len(calls) <= budget
    return out


@pytest.mark.parametrize("intercept", [True, False])
def test_model_minimum_is_that_of_an_independent_proximal_gradient_solve(intercept):
    sizes, hessian, gradient, point, lam_weights = _small_model(intercept)
    k = int(sizes.sum())
    starts = group_starts(sizes)
    target, predicted, optimality = group_model_minimum(hessian, gradient, point, starts,
                                                        lam_weights, intercept)
    expected = _model_by_proximal_gradient(hessian, gradient, point, sizes, lam_weights,
                                           intercept)
    np.testing.assert_allclose(target, expected, rtol=0, atol=1e-8)
    assert optimality <= 1e-9

    def model(u):
        move = u - point
        norms = [np.linalg.norm(u[starts[g]:starts[g + 1]]) for g in range(len(sizes))]
        return gradient @ move + move @ hessian @ move / 2 + lam_weights @ norms
    assert abs(predicted - (model(target) - model(point))) <= 1e-12
    # some group ends exactly at zero, and the model says so
    zero = [g for g in range(len(sizes)) if not np.any(target[starts[g]:starts[g + 1]])]
    assert zero and all(np.linalg.norm(expected[starts[g]:starts[g + 1]]) <= 1e-9
                        for g in zero)
    assert model_optimality(gradient[:k] + hessian[:k] @ (expected - point), expected[:k],
                            starts, lam_weights) <= 1e-6


@pytest.mark.parametrize("intercept", [True, False])
def test_hessian_free_model_minimum_is_the_proximal_gradient_solution(intercept):
    """From products and the diagonal blocks alone (two nearly equal columns, a group
    starting at zero): the FISTA solution of the full model, a group exactly at zero where
    FISTA's is, and the predicted change m(target) - m(point)."""
    sizes, hessian, gradient, point, lam_weights = _small_model(intercept)
    starts = group_starts(sizes)
    target, predicted, optimality, _ = _hessian_free(hessian, gradient, point, starts,
                                                     lam_weights, intercept)
    expected = _model_by_proximal_gradient(hessian, gradient, point, sizes, lam_weights,
                                           intercept)
    np.testing.assert_allclose(target, expected, rtol=0, atol=1e-7)
    dense, dense_predicted, _ = group_model_minimum(hessian, gradient, point, starts,
                                                    lam_weights, intercept)
    assert predicted == pytest.approx(dense_predicted, rel=1e-10)
    zero = [g for g in range(len(sizes)) if not np.any(target[starts[g]:starts[g + 1]])]
    assert zero == [g for g in range(len(sizes))
                    if not np.any(dense[starts[g]:starts[g + 1]])]
    assert zero and optimality <= 1e-6


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_hessian_free_model_on_many_groups_matches_the_dense_model(loss, make_data):
    """A problem's own model on 120 groups of 3 (the Hessian of the loss at a perturbed
    point, intercept eliminated or not): groups that must leave, zero groups that must
    enter; the Hessian-free target has the dense model's value to 1e-10 of the change."""
    X, y = make_data.random_data(3, 300, 360, loss, fmt="csr", density=0.05)
    rng = np.random.default_rng(3)
    intercept = loss == "squared"
    k = 360
    A = X.toarray()
    if intercept:
        A = np.column_stack([A, np.ones(300)])
    z = A @ np.r_[rng.standard_normal(k) * (rng.random(k) < 0.3), np.zeros(int(intercept))]
    if loss == "squared":
        second, first = np.ones(300), z - y
    else:
        e = np.exp(-np.abs(z))
        second, first = e / (1 + e) ** 2, -y / (1 + np.exp(y * z))
    hessian = A.T @ (second[:, None] * A) / 300
    gradient = A.T @ first / 300
    point = np.r_[rng.standard_normal(k) * (rng.random(k) < 0.3), np.zeros(int(intercept))]
    starts = group_starts(np.full(120, 3))
    zero = np.flatnonzero([not np.any(point[a:b]) for a, b in zip(starts[:-1], starts[1:])])
    # half the largest slope of a zero group: some zero groups violate at the point
    lam_weights = 0.5 * max(np.linalg.norm(gradient[3 * g:3 * g + 3]) for g in zero) * \
        np.ones(120)
    target, predicted, _, _ = _hessian_free(hessian, gradient, point, starts, lam_weights,
                                            intercept)
    dense, dense_predicted, _ = group_model_minimum(hessian, gradient, point, starts,
                                                    lam_weights, intercept)
    assert dense_predicted < 0.0
    assert abs(predicted - dense_predicted) <= 1e-10 * abs(dense_predicted)
    norms = [np.linalg.norm(target[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    was = [np.linalg.norm(point[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    assert any(w > 0 and v == 0 for w, v in zip(was, norms))       # some left
    assert any(w == 0 and v > 0 for w, v in zip(was, norms))       # some entered


@pytest.mark.parametrize("intercept", [True, False])
def test_group_hessian_blocks_are_the_hessians_blocks_column_and_corner(intercept):
    """What a worker reduces for the Hessian-free group model: the diagonal blocks of its
    Hessian sum on S's groups (sizes 1-4), the intercept's column and corner."""
    from asyncopt.newton.kernels import SupportRows
    rng = np.random.default_rng(9)
    X = sp.random(80, 30, density=0.3, random_state=9, format="csr")
    y = rng.standard_normal(80)

    class Shard:
        indptr, indices, data, n_features = X.indptr, X.indices, X.data, 30
        features = np.arange(30)
        sample_weight = UNWEIGHTED
    Shard.y = y
    support = np.array([2, 3, 4, 8, 9, 15, 16, 17, 18, 25])
    starts = group_starts(np.array([3, 2, 4, 1]))
    rows = SupportRows(Shard, 1, rng.standard_normal(80), support, intercept, None)
    values = newton_kernels.group_hessian_blocks(rows, starts)
    hessian = rows.hessian_sums()
    blocks, column, corner = newton_kernels.split_group_blocks(values, starts, intercept)
    for g, block in enumerate(blocks):
        a, b = starts[g], starts[g + 1]
        np.testing.assert_allclose(block, hessian[a:b, a:b], rtol=1e-12, atol=1e-14)
    assert values.shape[0] == 9 + 4 + 16 + 1 + (11 if intercept else 0)
    if intercept:
        np.testing.assert_allclose(column, hessian[:10, 10], rtol=1e-12)
        assert corner == pytest.approx(hessian[10, 10], rel=1e-12)
    else:
        assert column is None and corner == 0.0


def test_stacked_block_products_are_the_block_diagonal_product():
    import scipy.linalg
    rng = np.random.default_rng(2)
    starts = group_starts(np.array([2, 3, 2, 1, 3]))
    blocks = [rng.standard_normal((m, m)) for m in np.diff(starts)]
    v = rng.standard_normal(11)
    stacks = group_model.stack_blocks(blocks, starts)
    assert sorted(len(groups) for groups, _, _ in stacks) == [1, 2, 2]
    np.testing.assert_allclose(group_model.stacked_times(stacks, v),
                               scipy.linalg.block_diag(*blocks) @ v, rtol=1e-13)


def test_entering_groups_are_the_worst_violating_zero_groups_within_max_support(
        monkeypatch):
    indptr = np.array([0, 2, 5, 6, 8, 10])
    x = np.array([0.5, 0.0, 0, 0, 0, 0.0, 0, 0, 1.0, 2.0])     # groups 0 and 4 non-zero
    correlation = np.array([0.1, 0.1, 3.0, 0.0, 0.0, 0.5, 2.0, 2.0, 9.0, 9.0])
    weights = np.sqrt(np.diff(indptr))
    violating, ratio = violating_zeros(x, correlation, 1, 1.0, weights, indptr)
    # ||A_g^T rho|| / w_g: group 1 3 / sqrt 3, group 2 0.5, group 3 sqrt 8 / sqrt 2
    assert list(violating) == [1, 3]
    np.testing.assert_allclose(ratio[1:4], [np.sqrt(3.0), 0.5, 2.0])
    assert list(entering_groups(x, correlation, 1, 1.0, weights, indptr)) == [1.0, 3.0]
    monkeypatch.setattr(newton_policy, "ENTERING_MIN", 1)
    assert list(entering_groups(x, correlation, 1, 1.0, weights, indptr)) == [3.0]
    monkeypatch.setattr(newton_policy, "MAX_SUPPORT", 6)     # 4 held + room for 2
    monkeypatch.setattr(newton_policy, "ENTERING_MIN", 10)
    assert list(entering_groups(x, correlation, 1, 1.0, weights, indptr)) == [3.0]
    support, point, starts, groups = group_support_point(x, 0.7, True, indptr,
                                                         np.array([1.0, 3.0]))
    assert list(groups) == [0, 1, 3, 4]
    assert list(support) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert list(starts) == [0, 2, 5, 7, 9]
    np.testing.assert_array_equal(point, np.append(x[support], 0.7))
    firm = firm_support(x, correlation, 1, 1.0, weights, indptr)
    # group 0 is non-zero but ||A_0^T rho|| = 0.14 < (1 - DROP_MARGIN) w_0
    assert list(np.flatnonzero(firm)) == [8, 9]


def test_best_candidate_charges_the_groups_norms():
    starts = np.array([0, 2, 3])
    weights = np.array([1.0, 2.0])
    start = np.array([3.0, 4.0, 1.0])          # penalty 5 + 2 = 7 (with |.|: 7 + 2)
    candidates = np.array([[0.0, 0.0, 1.0],    # penalty 2
                           [3.0, 4.0, 0.0]])   # penalty 5 (with |.|: 7)
    sums = np.array([13.0, 9.5, 8.0])           # loss sums (n = 1), the point's last
    index, change = best_candidate(sums, 1, 1.0, weights, start, candidates, 0.0, starts)
    assert index == 1 and change == pytest.approx(-0.5)
    index, _ = best_candidate(np.array([13.0, 11.0, 8.0]), 1, 1.0, weights, start,
                              candidates, 0.0, starts)
    assert index == -1


def _group_problem(make_data, loss, fit_intercept, seed=4, ratio=0.2):
    X, y = make_data.random_data(seed, 300, 60, loss, fmt="csr", density=0.3,
                                 n_informative=20)
    groups = [g.tolist() for g in make_data.random_groups(seed, 60, max_size=5)]
    penalty = GroupL1(60, groups)
    base = Problem(X, y, loss, penalty, 1.0, fit_intercept)
    return X, y, base.with_lam(ratio * base.lam_max())


@pytest.mark.parametrize("hessian_free", [False, True])
@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_ddss_with_the_group_step_certifies_in_far_fewer_epochs(loss, fit_intercept,
                                                                hessian_free, ref,
                                                                make_data, monkeypatch):
    """hessian_free: the step's target from products with the rows restricted to S, with
    no Hessian formed (taken above MAX_SUPPORT coordinates, forced here)."""
    X, y, problem = _group_problem(make_data, loss, fit_intercept)
    plain = solve_ddss(problem, tol=1e-10, random_state=0, max_epochs=3000,
                       support_newton=False)
    if hessian_free:
        monkeypatch.setattr(newton_step, "group_uses_hessian_free", lambda size: True)
        monkeypatch.setattr(newton_step, "group_move", None)        # never the dense one
    res = solve_ddss(problem, tol=1e-10, random_state=0, max_epochs=3000)
    assert plain.converged and res.converged
    assert any(h["newton_step"] > 0 for h in res.history)
    assert len(res.history) * 4 <= len(plain.history), (len(res.history),
                                                         len(plain.history))
    zero_groups = sum(not np.any(res.coef[g]) for g, _ in ref.block_list(problem.penalty))
    assert zero_groups >= 2        # the solution has zero groups, found exactly
    cert = ref.certificate(X, y, loss, problem.penalty, problem.lam, fit_intercept,
                           res.coef)
    p0 = problem.null_objective()
    assert cert.gap <= 1e-9 * p0
    assert abs(cert.primal - res.primal) <= 1e-12 * p0


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_a_group_step_lands_on_the_solution_or_leaves_x_alone(loss, ref, make_data):
    """From the solution with every coefficient moved 5% and its largest group set to
    zero (it enters as a violating zero group), one step lands on the solution; from the
    solution itself nothing lowers P and x is left exactly as it was."""
    X, y, problem = _group_problem(make_data, loss, True)
    exact = solve_ddss(problem, tol=1e-13, random_state=0, max_epochs=3000)
    blocks = ref.block_list(problem.penalty)
    largest = max(blocks, key=lambda block: np.linalg.norm(exact.coef[block[0]]))[0]
    active = problem.full_active_set()
    rng = np.random.default_rng(2)
    x = exact.coef[active.features] * (1.0 + 0.05 * rng.standard_normal(60))
    position = np.flatnonzero(np.isin(active.features, largest))
    x[position] = 0.0
    after = active.certificate(x, exact.intercept)
    p0 = problem.null_objective()
    gaps, primals = [], [after.primal]
    while after.gap > 1e-12 * p0 and len(gaps) < 6:
        moved = group_support_newton_step(active, after, x)
        if moved is None:       # no candidate lowers P beyond its rounding
            break
        after = active.certificate(x, moved[0])
        gaps.append(after.gap)
        primals.append(after.primal)
    # squared loss: the model is P, one step; logistic: Newton's quadratic convergence
    # (here 7e-2, 6e-3, 5e-5, 3e-9 relative), until P moves by less than its rounding
    if loss == "squared":
        assert len(gaps) == 1
    assert all(later < before for before, later in zip(primals, primals[1:]))
    assert all(later <= 0.1 * before for before, later in zip(gaps, gaps[1:]))
    assert after.gap <= 1e-8 * p0
    assert after.primal - exact.primal <= 1e-13 * p0
    assert np.all(x[position] != 0)
    still = exact.coef[active.features].copy()
    cert = active.certificate(still, exact.intercept)
    kept = still.copy()
    moved = group_support_newton_step(active, cert, still)
    if moved is None:
        np.testing.assert_array_equal(still, kept)
    else:                       # a rounding-level gain only
        assert active.certificate(still, moved[0]).primal <= cert.primal


def test_threads_backend_takes_the_group_step(ref, make_data):
    from asyncopt import GroupLasso
    X, y, problem = _group_problem(make_data, "squared", True)
    groups = [g.tolist() for g in make_data.random_groups(4, 60, max_size=5)]
    est = GroupLasso(alpha=problem.lam, groups=groups, backend="threads", n_jobs=2,
                     tol=1e-10, max_epochs=3000, random_state=0, method="ddss").fit(X, y)
    assert any(h["newton_step"] > 0 for h in est.history_)
    cert = ref.certificate(X, y, "squared", problem.penalty, problem.lam, True, est.coef_)
    assert cert.gap <= 1e-9 * problem.null_objective()


def test_the_group_step_prunes_groups_outside_the_firm_support(ref, make_data,
                                                               monkeypatch):
    """Tiny non-zero groups that asynchronous steps leave behind (far inside the
    optimality condition) are set to zero before the step, whatever |S|: the Hessian is
    formed on the firm groups only, and the step lands on the solution."""
    X, y, problem = _group_problem(make_data, "squared", True)
    exact = solve_ddss(problem, tol=1e-13, random_state=0, max_epochs=3000)
    active = problem.full_active_set()
    x = exact.coef[active.features].copy()
    indptr = active.block_indptr
    zero_groups = [g for g in range(indptr.shape[0] - 1)
                   if not np.any(x[indptr[g]:indptr[g + 1]])]
    rng = np.random.default_rng(5)
    for g in zero_groups:
        x[indptr[g]:indptr[g + 1]] = 1e-9 * rng.standard_normal(indptr[g + 1] - indptr[g])
    sizes = []
    real_rows = newton_step.SupportRows

    def rows(active, code, z, support, *args):
        sizes.append(support.shape[0])
        return real_rows(active, code, z, support, *args)
    monkeypatch.setattr(newton_step, "SupportRows", rows)
    cert = active.certificate(x, exact.intercept)
    _, ratio = violating_zeros(exact.coef[active.features], cert.correlation,
                               problem.n_samples, problem.lam, active.weights, indptr)
    firm = [g for g in range(indptr.shape[0] - 1)
            if g not in zero_groups or ratio[g] >= 1.0 - DROP_MARGIN]
    moved = group_support_newton_step(active, cert, x)
    assert moved is not None
    assert sizes == [int(sum(indptr[g + 1] - indptr[g] for g in firm))]
    assert len(firm) < indptr.shape[0] - 1 - 2      # some groups were pruned
    assert all(not np.any(x[indptr[g]:indptr[g + 1]]) for g in zero_groups)
    assert active.certificate(x, moved[0]).gap <= 1e-9 * problem.null_objective()


def test_hessian_free_model_ends_where_no_block_can_move():
    """A zero group whose slope exceeds its threshold but whose Hessian block is zero (no
    row has its features) cannot enter by a block step, and no group is non-zero: the
    model returns at once instead of looping, with the point as its target."""
    starts = group_starts(np.array([2, 2]))
    hessian = np.zeros((4, 4))
    hessian[2:, 2:] = np.eye(2)
    gradient = np.array([3.0, 0.0, 0.1, 0.0])
    point = np.zeros(4)
    target, predicted, optimality, products = _hessian_free(
        hessian, gradient, point, starts, np.ones(2), False, budget=50)
    np.testing.assert_array_equal(target, point)
    assert predicted == 0.0 and optimality > 1.0 and products < 50
