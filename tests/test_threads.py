"""The threads backend (Sha-DDSS): same solutions as the serial core, errors reach the
caller."""
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

from asyncopt import GroupLasso, Lasso, SparseLogisticRegression, lam_max
from asyncopt.penalties import GroupL1
from asyncopt.problem import Problem
from asyncopt.solvers import serial, threads
from asyncopt.kernels import native
import asyncopt.newton.policy as newton_policy
from asyncopt.solvers.threads import ThreadsInnerLoop, effective_n_jobs

KERNELS = ["numba", pytest.param("native", marks=pytest.mark.skipif(
    not native.available(), reason=f"native kernel not built: {native.LOAD_ERROR}"))]


def _data(seed, fmt, loss):
    rng = np.random.default_rng(seed)
    n, p = 300, 120
    X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.2)
    w = np.r_[rng.standard_normal(10), np.zeros(p - 10)]
    y = X @ w + 0.1 * rng.standard_normal(n)
    if loss == "logistic":
        y = np.where(y > 0, 1, 0)
    return (sp.csr_matrix(X) if fmt == "csr" else X), y


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize("model", ["lasso", "logistic", "group", "group_logistic"])
def test_threads_reach_the_serial_objective(model, fmt, kernel):
    loss = "logistic" if "logistic" in model else "squared"
    X, y = _data(3, fmt, loss)
    groups = 4 if "group" in model else None
    penalty = None if groups is None else GroupL1(X.shape[1], groups)
    alpha = 0.05 * lam_max(X, y, loss=loss, penalty=penalty)
    cls = {"lasso": Lasso, "group": GroupLasso}.get(model, SparseLogisticRegression)
    kw = dict(alpha=alpha, tol=1e-10, max_epochs=5000, random_state=0)
    if groups is not None:
        kw["groups"] = groups
    ref = cls(**kw).fit(X, y)
    par = cls(backend="threads", n_jobs=2, kernel=kernel, **kw).fit(X, y)
    y_fit = y if loss == "squared" else np.where(y == 1, 1.0, -1.0)
    problem = Problem(X, y_fit, loss, penalty, alpha, True)
    p_ref = problem.objective(np.ravel(ref.coef_), float(np.ravel(ref.intercept_)[0]))
    p_par = problem.objective(np.ravel(par.coef_), float(np.ravel(par.intercept_)[0]))
    assert abs(p_par - p_ref) <= 1e-6 * abs(p_ref)
    assert par.dual_gap_ <= 1e-10 * problem.zero_certificate().primal


def test_tracked_kernels_count_steps_and_iterate_like_the_serial_ones():
    from asyncopt.kernels.svrg import svrg_epoch_l1, svrg_epoch_l1_tracked
    from asyncopt.kernels.workspace import Blocks, Clock, Rows, SvrgStep
    X = sp.random(200, 50, density=0.1, random_state=0, format="csr")
    rng = np.random.default_rng(0)
    y = rng.standard_normal(200)
    rows = rng.integers(0, 200, 500)
    indptr = X.indptr.astype(np.int64)
    outs = []
    for kernel, start in [(svrg_epoch_l1, 0), (svrg_epoch_l1_tracked, 7)]:
        x, b = np.zeros(50), np.array([0.1])
        clock = Clock.fresh(start)
        kernel(Rows(indptr, X.indices, X.data, y, 0), Blocks(np.arange(51), np.arange(50)),
               SvrgStep(np.zeros(200), np.full(50, 0.01), 0.0, np.full(50, 1e-3), 0.1, 0.05),
               x, b, rows, clock)
        outs.append((x, b[0], clock.steps[0], clock.staleness.tolist()))
    (x0, b0, c0, s0), (x1, b1, c1, s1) = outs
    # the tracked kernel re-reads the shared intercept every INTERCEPT_SYNC steps, which
    # sums the same steps in another order: equal up to rounding
    np.testing.assert_allclose(x0, x1, rtol=1e-12, atol=1e-15)
    assert b0 == pytest.approx(b1, rel=1e-12)
    assert (c0, s0) == (0, [0, 0])          # the untracked kernel touches neither
    assert (c1, s1) == (7 + 500, [0, 0])    # alone on the clock: every tau is 0


@pytest.mark.parametrize("kernel", KERNELS)
def test_staleness_is_reported_and_two_threads_overlap(kernel, monkeypatch):
    # ~100 nonzeros a row, so a thread's share of an epoch (~10 ms) outlasts a time slice:
    # the two threads interleave even when another process holds the second core (with 20
    # a row, CI's loaded machine once ran them one after the other in all 10 epochs).
    # Ten epochs of prox-SVRG without the support Newton step, which would end the run
    # at the solution within them
    monkeypatch.setattr(newton_policy, "MAX_SUPPORT", 0)
    X = sp.random(40000, 2000, density=0.05, random_state=0, format="csr")
    y = X @ np.r_[np.ones(20), np.zeros(1980)] + 0.01
    one = Lasso(alpha=1e-4, tol=1e-12, max_epochs=10, random_state=0, method="ddss")
    two = Lasso(alpha=1e-4, tol=1e-12, max_epochs=10, backend="threads", n_jobs=2,
                kernel=kernel, random_state=0, method="ddss")
    with pytest.warns(ConvergenceWarning):
        one.fit(X, y)
    with pytest.warns(ConvergenceWarning):
        two.fit(X, y)
    assert all(h["staleness_max"] == 0 for h in one.history_)
    records = two.history_[1:]
    assert all(0 <= h["staleness_mean"] <= h["staleness_max"] <= X.shape[0] for h in records)
    assert max(h["staleness_max"] for h in records) >= 1


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("kernel", KERNELS)
def test_one_thread_is_the_serial_solver(kernel):
    X, y = _data(5, "csr", "squared")
    kw = dict(alpha=0.01, tol=1e-8, max_epochs=50, random_state=0)
    a = Lasso(**kw).fit(X, y)
    b = Lasso(backend="threads", n_jobs=1, kernel=kernel, **kw).fit(X, y)
    if kernel == "numba":
        np.testing.assert_array_equal(a.coef_, b.coef_)
        assert a.intercept_ == b.intercept_
    else:   # the native kernel publishes the intercept every 32 steps: same up to rounding
        # (an intercept of -2.7e-4 here, targets of order 1: the coefficients' atol)
        np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-9, atol=1e-12)
        assert a.intercept_ == pytest.approx(b.intercept_, rel=1e-9, abs=1e-11)


