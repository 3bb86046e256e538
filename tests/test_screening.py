"""Screening: safety of the gap-safe rule (the non-negotiable property), screening ability,
the static safe sphere, the strong rule, and why the radius carries the factor n.

Safety protocol (docs/design.md §1): for many random problems we compute a reference solution whose
duality gap on the *full* problem, recomputed independently with NumPy (``ref`` fixture),
is <= 1e-12 P(0). Every block that a screening test removes must be zero in that reference.
A reference at gap 1e-12 can carry round-off sized non-zeros, so a block counts as
"non-zero in the reference" when its norm exceeds 1e-6 times the largest block norm.
"""
import math

import numpy as np
import pytest

from asyncopt import Problem
from asyncopt.penalties import L1, GroupL1
from asyncopt.screening import (BestDual, gap_safe_keep, gap_safe_radius,
                                screen_active_set, static_safe_sphere_keep, strong_rule_keep)
from asyncopt.solvers import solve_ddss

REF_TOL = 1e-12
NONZERO = 1e-6          # relative threshold for "clearly non-zero in the reference"
SHAPES = [(60, 20), (40, 90), (80, 35), (30, 120), (50, 50)]
FORMATS = ["dense", "csr", "csc"]
N_PER_CHUNK = 30        # 4 chunks (loss x penalty) -> 120 problems


def _block_norms(penalty, x):
    ip, ids = penalty.indptr, penalty.ids
    return np.array([np.linalg.norm(x[ids[ip[g]:ip[g + 1]]]) for g in range(len(ip) - 1)])


