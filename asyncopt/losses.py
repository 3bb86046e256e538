"""Per-sample losses f_i(z) of the datafit F(x) = (1/n) sum_i c_i f_i(a_i^T x + b).

docs/design.md §1.

Sample weights c_i >= 0 (``Problem``'s ``sample_weight``) make row i's loss c_i f_i: its
derivative c_i f_i', its curvature c_i f_i'' and its conjugate c_i f_i*(u / c_i) (the
indicator of u = 0 where c_i = 0). The kernels take them as an array beside y, in the
"kernel form": the weights, or an empty array (``UNWEIGHTED``) for every c_i = 1, which
``row_weight`` reads; the unweighted loops then multiply by 1.0 only, bit for bit as
without weights.

Each loss is identified by an integer code so that one numba kernel serves both
(``loss_value(code, z, y)`` etc. branch on the code; the branch is perfectly predicted).

- squared  (code 0): f(z) = (y - z)^2 / 2,        f'(z) = z - y,          L_f = 1,
                     f*(u) = u^2 / 2 + u y
- logistic (code 1): f(z) = log(1 + exp(-y z)),   f'(z) = -y / (1 + exp(y z)),  L_f = 1/4,
                     f*(u) = (-u y) log(-u y) + (1 + u y) log(1 + u y),  -u y in [0, 1]
                     (labels y in {-1, +1}; 0 log 0 = 0; +inf outside the domain)
"""
import math

import numpy as np
from numba import njit

SQUARED = 0
LOGISTIC = 1
UNWEIGHTED = np.empty(0)     # the kernel form of "no sample weights" (never written)


@njit(cache=True, inline="always")
def row_weight(sample_weight, i):
    """c_i of row i: sample_weight[i], or 1 where ``sample_weight`` is empty (the kernel
    form of an unweighted problem)."""
    if sample_weight.shape[0] == 0:
        return 1.0
    return sample_weight[i]


@njit(cache=True)
def weight_total(sample_weight, n):
    """sum_i c_i over n rows (n where ``sample_weight`` is empty)."""
    if sample_weight.shape[0] == 0:
        return float(n)
    return np.sum(sample_weight)


@njit(cache=True, inline="always")
def loss_value(code, z, y):
    """f(z) for one sample with label/target y."""
    if code == SQUARED:
        r = y - z
        return 0.5 * r * r
    t = -y * z
    if t > 0.0:
        return t + math.log1p(math.exp(-t))
    return math.log1p(math.exp(t))


@njit(cache=True, inline="always")
def loss_derivative(code, z, y):
    """f'(z) for one sample."""
    if code == SQUARED:
        return z - y
    t = y * z
    if t > 0.0:
        e = math.exp(-t)
        return -y * e / (1.0 + e)
    return -y / (1.0 + math.exp(t))


@njit(cache=True, inline="always")
def loss_second_derivative(code, z, y):
    """f''(z) for one sample (used by the intercept's Newton steps)."""
    if code == SQUARED:
        return 1.0
    t = abs(z)
    e = math.exp(-t)
    return e / ((1.0 + e) * (1.0 + e))


@njit(cache=True, inline="always")
def _xlogx(t):
    if t <= 0.0:
        return 0.0
    return t * math.log(t)


@njit(cache=True, inline="always")
def loss_conjugate(code, u, y):
    """Fenchel conjugate f*(u) for one sample (+inf outside its domain)."""
    if code == SQUARED:
        return 0.5 * u * u + u * y
    s = -u * y
    if s < -1e-15 or s > 1.0 + 1e-15:
        return np.inf
    s = min(max(s, 0.0), 1.0)
    return _xlogx(s) + _xlogx(1.0 - s)


@njit(cache=True)
def mean_loss(code, z, y, sample_weight):
    """(1/n) sum_i c_i f(z_i, y_i) (c_i = ``row_weight``). The unweighted logistic loss
    sums max(t_i, 0) + log(1 + e^-|t_i|), t_i = -y_i z_i, with one log per
    LOG_BLOCK rows: the log of the product of their factors 1 + e^-|t_i| in (1, 2]
    (at most 2^LOG_BLOCK, no overflow; each factor rounded once, an error of at most
    about 1e-16 a row, as log1p's)."""
    if code == LOGISTIC and sample_weight.shape[0] == 0:
        return _logistic_loss_sum(z, y) / z.shape[0]
    total = 0.0
    for i in range(z.shape[0]):
        total += row_weight(sample_weight, i) * loss_value(code, z[i], y[i])
    return total / z.shape[0]


LOG_BLOCK = 512


@njit(cache=True)
def _logistic_loss_sum(z, y):
    """sum_i log(1 + exp(-y_i z_i)) (``mean_loss``'s blocked logs)."""
    total = 0.0
    n = z.shape[0]
    for start in range(0, n, LOG_BLOCK):
        product = 1.0
        for i in range(start, min(start + LOG_BLOCK, n)):
            t = -y[i] * z[i]
            total += max(t, 0.0)
            product *= 1.0 + math.exp(-abs(t))
        total += math.log(product)
    return total


