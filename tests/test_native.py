"""The native C + OpenMP inner loop (native/svrg.c via asyncopt.kernels.native).

With one thread it must be bit-identical to the tracked numba kernels; with several
threads it is Hogwild (not reproducible), so it is checked on problems whose slices do not
interact (bit-identical to running the numba kernel slice by slice) and on the objective
decrease of a real SVRG epoch.
"""
import numpy as np
import pytest
import scipy.sparse as sp

from asyncopt.kernels import native
from asyncopt.kernels.svrg import svrg_epoch_group_tracked, svrg_epoch_l1_tracked
from asyncopt.kernels.workspace import Blocks, Clock, Rows, SvrgStep

pytestmark = pytest.mark.skipif(
    not native.available(),
    reason=f"native C/OpenMP kernel not available: {native.LOAD_ERROR}")

SQUARED, LOGISTIC = 0, 1


def _loss_derivative(code, z, y):
    if code == SQUARED:
        return z - y
    return -y / (1.0 + np.exp(y * z))


def _loss_value(code, z, y):
    if code == SQUARED:
        return 0.5 * (y - z) ** 2
    return np.logaddexp(0.0, -y * z)


def _problem(code, n=80, p=30, density=0.2, seed=0, block_size=None, blocks_of=None):
    """A random CSR problem and the arrays of one variance-reduced epoch at a snapshot."""
    rng = np.random.default_rng(seed)
    A = sp.random(n, p, density=density, format="csr", random_state=rng,
                  data_rvs=rng.standard_normal)
    if blocks_of is not None:  # rows of the first half only touch the first half features
        A = A.tolil()
        half_n, half_p = n // 2, p // 2
        A[:half_n, half_p:] = 0
        A[half_n:, :half_p] = 0
        A = A.tocsr()
        A.eliminate_zeros()
    A.sort_indices()
    A = A.astype(np.float64)
    y = (np.sign(rng.standard_normal(n)) if code == LOGISTIC
         else rng.standard_normal(n))
    y[y == 0] = 1.0
    x_snap = rng.standard_normal(p) * 0.1
    b_snap = 0.05
    z_snap = A @ x_snap + b_snap
    grad = A.T @ _loss_derivative(code, z_snap, y) / n
    mu_b = float(np.mean(_loss_derivative(code, z_snap, y)))
    if block_size is None:
        block_indptr = np.arange(p + 1, dtype=np.int64)
    else:
        block_indptr = np.append(np.arange(0, p, block_size), p).astype(np.int64)
    n_blocks = len(block_indptr) - 1
    feature_block = np.repeat(np.arange(n_blocks), np.diff(block_indptr)).astype(np.int64)
    # d_g = n / n_g with n_g = rows touching block g
    touches = np.zeros((n, n_blocks), dtype=bool)
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    touches[rows, feature_block[A.indices]] = True
    n_g = np.maximum(touches.sum(axis=0), 1)
    d = n / n_g
    weighted_mu = grad * d[feature_block]
    lam = 0.01
    L = (1.0 if code == SQUARED else 0.25) * float(np.max(A.multiply(A).sum(axis=1)))
    eta = 0.3 / max(L, 1e-12)
    weights = np.sqrt(np.diff(block_indptr))
    thresholds = eta * lam * d * weights
    return dict(A=A, indptr=A.indptr.astype(np.int64), indices=A.indices.astype(np.int32),
                data=A.data.astype(np.float64), y=y.astype(np.float64), code=code,
                x0=x_snap.copy(), b0=b_snap, eta_intercept=eta * 0.5, z_snap=z_snap,
                weighted_mu=weighted_mu, mu_intercept=mu_b, thresholds=thresholds,
                eta=eta, block_indptr=block_indptr, feature_block=feature_block,
                lam=lam, weights=weights, n=n)


def _objective(pb, x, b):
    z = pb["A"] @ x + b
    bi = pb["block_indptr"]
    norms = np.sqrt(np.add.reduceat(x * x, bi[:-1])) if len(bi) > 1 else np.zeros(0)
    return float(np.mean(_loss_value(pb["code"], z, pb["y"])) + pb["lam"] * norms @ pb["weights"])