def test_an_exception_in_a_thread_reaches_the_caller(monkeypatch):
    X, y = _data(7, "csr", "squared")
    calls = []
    original = serial.SerialInnerLoop.run

    def failing(self, active, x, intercept, *args):
        calls.append(1)
        if len(calls) == 2:
            raise FloatingPointError("bad data reached a kernel")
        return original(self, active, x, intercept, *args)

    monkeypatch.setattr(threads.SerialInnerLoop, "run", failing)
    with pytest.raises(FloatingPointError, match="bad data reached a kernel"):
        Lasso(alpha=0.01, backend="threads", n_jobs=2, kernel="numba",
              max_epochs=20).fit(X, y)


def test_n_jobs_meaning():
    import os
    cores = os.cpu_count()
    assert effective_n_jobs(None) == cores and effective_n_jobs(-1) == cores
    assert effective_n_jobs(3) == 3 and ThreadsInnerLoop(2).n_jobs == 2
    with pytest.raises(ValueError, match="n_jobs == 0"):
        Lasso(backend="threads", n_jobs=0).fit(np.eye(3), np.arange(3.0))
    with pytest.raises(ValueError, match="unknown backend"):
        Lasso(backend="gpu").fit(np.eye(3), np.arange(3.0))


@pytest.mark.parametrize("n_threads", [1, 2, 3, 7])
def test_threaded_margins_and_rmatvec_match_scipy(n_threads, monkeypatch):
    """Split over the threads (every pass, however small: PARALLEL_MIN_ENTRIES 0), the
    margins and A^T r are scipy's."""
    from asyncopt.kernels import linalg
    from asyncopt.kernels.linalg import csr_margins, csr_rmatvec
    monkeypatch.setattr(linalg, "PARALLEL_MIN_ENTRIES", 0)
    X = sp.random(101, 37, density=0.2, random_state=n_threads, format="csr")
    rng = np.random.default_rng(n_threads)
    x, r = rng.standard_normal(37), rng.standard_normal(101)
    indptr = X.indptr.astype(np.int64)
    z = csr_margins(indptr, X.indices, X.data, x, 0.5, np.empty(101), n_threads)
    np.testing.assert_allclose(z, X @ x + 0.5, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(csr_rmatvec(indptr, X.indices, X.data, r, 37, n_threads),
                               X.T @ r, rtol=1e-12, atol=1e-13)


def test_a_pass_over_few_entries_stays_on_the_calling_thread(monkeypatch):
    """``pass_threads``: below PARALLEL_MIN_ENTRIES stored entries a pass runs on one
    thread (no task reaches the pool), at or above it on the threads asked for."""
    from asyncopt.kernels import linalg
    X = sp.random(50, 20, density=0.3, random_state=0, format="csr")
    indptr = X.indptr.astype(np.int64)
    calls = []
    real = linalg.run_in_parallel
    monkeypatch.setattr(linalg, "run_in_parallel",
                        lambda tasks: calls.append(len(tasks)) or real(tasks))
    monkeypatch.setattr(linalg, "PARALLEL_MIN_ENTRIES", X.nnz + 1)
    linalg.csr_rmatvec(indptr, X.indices, X.data, np.ones(50), 20, 4)
    linalg.csr_margins(indptr, X.indices, X.data, np.ones(20), 0.0, np.empty(50), 4)
    assert calls == []
    monkeypatch.setattr(linalg, "PARALLEL_MIN_ENTRIES", X.nnz)
    linalg.csr_rmatvec(indptr, X.indices, X.data, np.ones(50), 20, 4)
    linalg.csr_margins(indptr, X.indices, X.data, np.ones(20), 0.0, np.empty(50), 4)
    assert calls == [4, 4]


def test_lasso_path_on_threads_matches_serial():
    from asyncopt import lasso_path
    X, y = _data(11, "csr", "squared")
    kw = dict(n_alphas=5, eps=1e-2, tol=1e-10, max_epochs=5000, random_state=0)
    alphas, coefs, gaps = lasso_path(X, y, **kw)
    _, coefs_t, gaps_t = lasso_path(X, y, backend="threads", n_jobs=2, **kw)
    problem = Problem(X, y, "squared", None, 1.0, True)
    for k, alpha in enumerate(alphas):
        p = problem.with_lam(alpha)
        assert p.certificate(coefs_t[:, k]).primal == pytest.approx(
            p.certificate(coefs[:, k]).primal, rel=1e-6)
    assert np.all(gaps_t <= 1e-10 * problem.null_objective())

