"""Screening tests that delete blocks which are zero at the optimum (docs/design.md §1).

Gap-safe sphere (dynamic, used by DDSS every outer iteration). D is 1/(n L_f)-strongly
concave, so ||theta - theta*|| <= r = sqrt(2 n L_f G) and block g is zero at every
optimum if

    ||A_g^T theta|| + r ||A_g|| < n lam w_g.

With sample weights c (D = -(1/n) sum_i c_i f*(-theta_i / c_i)) the strong concavity is
in the norm ||theta||_{C^-1}^2 = sum_i theta_i^2 / c_i, so ||theta - theta*||_{C^-1} <= r
with the same r, and ||A_g^T (theta - theta*)|| <= ||C^(1/2) A_g|| r: ``||A_g||`` is then
the weighted norm (sum_i c_i a_ij^2)^(1/2) (``ActiveSet.block_column_norms``), which the
callers pass; the functions here are the same (docs/design.md §1).

(Thesis eq. 3-3 prints the radius as sqrt(2 L G); under this scaling the factor n is
needed.)

Elastic net (``penalties.L1`` with l2 > 0, mu = lam l2): the L2 term mu/2 sum_j w_j x_j^2
is the squared loss L_f/2 z^2 of p extra rows sqrt(n mu w_j / L_f) e_j with target 0 and
no intercept, which the dual then covers too: D stays 1/(n L_f)-strongly concave, the
radius is the same sqrt(2 n L_f G), the correlation is c = A^T rho - n mu w x (the
certificate's) and column j has the norm sqrt(||A_j||^2 + n mu w_j / L_f)
(``augmented_column_norms``). An L2 row of strength L_f (not 1, as a squared-loss row
would have) is the choice that makes the test tightest (docs/design.md §1).

The sphere may be centred at any feasible theta with G = P(x) - D(theta): ``BestDual``
keeps the feasible point with the largest D met so far in a run and tests around it too.

Static safe sphere: the same test evaluated once at a fixed primal point (x = 0 with the
optimal intercept by default), as PSE-Safe uses it. Strong rule (Tibshirani et al. 2012):
discard g if ||A_g^T rho(x_prev)|| / n < w_g (2 lam - lam_prev); unsafe, so its users must
check the KKT conditions at the end.
"""
import math

import numpy as np
from numba import njit


ROUNDING = 1e-11     # relative allowance for rounding in G = P - D (see gap_safe_radius)


@njit(cache=True)
def gap_safe_radius(n_samples, lipschitz, gap, primal=0.0):
    """r = sqrt(2 n L_f (G + ROUNDING |P|)), G clipped at 0.

    P and D are sums of n rounded terms: at a solution the computed G can be 0 (or
    negative) while the true one is not, and a zero radius would remove a non-zero
    feature whose correlation is 1 - 1e-15 in floating point. The allowance keeps the
    sphere larger than that rounding (it only matters once G < 1e-11 P)."""
    return math.sqrt(2.0 * n_samples * lipschitz
                     * (max(gap, 0.0) + ROUNDING * abs(primal)))


@njit(cache=True)
def augmented_column_norms(block_column_norms, n_samples, lipschitz, lam, l2, weights):
    """The data's column norms with the elastic net's L2 rows appended (module
    docstring): sqrt(||A_j||^2 + n lam l2 w_j / L_f); the norms themselves where l2 = 0
    (L1 blocks only: the group penalty has no L2 part)."""
    if not l2:
        return block_column_norms
    return np.sqrt(block_column_norms * block_column_norms +
                   n_samples * lam * l2 * weights / lipschitz)


@njit(cache=True)
def gap_safe_keep(block_correlation, dual_scale, radius, block_column_norms, n_samples,
                  lam, weights):
    """Mask of the blocks that the gap-safe sphere test cannot remove.

    block_correlation[g] = ||A_g^T rho||, theta = rho / dual_scale;
    block_column_norms[g] = ||C^(1/2) A_g|| (the plain ||A_g|| without sample weights).
    """
    return (block_correlation / dual_scale + radius * block_column_norms
            >= n_samples * lam * weights)


