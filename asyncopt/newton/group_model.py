"""The model layer of the group step: the minimiser of the proximal Newton model

    m(u) = g^T (u - x) + (u - x)^T H (u - x) / 2 + lam sum_{k in G} w_k ||u_k||

over S's groups G and the intercept (``asyncopt.newton``'s docstring), from the Hessian
on S (``group_model_minimum``: block coordinate descent, then Newton on the non-zero
groups) or from Hessian-vector products and H's diagonal group blocks
(``hessian_free_group_minimum``: block moves, then Newton-CG), and the targets a step
takes from the sums over all rows (``group_move``, ``hessian_free_group_move``). H and g
are given (``kernels``); nothing here reads the rows."""
import math

import numpy as np
from numba import njit
from scipy.linalg import LinAlgError, cho_factor, cho_solve

from ..penalties import block_positions, contiguous_block_norms
from .kernels import split_group_blocks
from .model import RIDGE, STEP_GRID, _conjugate_gradient

HESSIAN_FREE_PRODUCTS = 400       # products a Hessian-free group model takes at most
MODEL_ROUNDS = 6          # (descent, Newton) rounds at most
DESCENT_PASSES = 20       # block coordinate descent passes per round
NEWTON_ITERATIONS = 20    # Newton iterations per round
MODEL_TOLERANCE = 1e-10   # optimality of the model, relative to max lam w_k
ARMIJO = 1e-4
CROSSING = 1e-3         # a group within this share of its norm from zero crosses it


def group_starts(sizes):
    """[0, cumulative sizes]: group k of S holds coordinates starts[k]:starts[k+1]."""
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def group_support_point(x, b, intercept, block_indptr, entering=None):
    """(S, the point [x_S, b], the group starts over S, the groups): S the coordinates of
    the non-zero groups of x and of ``entering`` (``policy.entering_groups``), group by
    group;
    b only when the intercept is fitted."""
    norms = contiguous_block_norms(x, block_indptr)
    groups = np.flatnonzero(norms)
    if entering is not None and entering.shape[0]:
        groups = np.union1d(groups, entering.astype(np.int64))
    support = block_positions(block_indptr, groups)
    point = np.append(x[support], b) if intercept else x[support].copy()
    return support, point, group_starts(np.diff(block_indptr)[groups]), groups


@njit(cache=True)
def group_model_descent(hessian, slope, u, starts, lam_weights, passes, tolerance):
    """Block coordinate descent on sum_k lam_weights[k] ||u_k|| + the quadratic whose
    gradient at u is ``slope`` and whose Hessian is ``hessian``: for each group k in turn,
    u_k <- prox_{lam w_k / L_k ||.||}(u_k - slope_k / L_k), L_k the largest eigenvalue of
    H_kk, and slope += H[:, k] (new u_k - old u_k). In place on u and slope; stops after
    ``passes`` or a pass that moved no coordinate by more than ``tolerance``. Returns the
    passes made. H is symmetric: its column j is read as row j, contiguous (reading down
    the column is much slower on large supports)."""
    dim = u.shape[0]
    n_groups = starts.shape[0] - 1
    lipschitz = np.empty(n_groups)
    for k in range(n_groups):
        block = hessian[starts[k]:starts[k + 1], starts[k]:starts[k + 1]]
        lipschitz[k] = np.linalg.eigvalsh(block)[-1]
    moved = np.empty(dim)
    done = 0
    for done in range(1, passes + 1):
        largest = 0.0
        for k in range(n_groups):
            if not lipschitz[k] > 0.0:
                continue
            s, e = starts[k], starts[k + 1]
            sq = 0.0
            for j in range(s, e):
                moved[j] = u[j] - slope[j] / lipschitz[k]
                sq += moved[j] * moved[j]
            norm = math.sqrt(sq)
            threshold = lam_weights[k] / lipschitz[k]
            scale = 0.0 if norm <= threshold else 1.0 - threshold / norm
            for j in range(s, e):
                change = moved[j] * scale - u[j]
                u[j] += change
                if change != 0.0:
                    largest = max(largest, abs(change))
                    for i in range(dim):
                        slope[i] += hessian[j, i] * change
        if largest <= tolerance:
            break
    return done