@njit(cache=True)
def _logistic_intercept_sums(v, y, sample_weight, b):
    """``intercept_sums``' logistic sums at b from v_i = exp(y_i z0_i); e^(y_i b) as
    p_i e^b + (1 - p_i) e^-b with p_i = (1 + y_i) / 2 in {0, 1} (exact), so that the
    loop has no branch and vectorizes (the weighted rows in a loop of their own); |b| is
    capped at 700 (e^700 ~ 1e304), far past any intercept, so that neither factor is
    inf."""
    up = math.exp(min(b, 700.0))
    down = math.exp(min(-b, 700.0))
    first = 0.0
    second = 0.0
    if sample_weight.shape[0] == 0:
        for i in range(v.shape[0]):
            p = 0.5 + 0.5 * y[i]
            s = 1.0 / (1.0 + v[i] * (p * up + (1.0 - p) * down))
            first -= y[i] * s
            second += s * (1.0 - s)
    else:
        for i in range(v.shape[0]):
            p = 0.5 + 0.5 * y[i]
            s = 1.0 / (1.0 + v[i] * (p * up + (1.0 - p) * down))
            c = sample_weight[i]
            first -= c * y[i] * s
            second += c * s * (1.0 - s)
    return np.array([first, second])


def intercept_sums(code, z0, y, sample_weight):
    """The function b -> [sum_i c_i f'(z0_i + b), sum_i c_i f''(z0_i + b)] over these
    rows (an array of two floats; c_i = ``row_weight`` of ``sample_weight``, the kernel
    form): the rows' share of the intercept's Newton step (``problem.refit_intercept``):
    for a loss code other than the two below, from ``loss_derivative`` and
    ``loss_second_derivative``.

    Squared loss: [sum c (z0 - y) + b sum c, sum c], from two sums formed here.
    Logistic loss: with v_i = exp(y_i z0_i), exp(y_i (z0_i + b)) = v_i e^(y_i b) and
    s_i = 1 / (1 + v_i e^(y_i b)) = sigma(-y_i (z0_i + b)), f' = -y_i s_i and
    f'' = s_i (1 - s_i): one vectorized exp pass here serves every call, which has no
    exp or log per row (v = inf gives s = 0, v = 0 gives s = 1, the exact limits)."""
    if code == SQUARED:
        if sample_weight.shape[0]:
            offset = float(sample_weight @ z0 - sample_weight @ y)
            rows = float(np.sum(sample_weight))
        else:
            offset = float(np.sum(z0) - np.sum(y))
            rows = float(z0.shape[0])
        return lambda b: np.array([offset + rows * b, rows])
    if code == LOGISTIC:
        with np.errstate(over="ignore"):
            v = np.exp(y * z0)
        return lambda b: _logistic_intercept_sums(v, y, sample_weight, float(b))
    return lambda b: _intercept_sums(code, z0, float(b), y, sample_weight)


@njit(cache=True)
def _intercept_sums(code, z0, b, y, sample_weight):
    """``intercept_sums`` of any loss code, from ``loss_derivative`` and
    ``loss_second_derivative`` row by row."""
    first = 0.0
    second = 0.0
    for i in range(z0.shape[0]):
        c = row_weight(sample_weight, i)
        first += c * loss_derivative(code, z0[i] + b, y[i])
        second += c * loss_second_derivative(code, z0[i] + b, y[i])
    return np.array([first, second])


@njit(cache=True)
def _rows_intercept_sums(code, z0, v, y, sample_weight, b):
    """(sum_i c_i f'(z0_i + b), sum_i c_i f''(z0_i + b)) over these rows, for
    ``intercept_newton``: the logistic loss's from v = exp(y z0) (``intercept_sums``)."""
    if code == LOGISTIC:
        sums = _logistic_intercept_sums(v, y, sample_weight, b)
    else:
        sums = _intercept_sums(code, z0, b, y, sample_weight)
    return sums[0], sums[1]


@njit(cache=True)
def intercept_newton(code, z0, y, sample_weight, b, total):
    """argmin_b sum_i c_i f(z0_i + b, y_i) over these rows (a loss that is not
    quadratic; ``total`` = sum c > 0): the Newton steps of ``problem.refit_intercept``,
    with its sums formed here, in one process (under mpirun each sum is a reduction and
    ``refit_intercept`` runs them): from b to |sum c f'| <= 1e-13 total (or 100
    steps), a step halved while |sum c f'| grows at the trial, except once it is below
    rounding of b (|step| <= 1e-6 (1 + |b|))."""
    v = np.exp(y * z0) if code == LOGISTIC else z0
    grad, hess = _rows_intercept_sums(code, z0, v, y, sample_weight, b)
    for _ in range(100):
        if abs(grad) <= 1e-13 * total:
            break
        step = grad / max(hess, 1e-12 * total)
        accepted = False
        for _ in range(60):
            trial_grad, trial_hess = _rows_intercept_sums(code, z0, v, y, sample_weight,
                                                          b - step)
            if abs(step) <= 1e-6 * (1.0 + abs(b)) or abs(trial_grad) <= abs(grad):
                accepted = True
                break
            step *= 0.5
        if not accepted:
            trial_grad, trial_hess = _rows_intercept_sums(code, z0, v, y, sample_weight,
                                                          b - step)
        b -= step
        grad, hess = trial_grad, trial_hess
    return b