def _random_problem(make_data, seed, loss, kind):
    """One random problem of the screening campaign and a description of it."""
    rng = np.random.default_rng(seed)
    n, p = SHAPES[seed % len(SHAPES)]
    fmt = FORMATS[(seed // len(SHAPES)) % len(FORMATS)]
    fit_intercept = bool(seed % 2)
    X, y = make_data.random_data(seed, n, p, loss, fmt=fmt, density=0.35,
                                 n_informative=int(rng.integers(2, 8)))
    if fmt != "dense" and seed % 3 == 0:
        # an all-zero column: must always be removed, never touched
        X = X.tolil()
        X[:, int(rng.integers(p))] = 0.0
        X = X.tocsr() if fmt == "csr" else X.tocsc()
    random_weights = rng.random() < 0.5
    if kind == "l1":
        penalty = L1(p, rng.uniform(0.5, 2.0, p) if random_weights else None)
    else:
        groups = make_data.random_groups(seed, p, max_size=int(rng.integers(2, 7)))
        penalty = GroupL1(p, groups, rng.uniform(0.5, 3.0, len(groups))
                          if random_weights else None)
    base = Problem(X, y, loss, penalty, 1.0, fit_intercept)
    ratio = float(rng.uniform(0.05, 0.9))
    problem = base.with_lam(ratio * base.lam_max())
    desc = (f"seed={seed} loss={loss} penalty={kind} shape={n}x{p} fmt={fmt} "
            f"intercept={fit_intercept} weights={'random' if random_weights else 'default'} "
            f"lam/lam_max={ratio:.3f}")
    return problem, (X, y), desc


def _reference(problem, data, ref, desc):
    """Reference solution, certified by an independent gap computation."""
    X, y = data
    p0 = problem.zero_certificate().primal
    res = solve_ddss(problem, screening=False, tol=REF_TOL, max_epochs=30000,
                     random_state=0)
    assert res.converged, f"reference did not converge: {desc}"
    cert = ref.certificate(X, y, problem.loss.name, problem.penalty, problem.lam,
                           problem.fit_intercept, res.coef)
    if cert.gap > REF_TOL * p0:
        # The solver's own gap can be optimistic by ~1e-9 (logistic intercept refit, see
        # test_core.py::test_logistic_intercept_refit_is_accurate) and it then stops early
        # (a clipped gap of 0 meets any tol): polish with an independent FISTA.
        x, _, _ = ref.polish(X, y, problem.loss.name, problem.penalty, problem.lam,
                             problem.fit_intercept, res.coef, target=REF_TOL)
        cert = ref.certificate(X, y, problem.loss.name, problem.penalty, problem.lam,
                               problem.fit_intercept, x)
        assert cert.gap <= 2 * REF_TOL * p0, \
            f"independent reference gap {cert.gap / p0:.2e} * P(0): {desc}"
        return x, cert.intercept
    assert cert.gap <= 2 * REF_TOL * p0, \
        f"independent reference gap {cert.gap / p0:.2e} * P(0): {desc}"
    return res.coef, res.intercept


def _check_removed(removed_blocks, ref_block_norms, desc, where):
    big = ref_block_norms > NONZERO * max(ref_block_norms.max(), 1e-300)
    wrong = np.flatnonzero(removed_blocks & big)
    assert wrong.size == 0, (
        f"UNSAFE screening at {where}: blocks {wrong.tolist()} removed but non-zero in the "
        f"reference (norms {ref_block_norms[wrong].tolist()}): {desc}")


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("kind", ["l1", "group"])
def test_gap_safe_screening_is_safe(loss, kind, ref, make_data):
    """30 random problems per (loss, penalty): the gap-safe test at x = 0, after a few
    epochs, at noisy versions of the reference, the static safe sphere, and the screening
    inside full DDSS runs never remove a block that is non-zero at the optimum."""
    chunk = {("squared", "l1"): 0, ("squared", "group"): 1,
             ("logistic", "l1"): 2, ("logistic", "group"): 3}[(loss, kind)]
    removed_total = {"zero": 0, "epochs": 0, "noisy": 0, "noisy_best": 0, "ddss": 0}
    zero_blocks_total = 0
    for k in range(N_PER_CHUNK):
        seed = 1000 * chunk + k
        problem, data, desc = _random_problem(make_data, seed, loss, kind)
        x_ref, _ = _reference(problem, data, ref, desc)
        ref_norms = _block_norms(problem.penalty, x_ref)
        zero_blocks_total += int(np.sum(ref_norms == 0))
        active = problem.full_active_set()
        rng = np.random.default_rng(seed + 7)

        # x = 0 (intercept refitted): the static safe sphere, and the dynamic rule there
        keep = static_safe_sphere_keep(problem)
        _check_removed(~keep, ref_norms, desc, "x=0 (static sphere)")
        keep0 = screen_active_set(active, problem.certificate(np.zeros(problem.n_features)))
        np.testing.assert_array_equal(keep, keep0)
        removed_total["zero"] += int(np.sum(~keep))

        # a few DDSS epochs without screening
        for epochs in (1, 3):
            early = solve_ddss(problem, screening=False, tol=1e-30, max_epochs=epochs,
                               random_state=seed)
            keep = screen_active_set(active, problem.certificate(early.coef, early.intercept))
            _check_removed(~keep, ref_norms, desc, f"{epochs} epochs")
            removed_total["epochs"] += int(np.sum(~keep))
            # the static sphere at the same point agrees with the dynamic rule
            np.testing.assert_array_equal(
                static_safe_sphere_keep(problem, early.coef, early.intercept), keep)

        # noisy references: dense noise, and relative noise on the support only; each
        # also with the best dual point of the closer ones before it (the sphere around
        # that point, radius from P(x) - D(best))
        best = BestDual()
        scale = np.abs(x_ref).max()
        for sigma in (1e-7, 1e-4, 1e-2):
            for x in (x_ref + sigma * scale * rng.standard_normal(x_ref.shape),
                      x_ref * (1 + sigma * rng.standard_normal(x_ref.shape))):
                b = rng.normal() if problem.fit_intercept else 0.0   # refitted anyway
                cert = problem.certificate(x, b)
                keep = screen_active_set(active, cert)
                _check_removed(~keep, ref_norms, desc, f"noisy reference sigma={sigma}")
                removed_total["noisy"] += int(np.sum(~keep))
                keep_best = screen_active_set(active, cert, best)
                assert np.all(keep_best <= keep), desc
                _check_removed(~keep_best, ref_norms, desc,
                               f"noisy reference sigma={sigma}, best dual point")
                removed_total["noisy_best"] += int(np.sum(~keep_best))
                best.offer(cert.dual, cert.block_correlation, cert.dual_scale)

        # the screening inside a full DDSS run
        res = solve_ddss(problem, screening=True, tol=1e-9, max_epochs=20000,
                         random_state=seed)
        assert res.converged, desc
        kept_features = np.zeros(problem.n_features, bool)
        kept_features[res.active_features] = True
        fb = problem.penalty.feature_blocks()
        block_kept = np.zeros(problem.penalty.n_blocks, bool)
        block_kept[fb[kept_features]] = True
        # whole blocks are kept or removed
        np.testing.assert_array_equal(kept_features, block_kept[fb])
        _check_removed(~block_kept, ref_norms, desc, "inside DDSS")
        removed_total["ddss"] += int(np.sum(~block_kept))
        # removed coordinates are exactly zero in the returned solution
        assert np.all(res.coef[~kept_features] == 0.0), desc

    # not vacuous: the tests did remove many blocks that are zero at the optimum
    assert removed_total["ddss"] >= 0.8 * zero_blocks_total, (removed_total,
                                                              zero_blocks_total)
    assert removed_total["noisy"] >= 0.5 * 6 * zero_blocks_total, (removed_total,
                                                                   zero_blocks_total)
    assert removed_total["epochs"] > 0 and removed_total["zero"] > 0, removed_total
    # the sphere around a closer point removes blocks the noisy point's own cannot
    assert removed_total["noisy_best"] > removed_total["noisy"], removed_total


def test_best_dual_keeps_the_largest_d_and_follows_compaction():
    best = BestDual()
    norms, weights = np.ones(3), np.ones(3)
    assert best.keep(1.0, 10, 1.0, norms, 0.1, weights).all()     # no point yet
    best.offer(-0.5, np.array([0.2, 3.0, 0.4]), 2.0)
    best.offer(-0.7, np.array([9.0, 9.0, 9.0]), 1.0)               # lower D: ignored
    assert best.dual == -0.5 and best.dual_scale == 2.0
    assert best.gap(-0.25) == 0.25 and best.gap(-0.6) == 0.0
    # the sphere around the kept point: ||A_g^T rho|| / s + sqrt(2 n L G) ||A_g|| >= n lam
    radius = math.sqrt(2 * 10 * 1.0 * 0.25)
    expected = np.array([0.2, 3.0, 0.4]) / 2.0 + radius >= 10 * 0.1
    np.testing.assert_array_equal(best.keep(-0.25, 10, 1.0, norms, 0.1, weights), expected)
    best.restrict(np.array([False, True, True]))
    np.testing.assert_array_equal(best.block_correlation, [3.0, 0.4])
    best.offer(-0.1, np.array([1.0, 1.0]), 1.0)
    assert best.dual == -0.1 and best.block_correlation.tolist() == [1.0, 1.0]
    best.offer(0.2)                     # D alone (solve_mpi): a bound, no sphere
    assert best.dual == 0.2 and best.gap(0.5) == pytest.approx(0.3)
    assert best.keep(0.5, 10, 1.0, norms[:2], 0.1, weights[:2]).all()


def test_radius_without_factor_n_is_unsafe(make_data):
    """Thesis eq. 3-3 prints r = sqrt(2 L_f G). Under the scaling of docs/design.md §1 that radius removes
    features that are non-zero at the optimum (here at x = 0), while the rule that is used,
    r = sqrt(2 n L_f G), does not. Documents why the factor n is there."""
    unsafe_cases = 0
    for seed in range(3):
        for loss in ("squared", "logistic"):
            X, y = make_data.random_data(seed, 200, 50, loss, n_informative=10)
            base = Problem(X, y, loss, None, 1.0, True)
            problem = base.with_lam(0.3 * base.lam_max())
            sol = solve_ddss(problem, screening=False, tol=1e-12, max_epochs=5000,
                             random_state=0)
            assert sol.converged
            support = np.abs(sol.coef) > 1e-6 * np.abs(sol.coef).max()
            active = problem.full_active_set()
            cert = problem.zero_certificate()
            n, lf = problem.n_samples, problem.loss.lipschitz
            assert gap_safe_radius(n, lf, cert.gap) == pytest.approx(
                math.sqrt(2 * n * lf * cert.gap), rel=1e-15)
            args = (cert.block_correlation, cert.dual_scale)
            rest = (active.block_column_norms(), n, problem.lam, active.weights)
            misprint = gap_safe_keep(*args, math.sqrt(2 * lf * cert.gap), *rest)
            correct = gap_safe_keep(*args, gap_safe_radius(n, lf, cert.gap), *rest)
            assert not np.any(support & ~correct)
            unsafe_cases += bool(np.any(support & ~misprint))
    assert unsafe_cases == 6


def test_gap_safe_keep_formula():
    """||A_g^T rho|| / scale + r ||A_g|| >= n lam w_g, hand-computed (ties are kept)."""
    corr = np.array([4.0, 1.0, 3.0, 2.0])
    norms = np.array([1.0, 2.0, 1.0, 0.5])
    weights = np.array([1.0, 1.0, 2.0, 1.0])
    # n lam w = [1.5, 1.5, 3.0, 1.5]; corr / 2 + 0.25 * norms = [2.25, 0.5+0.5, 1.75, 1.125]
    keep = gap_safe_keep(corr, 2.0, 0.25, norms, 3, 0.5, weights)
    np.testing.assert_array_equal(keep, [True, False, False, False])
    # boundary: exactly n lam w is kept
    assert gap_safe_keep(np.array([3.0]), 1.0, 0.0, np.array([1.0]), 3, 1.0, np.ones(1))[0]
    assert gap_safe_radius(10, 0.25, 0.2) == pytest.approx(1.0)
    assert gap_safe_radius(10, 1.0, -1e-18) == 0.0


def test_group_operator_norm_bounds_spectral_norm(make_data):
    """||A_g|| used by the group test must be >= the spectral norm (safety)."""
    X, y = make_data.random_data(3, 40, 30, "squared")
    groups = make_data.random_groups(3, 30, max_size=6)
    problem = Problem(X, y, "squared", GroupL1(30, groups), 0.1, True)
    active = problem.full_active_set()
    got = active.block_column_norms()
    for g, ids in enumerate(groups):
        spectral = np.linalg.norm(X[:, ids], 2)
        assert got[g] >= spectral * (1 - 1e-12)
        assert got[g] == pytest.approx(np.linalg.norm(X[:, ids]), rel=1e-12)


def test_strong_rule_formula():
    """Strong rule: keep g iff ||A_g^T rho|| / n >= w_g (2 lam - lam_prev)."""
    corr = np.array([3.0, 0.8, 1.6, 2.0])
    weights = np.array([1.0, 1.0, 2.0, 2.0])
    # /n=2 -> [1.5, 0.4, 0.8, 1.0]; w (2*0.7 - 0.9) = [0.5, 0.5, 1.0, 1.0]
    keep = strong_rule_keep(corr, 2, 0.7, 0.9, weights)
    np.testing.assert_array_equal(keep, [True, False, False, True])


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_strong_rule_typical_superset(loss, make_data):
    """On typical random problems the sequential strong rule from lam_max keeps the support."""
    for seed in range(5):
        X, y = make_data.random_data(seed, 100, 60, loss)
        base = Problem(X, y, loss, None, 1.0, True)
        lmax = base.lam_max()
        problem = base.with_lam(0.8 * lmax)
        sol = solve_ddss(problem, screening=False, tol=1e-11, max_epochs=2000,
                         random_state=0)
        cert = problem.zero_certificate()
        keep = strong_rule_keep(cert.block_correlation, problem.n_samples, problem.lam,
                                lmax, problem.full_active_set().weights)
        support = np.abs(sol.coef) > 1e-8 * np.abs(sol.coef).max()
        assert support.any()
        assert np.all(keep[support]), seed
        assert not np.all(keep)          # it does discard something


@pytest.mark.parametrize("loss,kind,shape", [
    ("squared", "l1", (200, 60)), ("squared", "l1", (80, 300)),
    ("logistic", "l1", (200, 60)), ("logistic", "l1", (100, 250)),
    ("squared", "group", (150, 120)), ("logistic", "group", (200, 90))])
@pytest.mark.parametrize("ratio", [0.15, 0.4])
def test_screening_ability(loss, kind, shape, ratio, make_data):
    """Theorem 2: at convergence the active set shrinks to (about) the support."""
    n, p = shape
    X, y = make_data.random_data(11 + p, n, p, loss, n_informative=8)
    penalty = L1(p) if kind == "l1" else GroupL1(p, 3)
    base = Problem(X, y, loss, penalty, 1.0, True)
    problem = base.with_lam(ratio * base.lam_max())
    res = solve_ddss(problem, screening=True, tol=1e-10, max_epochs=5000, random_state=0)
    assert res.converged
    support = np.abs(res.coef) > 0
    assert support.any()
    n_active = res.active_features.shape[0]
    assert n_active <= 1.05 * support.sum() + 5, (n_active, support.sum())
    assert np.all(np.isin(np.flatnonzero(support), res.active_features))
    # the history records the shrinking active set
    assert res.history[-1]["n_active"] == n_active
    assert res.history[0]["n_active"] == p
    sizes = [h["n_active"] for h in res.history]
    assert all(a >= b for a, b in zip(sizes, sizes[1:]))