def model_value(hessian, gradient, point, u, starts, lam_weights):
    """The model m(u) = g^T (u - point) + (u - point)^T H (u - point) / 2 +
    lam sum_k w_k ||u_k|| (the module docstring's, x = point)."""
    move = u - point
    return float(gradient @ move + 0.5 * move @ (hessian @ move) +
                 lam_weights @ contiguous_block_norms(u, starts))


def model_optimality(slope, u, starts, lam_weights):
    """How far u is from the model's minimum, relative to max lam w_k: the largest of
    ||slope_k + lam w_k u_k / ||u_k|||| over the non-zero groups and (||slope_k|| -
    lam w_k)_+ over the zero ones (``slope`` = the quadratic's gradient at u)."""
    norms = contiguous_block_norms(u, starts)
    sizes = np.diff(starts)
    nonzero = norms > 0.0
    pull = np.repeat(np.where(nonzero, lam_weights / np.where(nonzero, norms, 1.0), 0.0),
                     sizes)
    residual = contiguous_block_norms(slope + pull * u, starts)
    violation = np.where(nonzero, residual, np.maximum(residual - lam_weights, 0.0))
    scale = float(lam_weights.max(initial=0.0))
    return float(violation.max(initial=0.0)) / scale if scale > 0.0 else 0.0


@njit(cache=True)
def zero_optimal_groups(hessian, slope, u, starts, lam_weights):
    """Set to zero, in place (u and the quadratic's gradient ``slope`` at u), every
    non-zero group whose block of the model, the others held, is minimised at zero:
    ||slope_k - H_kk u_k|| <= lam w_k. Each such move lowers m or keeps it. Newton's
    method alone only shrinks such a group (the penalty's curvature grows as 1 / ||u_k||)
    and never reaches zero."""
    dim = u.shape[0]
    for k in range(starts.shape[0] - 1):
        s, e = starts[k], starts[k + 1]
        held = 0.0
        sq = 0.0
        for j in range(s, e):
            held += u[j] * u[j]
            v = slope[j]
            for c in range(s, e):
                v -= hessian[j, c] * u[c]
            sq += v * v
        if held == 0.0 or math.sqrt(sq) > lam_weights[k]:
            continue
        for j in range(s, e):
            change = -u[j]
            if change != 0.0:
                for i in range(dim):
                    slope[i] += hessian[j, i] * change
            u[j] = 0.0


def _through_zero(hessian, gradient, point, u, free, step, starts, lam_weights, current):
    """The Newton step stopped where a group first passes (almost) through zero, that
    group set to zero, when this lowers m; else None. Along u + t s a group k is nearest
    zero at t_k = -u_k^T s_k / ||s_k||^2; it passes through zero when t_k is in (0, 1]
    and ||u_k + t_k s_k|| <= CROSSING ||u_k|| (the group analogue of the orthant path's
    crossing, ``model.orthant_newton_target``): on nearly equal columns the model is
    almost flat along moving weight from one group to its twin, the step is long, and
    backtracking from t = 1 would cut it to a tiny t again and again."""
    full = np.zeros(u.shape[0])
    full[free] = step
    crossing = _group_crossing(u, full, contiguous_block_norms(u, starts), starts)
    if crossing is None:
        return None
    k, t = crossing
    trial = u + t * full
    trial[starts[k]:starts[k + 1]] = 0.0
    if model_value(hessian, gradient, point, trial, starts, lam_weights) < current:
        return trial
    return None