class BestDual:
    """The feasible dual point with the largest D met so far in a run: D, ||A_g^T rho|| on
    the active blocks and the dual scale s (theta = rho / s).

    By weak duality every feasible theta has D(theta) <= P*, so G = P(x) - max_i D(theta_i)
    certifies x, and is never larger than the gap at x's own dual point: the run stops as
    soon as any earlier point certifies the current x. The gap-safe sphere around the best
    point, with this G, is a second safe test next to the sphere around x's own point (both
    contain theta*, so a block that either removes is zero at the optimum). Blocks removed
    by a safe test are zero at the optimum, so the restricted problem keeps P* and the best
    point stays valid after a compaction (``restrict``). The DDSS driver stops and
    screens on both, on every backend.

    Why: x's own dual point moves first-order with x while P moves second-order, so an
    epoch of stale asynchronous steps can lower D at an all but unchanged P."""

    def __init__(self):
        self.dual = -np.inf
        self.block_correlation = None
        self.dual_scale = 1.0

    def offer(self, dual, block_correlation=None, dual_scale=1.0):
        """Keep (dual, block_correlation, dual_scale) if its D is the largest so far.
        Offered without its correlation, a point certifies gaps but gives no sphere
        (``keep``)."""
        if dual > self.dual:
            self.dual = float(dual)
            self.block_correlation = None if block_correlation is None else \
                np.array(block_correlation, dtype=np.float64)
            self.dual_scale = float(dual_scale)

    def offer_certificate(self, cert):
        """``offer`` a Certificate's dual point with its sphere."""
        self.offer(cert.dual, cert.block_correlation, cert.dual_scale)

    def gap(self, primal):
        """G = P - D_best (clipped at 0)."""
        return max(primal - self.dual, 0.0)

    def restrict(self, keep_blocks):
        """Follow a compaction to the blocks ``keep_blocks`` keeps."""
        if self.block_correlation is not None:
            self.block_correlation = self.block_correlation[keep_blocks]

    def keep(self, primal, n_samples, lipschitz, block_column_norms, lam, weights):
        """Blocks the gap-safe sphere around the best point cannot remove at P = primal
        (every block when there is no point yet, or it came without its correlation)."""
        if self.block_correlation is None:
            return np.ones(block_column_norms.shape[0], dtype=bool)
        radius = gap_safe_radius(n_samples, lipschitz, self.gap(primal), primal)
        return gap_safe_keep(self.block_correlation, self.dual_scale, radius,
                             block_column_norms, n_samples, lam, weights)


def screen_blocks(certificate, best, block_column_norms, n_samples, lipschitz, lam,
                  weights, l2=0.0):
    """Mask of the blocks to keep at a Certificate (``block_correlation``, ``dual_scale``,
    ``gap``, ``primal``): a block that the gap-safe sphere around the certificate's dual
    point removes, or (given a ``BestDual``) the sphere around the best point, is
    removed. Both spheres contain theta*, so every removed block is zero at the
    optimum. ``l2``: the penalty's (the elastic net), whose L2 rows lengthen the columns
    (``augmented_column_norms``)."""
    block_column_norms = augmented_column_norms(block_column_norms, n_samples, lipschitz,
                                                lam, l2, weights)
    radius = gap_safe_radius(n_samples, lipschitz, certificate.gap, certificate.primal)
    keep = gap_safe_keep(certificate.block_correlation, certificate.dual_scale, radius,
                         block_column_norms, n_samples, lam, weights)
    if best is not None:
        keep &= best.keep(certificate.primal, n_samples, lipschitz, block_column_norms,
                          lam, weights)
    return keep


def screen_active_set(active, certificate, best=None):
    """``screen_blocks`` on an ActiveSet."""
    prob = active.problem
    return screen_blocks(certificate, best, active.block_column_norms(), prob.n_samples,
                         prob.loss.lipschitz, prob.lam, active.weights, active.penalty.l2)


def static_safe_sphere_keep(problem, coef=None, intercept=0.0):
    """Blocks kept by one gap-safe sphere test at a fixed point (x = 0 by default),
    over the blocks of ``problem.penalty`` in their original order."""
    active = problem.full_active_set()
    x = np.zeros(active.n_features) if coef is None else \
        np.asarray(coef, np.float64)[active.features]
    cert = active.certificate(x, intercept)
    return screen_active_set(active, cert)


def strong_rule_keep(block_correlation, n_samples, lam, lam_prev, weights):
    """Blocks kept by the sequential strong rule:
    ||A_g^T rho|| / n >= w_g (2 lam - lam_prev), with rho the residual at the solution for
    lam_prev (lam_prev = lam_max at x = 0)."""
    return block_correlation / n_samples >= weights * (2.0 * lam - lam_prev)
