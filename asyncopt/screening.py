"""Screening tests that delete blocks which are zero at the optimum (DESIGN 1).

Gap-safe sphere (dynamic, used by DDSS every outer iteration). D is 1/(n L_f)-strongly
concave, so ||theta - theta*|| <= r = sqrt(2 n L_f G) and block g is zero at every optimum if

    ||A_g^T theta|| + r ||A_g|| < n lam w_g.

(Thesis eq. 3-3 prints the radius as sqrt(2 L G); under this scaling the factor n is needed.)

Static safe sphere: the same test evaluated once at a fixed primal point (x = 0 with the
optimal intercept by default), as PSE-Safe uses it. Strong rule (Tibshirani et al. 2012):
discard g if ||A_g^T rho(x_prev)|| / n < w_g (2 lam - lam_prev); unsafe, so its users must
check the KKT conditions at the end.
"""
import math

import numpy as np


def gap_safe_radius(n_samples, lipschitz, gap):
    """r = sqrt(2 n L_f G) (gap clipped at 0)."""
    return math.sqrt(2.0 * n_samples * lipschitz * max(gap, 0.0))


def gap_safe_keep(block_correlation, dual_scale, radius, block_column_norms, n_samples,
                  lam, weights):
    """Mask of the blocks that the gap-safe sphere test cannot remove.

    block_correlation[g] = ||A_g^T rho||, theta = rho / dual_scale.
    """
    return (block_correlation / dual_scale + radius * block_column_norms
            >= n_samples * lam * weights)


def screen_active_set(active, certificate):
    """Gap-safe test on an ActiveSet at a Certificate: mask of the blocks to keep."""
    prob = active.problem
    radius = gap_safe_radius(prob.n_samples, prob.loss.lipschitz, certificate.gap)
    return gap_safe_keep(certificate.block_correlation, certificate.dual_scale, radius,
                         active.block_column_norms(), prob.n_samples, prob.lam,
                         active.weights)


def static_safe_sphere_keep(problem, coef=None, intercept=0.0):
    """Blocks kept by one gap-safe sphere test at a fixed point (x = 0 by default),
    over the blocks of ``problem.penalty`` in their original order."""
    active = problem.full_active_set()
    x = np.zeros(active.n_features) if coef is None else \
        np.asarray(coef, np.float64)[active.features]
    cert = active.certificate(x, intercept)
    return screen_active_set(active, cert)


def strong_rule_keep(block_correlation, n_samples, lam, lam_prev, weights):
    """Blocks kept by the sequential strong rule: ||A_g^T rho|| / n >= w_g (2 lam - lam_prev),
    with rho the residual at the solution for lam_prev (lam_prev = lam_max at x = 0)."""
    return block_correlation / n_samples >= weights * (2.0 * lam - lam_prev)