@njit(cache=True)
def generalized_residual(code, z, y, sample_weight, out):
    """rho_i = -c_i f'(z_i) into ``out`` (the dual point before scaling, docs/design.md
    §1; c_i = ``row_weight``)."""
    for i in range(z.shape[0]):
        out[i] = -row_weight(sample_weight, i) * loss_derivative(code, z[i], y[i])
    return out


@njit(cache=True)
def mean_neg_conjugate(code, theta, y, sample_weight):
    """D(theta) = -(1/n) sum_i c_i f*(-theta_i / c_i) (c_i = ``row_weight``): the
    conjugate of the weighted loss c_i f; a row with c_i = 0 adds 0 at theta_i = 0 and
    makes D = -inf elsewhere (its conjugate is the indicator of {0})."""
    total = 0.0
    if sample_weight.shape[0] == 0:
        for i in range(theta.shape[0]):
            total += loss_conjugate(code, -theta[i], y[i])
    else:
        for i in range(theta.shape[0]):
            c = sample_weight[i]
            if c > 0.0:
                total += c * loss_conjugate(code, -theta[i] / c, y[i])
            elif theta[i] != 0.0:
                return -np.inf
    return -total / theta.shape[0]


def kernel_weights(sample_weight):
    """The kernel form of sample weights: a float64 array, or ``UNWEIGHTED`` for None."""
    return UNWEIGHTED if sample_weight is None else np.asarray(sample_weight, np.float64)


class Loss:
    """A per-sample loss: its code for the kernels, L_f, and vectorised helpers.

    ``quadratic``: f'' is a constant, so the solvers may use what follows from it: the
    intercept's optimum in closed form (b += sum rho / sum c), D at any dual scale from
    sum rho^2 / c and sum y rho, a Hessian on the support that does not depend on the
    margins (its rows reused from step to step, the trial losses exact from it).
    The solvers read these facts here, never the code."""

    code = -1
    lipschitz = np.nan
    name = ""
    quadratic = False

    def value(self, z, y, sample_weight=None):
        """(1/n) sum_i c_i f(z_i, y_i) (c_i = 1 without ``sample_weight``)."""
        return mean_loss(self.code, np.asarray(z, np.float64), np.asarray(y, np.float64),
                         kernel_weights(sample_weight))

    def derivative(self, z, y, sample_weight=None):
        """c_i f'(z_i, y_i) per row."""
        z = np.asarray(z, np.float64)
        return -generalized_residual(self.code, z, np.asarray(y, np.float64),
                                     kernel_weights(sample_weight), np.empty_like(z))

    def dual(self, theta, y, sample_weight=None):
        """-(1/n) sum_i c_i f*(-theta_i / c_i)."""
        return mean_neg_conjugate(self.code, np.asarray(theta, np.float64),
                                  np.asarray(y, np.float64), kernel_weights(sample_weight))

    def null_intercept(self, y_sum, positive, n):
        """argmin_b (1/n) sum_i c_i f(b, y_i) from sum c y, the weight of the rows with
        y > 0 and the total weight sum c (unweighted: sum y, their count and n)."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"


class Squared(Loss):
    """f(z) = (y - z)^2 / 2; with lam = alpha this is scikit-learn's Lasso scaling."""

    code = SQUARED
    lipschitz = 1.0
    name = "squared"
    quadratic = True

    def null_intercept(self, y_sum, positive, n):
        return y_sum / n      # the mean of y


class Logistic(Loss):
    """f(z) = log(1 + exp(-y z)) for labels y in {-1, +1}."""

    code = LOGISTIC
    lipschitz = 0.25
    name = "logistic"

    def null_intercept(self, y_sum, positive, n):
        return float(np.log(max(positive, 1e-300) / max(n - positive, 1e-300)))


LOSSES = {"squared": Squared, "logistic": Logistic}


def loss_of_code(code):
    """The Loss whose kernel code is ``code``."""
    return {SQUARED: Squared, LOGISTIC: Logistic}[int(code)]()


def get_loss(loss):
    """A Loss instance from a Loss or its name ('squared', 'logistic')."""
    if isinstance(loss, Loss):
        return loss
    try:
        return LOSSES[loss]()
    except (KeyError, TypeError):
        raise ValueError(f"unknown loss {loss!r}: expected one of {sorted(LOSSES)}") from None