def _run(kind, pb, x, intercept, samples, vr, clock, staleness, n_threads=None):
    rows = Rows(pb["indptr"], pb["indices"], pb["data"], pb["y"], pb["code"])
    blocks = Blocks(pb["block_indptr"], pb["feature_block"])
    step = SvrgStep(pb["z_snap"], pb["weighted_mu"], pb["mu_intercept"], pb["thresholds"],
                    pb["eta"], pb["eta_intercept"], vr)
    args = (rows, blocks, step, x, intercept, samples, Clock(clock, staleness))
    if n_threads is None:  # numba
        fn = svrg_epoch_l1_tracked if kind == "l1" else svrg_epoch_group_tracked
        return fn(*args)
    fn = native.native_epoch_l1 if kind == "l1" else native.native_epoch_group
    return fn(*args, n_threads=n_threads)


CASES = [("l1", SQUARED), ("l1", LOGISTIC), ("group", SQUARED), ("group", LOGISTIC)]


def _check_staleness(per_thread, staleness, n_samples, n_threads):
    """tau of a step = the steps the other threads finished between its read of the
    clock and its tick: slice s (numpy.array_split's) has at most n - |slice s| of them,
    so its max is at most that and its sum at most |slice s| times its max; the clock's
    counters (fresh ones) are the slices' sum and max."""
    shares = np.array([len(part) for part in np.array_split(np.arange(n_samples),
                                                            n_threads)])
    assert per_thread.shape == (n_threads, 2)
    assert np.all(per_thread[:, 1] <= n_samples - shares)
    assert np.all(per_thread[:, 0] <= shares * per_thread[:, 1])
    assert staleness[0] == per_thread[:, 0].sum()
    assert staleness[1] == per_thread[:, 1].max()
    if n_threads == 1:
        assert staleness.tolist() == [0, 0]


def test_available_and_located():
    assert native.available()
    assert native.LOAD_ERROR is None
    assert "_native_svrg" in native.LIBRARY_PATH


@pytest.mark.parametrize("kind,code", CASES)
@pytest.mark.parametrize("vr", [True, False])
def test_one_thread_bit_identical_to_numba(kind, code, vr):
    pb = _problem(code, block_size=None if kind == "l1" else 3, seed=3 + code)
    rng = np.random.default_rng(7)
    x_nb, x_c = pb["x0"].copy(), pb["x0"].copy()
    b_nb, b_c = np.array([pb["b0"]]), np.array([pb["b0"]])
    clock_nb, clock_c = np.zeros(1, np.int64), np.zeros(1, np.int64)
    st_nb, st_c = np.zeros(2, np.int64), np.zeros(2, np.int64)
    for _ in range(5):
        samples = rng.integers(0, pb["n"], size=pb["n"]).astype(np.int64)
        _run(kind, pb, x_nb, b_nb, samples, vr, clock_nb, st_nb)
        per_thread = _run(kind, pb, x_c, b_c, samples, vr, clock_c, st_c, n_threads=1)
        assert per_thread.shape == (1, 2)
    assert np.count_nonzero(x_c) > 0
    assert np.array_equal(x_nb.view(np.int64), x_c.view(np.int64))  # bitwise, incl. -0.0
    assert b_nb.view(np.int64)[0] == b_c.view(np.int64)[0]
    # one thread: no staleness, the clock counts the steps
    assert clock_c[0] == 5 * pb["n"] == clock_nb[0]
    assert st_c.tolist() == [0, 0] == st_nb.tolist()