def _smooth_newton(hessian, gradient, point, u, starts, lam_weights, iterations):
    """Newton's method on the groups where u is non-zero (the zero ones held at zero),
    where m is smooth; a backtracking (Armijo) line search on m. Returns (u, whether the
    last line search failed)."""
    sizes = np.diff(starts)
    for _ in range(iterations):
        slope = gradient + hessian @ (u - point)
        zero_optimal_groups(hessian, slope, u, starts, lam_weights)
        norms = contiguous_block_norms(u, starts)
        nonzero = norms > 0.0
        if not np.any(nonzero):
            return u, False
        free = np.flatnonzero(np.repeat(nonzero, sizes))
        safe = np.where(nonzero, norms, 1.0)
        unit = u / np.repeat(safe, sizes)
        full = slope + np.repeat(lam_weights, sizes) * unit
        if float(contiguous_block_norms(full, starts)[nonzero].max()) <= \
                MODEL_TOLERANCE * float(lam_weights.max()):
            return u, False
        grad = full[free]
        system = hessian[np.ix_(free, free)]
        at = 0
        for k in np.flatnonzero(nonzero):
            m = sizes[k]
            e = unit[starts[k]:starts[k + 1]]
            system[at:at + m, at:at + m] += lam_weights[k] / norms[k] * (
                np.eye(m) - np.outer(e, e))
            at += m
        ridge = RIDGE * max(float(np.trace(system)) / free.shape[0], 1e-300)
        try:
            factor = cho_factor(system + ridge * np.eye(free.shape[0]), lower=True,
                                check_finite=False)
        except LinAlgError:
            return u, True
        step = -cho_solve(factor, grad, check_finite=False)
        decrement = -float(grad @ step)
        if not decrement > 0.0:
            return u, False
        current = model_value(hessian, gradient, point, u, starts, lam_weights)
        candidate = _through_zero(hessian, gradient, point, u, free, step, starts,
                                  lam_weights, current)
        t = 1.0
        while candidate is None and t >= 2.0 ** -30:
            trial = u.copy()
            trial[free] += t * step
            if model_value(hessian, gradient, point, trial, starts, lam_weights) <= \
                    current - ARMIJO * t * decrement:
                candidate = trial
                break
            t *= 0.5
        if candidate is None:
            return u, True
        u = candidate
        if decrement <= 1e-14 * max(abs(current), 1e-300):
            return u, False
    return u, False


def group_model_minimum(hessian, gradient, point, starts, lam_weights, intercept):
    """The minimiser of the proximal Newton model m (module docstring) over S's groups
    and, when ``intercept``, the intercept (the last entry of ``point``, ``gradient`` and
    ``hessian``'s rows): (target, m(target) - m(point), model optimality at the end).
    ``hessian``, ``gradient``: the loss's, scaled by 1/n; ``lam_weights``: lam w_k per
    group of S."""
    hessian = np.asarray(hessian, np.float64)
    gradient = np.asarray(gradient, np.float64)
    point = np.asarray(point, np.float64)
    k = int(starts[-1])
    if intercept:         # eliminate the intercept: its minimiser for each u_S
        column, corner = hessian[:k, k], float(hessian[k, k])
        if corner > 0.0:
            reduced = hessian[:k, :k] - np.outer(column, column) / corner
            reduced_gradient = gradient[:k] - column * gradient[k] / corner
        else:
            reduced, reduced_gradient = hessian[:k, :k], gradient[:k]
    else:
        reduced, reduced_gradient = hessian, gradient
    start = point[:k]
    u = start.copy()
    tolerance = 1e-12 * max(1.0, float(np.abs(start).max(initial=0.0)))
    optimality = np.inf
    for _ in range(MODEL_ROUNDS):
        slope = reduced_gradient + reduced @ (u - start)
        group_model_descent(reduced, slope, u, starts, lam_weights, DESCENT_PASSES,
                            tolerance)
        u, stuck = _smooth_newton(reduced, reduced_gradient, start, u, starts,
                                  lam_weights, NEWTON_ITERATIONS)
        optimality = model_optimality(reduced_gradient + reduced @ (u - start), u,
                                      starts, lam_weights)
        if optimality <= MODEL_TOLERANCE and not stuck:
            break
    target = u
    if intercept:
        move_b = -(gradient[k] + column @ (u - start)) / corner if corner > 0.0 else 0.0
        target = np.append(u, point[k] + move_b)
    base = float(lam_weights @ contiguous_block_norms(point[:k], starts))
    predicted = model_value(hessian, gradient, point, target, starts, lam_weights) - base
    if not predicted < 0.0:
        return point.copy(), 0.0, optimality
    return target, predicted, optimality


