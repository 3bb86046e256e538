"""Shared fixtures and the hypothesis profile for the asyncopt test suite.

The ``ref`` fixture holds *independent* NumPy/SciPy implementations of the objects of
docs/design.md §1 (losses, conjugates, intercept optimum, dual point, duality gap,
lam_max), so that tests never check the library against itself. ``make_data`` builds
small seeded random problems (dense, CSR, CSC).
"""
import os
import sys
import types

import numpy as np
import pytest
import scipy.optimize
import scipy.special
import scipy.sparse as sp
from hypothesis import HealthCheck, settings

settings.register_profile(
    "asyncopt", deadline=None, derandomize=True, max_examples=20, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("asyncopt")


# mpirun from the mpich wheel that requirements.txt pins: it sits beside the venv's python
VENV_MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")


def pytest_configure(config):
    # pyproject.toml registers them too; registering twice is harmless.
    config.addinivalue_line("markers", "slow: long runs, excluded by default (-m slow)")
    config.addinivalue_line(
        "markers", "perf: tuning and timing checks, excluded by default (-m perf)")
    config.addinivalue_line(
        "markers", "mpi: starts mpirun from the venv; fails, never skips, without it")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    """A test marked ``mpi`` fails (it is never skipped) where the venv has no mpirun:
    mpich is pinned in requirements.txt, so a venv without it is a broken install."""
    if item.get_closest_marker("mpi") is not None and not os.path.exists(VENV_MPIRUN):
        pytest.fail(f"mpirun not found in the venv ({VENV_MPIRUN}): run make install",
                    pytrace=False)


# -- independent reference implementations (NumPy/SciPy only) -----------------

def _as_dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)


def loss_values(loss, z, y):
    """f(z_i, y_i) elementwise."""
    if loss == "squared":
        return 0.5 * (y - z) ** 2
    return np.logaddexp(0.0, -y * z)


def loss_derivatives(loss, z, y):
    """f'(z_i, y_i) elementwise."""
    if loss == "squared":
        return z - y
    return -y * scipy.special.expit(-y * z)


def loss_conjugates(loss, u, y):
    """f*(u_i, y_i) elementwise (+inf outside the domain for the logistic loss)."""
    if loss == "squared":
        return 0.5 * u ** 2 + u * y
    s = -u * y
    out = np.full(np.shape(s), np.inf)
    ok = (s >= -1e-15) & (s <= 1 + 1e-15)
    sc = np.clip(s[ok], 0.0, 1.0)
    out[ok] = scipy.special.xlogy(sc, sc) + scipy.special.xlogy(1 - sc, 1 - sc)
    return out


def lipschitz(loss):
    return 1.0 if loss == "squared" else 0.25


def optimal_intercept(loss, z0, y, c=None):
    """argmin_b mean f(z0 + b) (with the rows' weights ``c``: sum_i c_i f(z0_i + b)) by a
    closed form / bracketing root finder."""
    if loss == "squared":
        return float(np.mean(y - z0)) if c is None else \
            float(c @ (y - z0)) / float(np.sum(c))

    def deriv(b):
        derivatives = loss_derivatives(loss, z0 + b, y)
        return np.mean(derivatives) if c is None else float(c @ derivatives)
    lo, hi = -1.0, 1.0
    while deriv(lo) > 0:
        lo *= 2
    while deriv(hi) < 0:
        hi *= 2
    return scipy.optimize.brentq(deriv, lo, hi, xtol=1e-16, rtol=1e-15, maxiter=500)


def block_list(penalty):
    """[(feature ids, weight)] of a BlockPenalty."""
    ip, ids, w = penalty.indptr, penalty.ids, penalty.weights
    return [(ids[ip[g]:ip[g + 1]], w[g]) for g in range(len(ip) - 1)]


def omega(penalty, x):
    return sum(w * np.linalg.norm(x[g]) for g, w in block_list(penalty))


def omega_dual(penalty, u):
    return max(np.linalg.norm(u[g]) / w for g, w in block_list(penalty))


def primal(X, y, loss, penalty, lam, x, b):
    z = _as_dense(X) @ x + b
    return float(np.mean(loss_values(loss, z, y)) + lam * omega(penalty, x))


def dual(loss, y, theta):
    return float(-np.mean(loss_conjugates(loss, -theta, y)))


def certificate(X, y, loss, penalty, lam, fit_intercept, x, b=0.0):
    """Independent (b*, theta, P, D, G) at x following docs/design.md §1 (b refit when fitted)."""
    A = _as_dense(X)
    n = A.shape[0]
    z0 = A @ x
    b = optimal_intercept(loss, z0, y) if fit_intercept else 0.0
    rho = -loss_derivatives(loss, z0 + b, y)
    scale = max(1.0, omega_dual(penalty, A.T @ rho) / (n * lam))
    theta = rho / scale
    P = primal(X, y, loss, penalty, lam, x, b)
    D = dual(loss, y, theta)
    return types.SimpleNamespace(intercept=b, theta=theta, primal=P, dual=D, gap=P - D,
                                 scale=scale, rho=rho)