@pytest.mark.parametrize("kind,code", CASES)
def test_two_threads_disjoint_slices_match_numba_slice_by_slice(kind, code):
    """Slices touching disjoint features do not interact (without an intercept, which the
    threads share): bit-identical to numba run on each slice in turn."""
    pb = _problem(code, n=60, p=20, density=0.3, seed=11,
                  block_size=None if kind == "l1" else 2, blocks_of=True)
    pb["eta_intercept"] = 0.0
    rng = np.random.default_rng(5)
    half = pb["n"] // 2
    samples = np.concatenate([rng.integers(0, half, size=45),
                              rng.integers(half, pb["n"], size=45)]).astype(np.int64)
    x_nb, x_c = pb["x0"].copy(), pb["x0"].copy()
    b_nb, b_c = np.array([pb["b0"]]), np.array([pb["b0"]])
    private = []
    for part in np.array_split(samples, 2):
        own = b_nb.copy()
        _run(kind, pb, x_nb, own, part, True, np.zeros(1, np.int64), np.zeros(2, np.int64))
        private.append(own)
    b_nb[0] += sum(own[0] - b_nb[0] for own in private)
    clock, st = np.zeros(1, np.int64), np.zeros(2, np.int64)
    per_thread = _run(kind, pb, x_c, b_c, samples, True, clock, st, n_threads=2)
    assert np.array_equal(x_nb.view(np.int64), x_c.view(np.int64))
    assert b_nb.view(np.int64)[0] == b_c.view(np.int64)[0]
    assert clock[0] == len(samples)
    _check_staleness(per_thread, st, len(samples), 2)


@pytest.mark.parametrize("kind,code", CASES)
@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("with_intercept", [False, True])
def test_threads_epoch_decreases_objective_like_one_thread(kind, code, n_threads,
                                                           with_intercept):
    pb = _problem(code, n=400, p=40, density=0.1, seed=21,
                  block_size=None if kind == "l1" else 4)
    if not with_intercept:
        pb["eta_intercept"] = 0.0
    rng = np.random.default_rng(2)
    samples = rng.permutation(pb["n"]).astype(np.int64)
    start = _objective(pb, pb["x0"], pb["b0"])
    results = {}
    for t in (1, n_threads):
        x, b = pb["x0"].copy(), np.array([pb["b0"]])
        clock, st = np.zeros(1, np.int64), np.zeros(2, np.int64)
        per_thread = _run(kind, pb, x, b, samples, True, clock, st, n_threads=t)
        assert np.all(np.isfinite(x)) and np.isfinite(b[0])
        assert clock[0] == len(samples)
        _check_staleness(per_thread, st, len(samples), t)
        results[t] = _objective(pb, x, b[0])
    assert results[1] < start
    assert results[n_threads] < start
    # Hogwild: not reproducible, but x progresses as in the serial epoch (measured: within
    # ~1.5% of the serial decrease, about the spread over sample orders). The private
    # intercepts (one per thread, deltas summed, as solvers/threads.py) each miss the
    # others' progress, which costs ~5-9% of the decrease with 3 threads; the outer loop
    # refits the intercept exactly anyway.
    tol = 0.25 if with_intercept else 0.05
    assert abs(results[n_threads] - results[1]) <= tol * (start - results[1])


def test_more_threads_than_samples_and_empty_epoch():
    pb = _problem(SQUARED, seed=1)
    x, b = pb["x0"].copy(), np.array([pb["b0"]])
    clock, st = np.zeros(1, np.int64), np.zeros(2, np.int64)
    samples = np.array([3, 5], dtype=np.int64)
    per_thread = _run("l1", pb, x, b, samples, True, clock, st, n_threads=4)
    assert np.all(np.isfinite(x))
    assert clock[0] == 2
    _check_staleness(per_thread, st, 2, 4)          # two threads of one step, two idle
    assert np.all(per_thread[2:] == 0)
    x2, b2 = pb["x0"].copy(), np.array([pb["b0"]])
    _run("group", pb, x2, b2, np.zeros(0, np.int64), True, clock, st, n_threads=3)
    assert np.array_equal(x2, pb["x0"]) and b2[0] == pb["b0"] and clock[0] == 2


def test_argument_checks():
    pb = _problem(SQUARED, seed=2)
    x, b = pb["x0"].copy(), np.array([pb["b0"]])
    samples = np.arange(5, dtype=np.int64)
    clock, st = np.zeros(1, np.int64), np.zeros(2, np.int64)
    with pytest.raises(TypeError):
        _run("l1", pb, x, b, samples.astype(np.int32), True, clock, st, n_threads=1)
    with pytest.raises(TypeError):
        _run("l1", pb, x[::2], b, samples, True, clock, st, n_threads=1)
    with pytest.raises(ValueError):
        _run("l1", pb, x, b, samples, True, clock, st, n_threads=0)