def stack_blocks(blocks, starts):
    """The diagonal blocks of S's groups (``blocks``, group by group; group k holds
    coordinates starts[k]:starts[k+1]) stacked by size: [(groups, their coordinates as a
    (count, m) index, their blocks as a (count, m, m) array)] per size m, so that a
    block-diagonal product is one batched einsum per size (``stacked_times``) rather
    than a Python loop over the groups."""
    sizes = np.diff(starts)
    stacks = []
    for m in np.unique(sizes):
        groups = np.flatnonzero(sizes == m)
        index = starts[groups][:, None] + np.arange(m)
        stacks.append((groups, index, np.stack([np.asarray(blocks[g], np.float64)
                                                for g in groups])))
    return stacks


def stacked_times(stacks, v):
    """The block-diagonal matrix of ``stacks`` (``stack_blocks``) times v (zero outside
    its groups)."""
    out = np.zeros_like(v)
    for _, index, stack in stacks:
        out[index] = np.einsum("gij,gj->gi", stack, v[index])
    return out


def _block_prox_moves(slope, u, norms, stacks, lipschitz, lam_weights):
    """Per group, the move of one block step (the others held): a zero group whose
    slope exceeds its threshold, ||s_k|| > lam w_k, enters by a prox-gradient step of
    1/L_k; a non-zero group whose block of the model is minimised at zero, ||s_k -
    R_kk u_k|| <= lam w_k, goes to zero. ``stacks``: R's diagonal blocks
    (``stack_blocks``), ``lipschitz``: their largest eigenvalues. Returns (moves over S,
    each group's predicted change of m from its own move alone, 0 where none)."""
    move = np.zeros_like(u)
    change = np.zeros(norms.shape[0])
    for groups, index, stack in stacks:
        s_k, u_k = slope[index], u[index]
        slope_norms = np.linalg.norm(s_k, axis=1)
        weights, zero = lam_weights[groups], norms[groups] == 0.0
        enter = zero & (slope_norms > weights) & (lipschitz[groups] > 0.0)
        leave = ~zero & (np.linalg.norm(s_k - np.einsum("gij,gj->gi", stack, u_k),
                                        axis=1) <= weights)
        d = np.zeros_like(u_k)
        safe = np.where(enter, slope_norms * lipschitz[groups], 1.0)
        d[enter] = -((slope_norms - weights) / safe)[enter, None] * s_k[enter]
        d[leave] = -u_k[leave]
        moved = enter | leave
        change[groups[moved]] = (np.einsum("gi,gi->g", s_k, d) + 0.5 * np.einsum(
            "gi,gij,gj->g", d, stack, d) + weights * (
            np.linalg.norm(u_k + d, axis=1) - norms[groups]))[moved]
        move[index] = d
    return move, change


def _newton_blocks(stacks, u, norms, lam_weights):
    """For the non-zero groups: the penalty's Hessian lam w_k (I - e_k e_k^T) / ||u_k||
    (e_k = u_k / ||u_k||) on each, and the inverse of R_kk plus it (the CG's block
    preconditioner), as stacks (``stack_blocks``' form)."""
    curvature, inverse = [], []
    for groups, index, stack in stacks:
        chosen = norms[groups] > 0.0
        if not np.any(chosen):
            continue
        groups, index = groups[chosen], index[chosen]
        unit = u[index] / norms[groups][:, None]
        m = index.shape[1]
        block = (lam_weights[groups] / norms[groups])[:, None, None] * (
            np.eye(m) - unit[:, :, None] * unit[:, None, :])
        curvature.append((groups, index, block))
        inverse.append((groups, index, np.linalg.pinv(stack[chosen] + block)))
    return curvature, inverse