def lam_max(X, y, loss, penalty, fit_intercept):
    A = _as_dense(X)
    cert = certificate(X, y, loss, penalty, 1.0, fit_intercept, np.zeros(A.shape[1]))
    return omega_dual(penalty, A.T @ cert.rho) / A.shape[0]


def block_prox(penalty, x, step):
    """prox of step * Omega (independent block soft-thresholding)."""
    out = x.copy()
    for g, w in block_list(penalty):
        norm = np.linalg.norm(x[g])
        out[g] = 0.0 if norm <= step * w else x[g] * (1 - step * w / norm)
    return out


def polish(X, y, loss, penalty, lam, fit_intercept, x, b=0.0, target=1e-12,
           max_iter=20000):
    """Independent FISTA (with adaptive restart) from (x, b) until the independent
    relative gap is <= target; returns (x, b, relative gap)."""
    A = _as_dense(X)
    n = A.shape[0]
    p0 = certificate(X, y, loss, penalty, lam, fit_intercept, np.zeros(A.shape[1])).primal
    B = np.column_stack([A, np.ones(n)]) if fit_intercept else A
    step = n / (lipschitz(loss) * np.linalg.norm(B, 2) ** 2)
    b = optimal_intercept(loss, A @ x, y) if fit_intercept else 0.0

    def obj(x, b):
        return primal(X, y, loss, penalty, lam, x, b)

    xk, bk, xp, bp, t, fk = x.copy(), b, x.copy(), b, 1.0, obj(x, b)
    for it in range(max_iter):
        if it % 50 == 0:
            rel = certificate(X, y, loss, penalty, lam, fit_intercept, xk).gap / p0
            if rel <= target:
                break
        t_new = (1 + np.sqrt(1 + 4 * t * t)) / 2
        mom = (t - 1) / t_new
        xs, bs = xk + mom * (xk - xp), bk + mom * (bk - bp)
        d = loss_derivatives(loss, A @ xs + bs, y) / n
        xn = block_prox(penalty, xs - step * (A.T @ d), step * lam)
        bn = bs - step * d.sum() if fit_intercept else 0.0
        fn = obj(xn, bn)
        if fn > fk:                      # adaptive restart
            t_new = 1.0
            d = loss_derivatives(loss, A @ xk + bk, y) / n
            xn = block_prox(penalty, xk - step * (A.T @ d), step * lam)
            bn = bk - step * d.sum() if fit_intercept else 0.0
            fn = obj(xn, bn)
        xp, bp, xk, bk, t, fk = xk, bk, xn, bn, t_new, fn
    rel = certificate(X, y, loss, penalty, lam, fit_intercept, xk).gap / p0
    return xk, (optimal_intercept(loss, A @ xk, y) if fit_intercept else 0.0), rel


@pytest.fixture(scope="session")
def ref():
    """Independent NumPy reference implementations (see the module docstring)."""
    return types.SimpleNamespace(
        loss_values=loss_values, loss_derivatives=loss_derivatives,
        loss_conjugates=loss_conjugates, lipschitz=lipschitz,
        optimal_intercept=optimal_intercept, block_list=block_list, omega=omega,
        omega_dual=omega_dual, primal=primal, dual=dual, certificate=certificate,
        lam_max=lam_max, as_dense=_as_dense, block_prox=block_prox,
        polish=polish)


# -- random problems -------------------------------------------------------------

def random_data(seed, n, p, loss="squared", fmt="dense", density=0.3, n_informative=5,
                noise=0.1):
    """Seeded random (X, y): Gaussian design (masked to ``density`` for sparse formats),
    y from a sparse ground truth (labels in {-1, +1} for the logistic loss)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    if fmt != "dense":
        X *= rng.random((n, p)) < density
    w = np.zeros(p)
    k = min(n_informative, p)
    w[rng.choice(p, k, replace=False)] = rng.standard_normal(k) * 2
    score = X @ w + noise * rng.standard_normal(n) + 0.3
    if loss == "logistic":
        y = np.where(score > 0, 1.0, -1.0)
        if np.all(y == y[0]):
            y[0] = -y[0]
    else:
        y = score
    if fmt == "csr":
        X = sp.csr_matrix(X)
    elif fmt == "csc":
        X = sp.csc_matrix(X)
    return X, y


def random_groups(seed, p, max_size=5):
    """A random partition of range(p) into groups of sizes 1..max_size (shuffled ids)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(p)
    groups, start = [], 0
    while start < p:
        size = int(rng.integers(1, max_size + 1))
        groups.append(np.sort(perm[start:start + size]))
        start += size
    return groups


@pytest.fixture(scope="session")
def make_data():
    return types.SimpleNamespace(random_data=random_data, random_groups=random_groups)