def hessian_free_group_minimum(hessian_times, blocks, column, corner, gradient, point,
                               starts, lam_weights, intercept, budget):
    """The minimiser of the proximal Newton model m (module docstring) from products with
    H (``hessian_times(v)`` = H v over S and the intercept) and the numbers of H that
    ``kernels.group_hessian_blocks`` gives (``blocks``: the diagonal group blocks,
    ``column``, ``corner``: the intercept's column and entry), all scaled by 1/n: the
    Hessian-free counterpart of ``group_model_minimum``, for supports whose Hessian is
    too large. Returns (target, m(target) - m(point), model optimality, products).

    The intercept is eliminated as there (R = H_SS - c c^T / h_bb: a product with R is
    one with H and a dot product). The slope s = r + R (u - x) is kept up to date from
    the products each move makes. Rounds, at most ``budget`` products in all:
      - block moves (``_block_prox_moves``): zero groups whose slope exceeds their
        threshold enter, non-zero groups whose block minimum is zero leave, all at once
        (one product gives m along the joint move exactly: the best of t M for t in
        STEP_GRID) when that lowers m, else the single move that lowers it most;
      - a Newton step on the non-zero groups, where m is smooth: (R_FF + the penalty's
        Hessian) d = -(s + lam w u / ||u||)_F by CG with the exact inverses of the
        groups' diagonal blocks as preconditioner, to a residual of min(1e-2, the
        gradient's norm relative to the first round's) (inexact Newton), then one product
        R d gives m along u + t d exactly: the step stops where a group first passes
        within CROSSING of zero, which is then set to zero (``_through_zero``'s rule), or
        backtracks (Armijo) from t = 1;
    until the model's optimality (``model_optimality``) is below MODEL_TOLERANCE or a
    step's decrease is below 1e-14 of m's: the minimum of ``group_model_minimum`` to
    rounding."""
    gradient = np.asarray(gradient, np.float64)
    point = np.asarray(point, np.float64)
    k = int(starts[-1])
    sizes = np.diff(starts)
    products = [0]
    eliminate = intercept and corner > 0.0

    def reduced_times(v):
        products[0] += 1
        out = hessian_times(np.append(v, 0.0) if intercept else v)[:k]
        return out - column * (column @ v) / corner if eliminate else out

    stacks = stack_blocks(blocks, starts)
    if eliminate:
        slope = gradient[:k] - column * gradient[k] / corner
        stacks = [(groups, index, stack - column[index][:, :, None] *
                   column[index][:, None, :] / corner) for groups, index, stack in stacks]
    else:
        slope = gradient[:k].copy()
    lipschitz = np.zeros(sizes.shape[0])
    for groups, _, stack in stacks:
        lipschitz[groups] = np.linalg.eigvalsh(stack)[:, -1]
    start = point[:k]
    u = start.copy()
    lam_sizes = np.repeat(lam_weights, sizes)

    def penalty(v):
        return float(lam_weights @ contiguous_block_norms(v, starts))

    def change_of(move, product):
        return float(slope @ move + 0.5 * move @ product) + penalty(u + move) - penalty(u)

    first_norm, optimality, total = None, np.inf, 0.0
    while products[0] < budget:
        optimality = model_optimality(slope, u, starts, lam_weights)
        if optimality <= MODEL_TOLERANCE:
            break
        norms = contiguous_block_norms(u, starts)
        move, changes = _block_prox_moves(slope, u, norms, stacks, lipschitz, lam_weights)
        block_moved = False
        if np.any(move):
            product = reduced_times(move)
            joint, scale = min((change_of(a * move, a * product), a) for a in STEP_GRID)
            if not joint < 0.0 and np.any(changes < 0.0):
                best = int(np.argmin(changes))
                single = np.zeros(k)
                single[starts[best]:starts[best + 1]] = move[starts[best]:starts[best + 1]]
                move, product, scale = single, reduced_times(single), 1.0
                joint = change_of(move, product)
            if joint < 0.0:
                u, slope, total = u + scale * move, slope + scale * product, total + joint
                norms = contiguous_block_norms(u, starts)
                block_moved = True
        nonzero = norms > 0.0
        if not np.any(nonzero) or products[0] >= budget:
            if block_moved:
                continue
            break
        free = np.flatnonzero(np.repeat(nonzero, sizes))
        unit = u / np.repeat(np.where(nonzero, norms, 1.0), sizes)
        grad = (slope + lam_sizes * unit)[free]
        grad_norm = float(np.linalg.norm(grad))
        first_norm = grad_norm if first_norm is None else first_norm
        curvature, inverse = _newton_blocks(stacks, u, norms, lam_weights)
        embed = np.zeros(k)

        def apply(v):
            embed[free] = v
            return (reduced_times(embed) + stacked_times(curvature, embed))[free]

        def precondition(r):
            embed[free] = r
            return stacked_times(inverse, embed)[free]

        direction, _ = _conjugate_gradient(apply, -grad, precondition,
                                           np.zeros(free.shape[0]),
                                           budget - products[0] - 1,
                                           min(1e-2, grad_norm / max(first_norm, 1e-300)))
        step = np.zeros(k)
        step[free] = direction
        decrement = float(grad @ direction)
        if not decrement < 0.0 or products[0] >= budget:
            break
        product = reduced_times(step)
        crossing = _group_crossing(u, step, norms, starts)
        moved = False
        if crossing is not None:
            group, t = crossing
            trial = t * step
            trial[starts[group]:starts[group + 1]] = -u[starts[group]:starts[group + 1]]
            trial_product = reduced_times(trial)
            change = change_of(trial, trial_product)
            if change < 0.0:
                u, slope, total = u + trial, slope + trial_product, total + change
                moved = True
        t = 1.0
        while not moved and t >= 2.0 ** -30:
            change = change_of(t * step, t * product)
            if change <= ARMIJO * t * decrement:
                u, slope, total = u + t * step, slope + t * product, total + change
                moved = True
            t *= 0.5
        if not moved or -decrement <= 1e-14 * max(abs(total), 1e-300):
            break
    optimality = model_optimality(slope, u, starts, lam_weights)
    target = u
    if intercept:
        move_b = -(gradient[k] + column @ (u - start)) / corner if eliminate else 0.0
        target = np.append(u, point[k] + move_b)
    predicted = float(gradient @ (target - point)) + 0.5 * float(
        (target - point) @ hessian_times(target - point)) + penalty(target[:k]) - \
        penalty(start)
    products[0] += 1
    if not predicted < 0.0:
        return point.copy(), 0.0, optimality, products[0]
    return target, predicted, optimality, products[0]


def _group_crossing(u, step, norms, starts):
    """(group, t) of the first group to pass within CROSSING of zero along u + t step,
    t in (0, 1] (``_through_zero``'s rule), or None."""
    along = contiguous_block_norms(step, starts)
    dots = np.add.reduceat(u * step, starts[:-1]) if starts.shape[0] > 1 else np.zeros(0)
    moving = (along > 0.0) & (dots < 0.0)
    if not np.any(moving):
        return None
    t_near = np.where(moving, -dots / np.where(moving, along * along, 1.0), np.inf)
    nearest = contiguous_block_norms(
        u + np.repeat(np.minimum(t_near, 1.0), np.diff(starts)) * step, starts)
    crossing = moving & (t_near <= 1.0) & (nearest <= CROSSING * norms)
    if not np.any(crossing):
        return None
    group = int(np.flatnonzero(crossing)[np.argmin(t_near[crossing])])
    return group, float(t_near[group])


def group_move(hessian_sum, slope_sum, point, starts, lam_weights, n, intercept):
    """The target of the step from the summed Hessian and slope over all rows
    (``kernels.SupportRows.hessian_sums``, ``kernels.shard_slope``):
    ``group_model_minimum`` on them scaled by 1/n; None when the model predicts no
    decrease."""
    target, predicted, _ = group_model_minimum(hessian_sum / n, slope_sum / n, point,
                                               starts, lam_weights, intercept)
    return target if predicted < 0.0 else None


def hessian_free_group_move(block_sums, hessian_sum_times, slope_sum, point, starts,
                            lam_weights, n, intercept):
    """(the target of the step, the products it took) from the summed numbers of
    ``kernels.group_hessian_blocks`` and products with the summed Hessian
    (``hessian_sum_times``) over all rows: ``hessian_free_group_minimum`` on them scaled
    by 1/n, at most HESSIAN_FREE_PRODUCTS products; the target None when the model
    predicts no decrease."""
    blocks, column, corner = split_group_blocks(np.asarray(block_sums) / n, starts,
                                                intercept)
    target, predicted, _, products = hessian_free_group_minimum(
        lambda v: hessian_sum_times(v) / n, blocks, column, corner,
        np.asarray(slope_sum) / n, point, starts, lam_weights, intercept,
        HESSIAN_FREE_PRODUCTS)
    return (target if predicted < 0.0 else None), products
