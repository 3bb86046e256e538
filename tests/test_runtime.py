"""asyncopt.runtime: the OS-level tuning and its one switch (ASYNCOPT_RUNTIME_TUNING)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from asyncopt import Lasso, runtime
from asyncopt.penalties import L1
from asyncopt.problem import Problem
from asyncopt.solvers.ddss import solve_ddss
from asyncopt.solvers.threads import ThreadsInnerLoop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def tuning_on(monkeypatch):
    monkeypatch.setattr(runtime, "_TUNING", True)


@pytest.fixture
def tuning_off(monkeypatch):
    monkeypatch.setattr(runtime, "_TUNING", False)


def blas_pools():
    from threadpoolctl import threadpool_info
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def madvise_hugepage():
    """numpy's huge-page madvise setting, left as it was."""
    from numpy._core.multiarray import _set_madvise_hugepage
    setting = _set_madvise_hugepage(True)
    _set_madvise_hugepage(setting)
    return setting


@pytest.fixture
def set_madvise_hugepage():
    """numpy's switch of its huge-page setting; the test's own setting is put back."""
    from numpy._core.multiarray import _set_madvise_hugepage
    numpys = madvise_hugepage()
    yield _set_madvise_hugepage
    _set_madvise_hugepage(numpys)


def small_lasso_data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((120, 30))
    w = np.zeros(30)
    w[:5] = rng.standard_normal(5)
    return X, X @ w + 0.1 * rng.standard_normal(120)


def small_lasso_coef():
    X, y = small_lasso_data()
    return Lasso(alpha=0.05, tol=1e-10, max_epochs=500, random_state=0).fit(X, y).coef_


def _small_lasso():
    """A 300 x 40 sparse Lasso at 0.1 lam_max."""
    rng = np.random.default_rng(0)
    X = sp.random(300, 40, density=0.2, random_state=0, format="csr")
    problem = Problem(X, X @ rng.standard_normal(40), "squared", lam=1.0)
    return problem.with_lam(0.1 * problem.lam_max())


def test_the_switch_reads_on_off_or_refuses_anything_else():
    """ASYNCOPT_RUNTIME_TUNING: unset, "", 1, true, yes, on (any case, spaces around) on;
    0, false, no, off off; anything else a ValueError; tuning_enabled gives what the
    environment said at import."""
    for value in ("", "1", " On ", "TRUE", "yes"):
        assert runtime.tuning_from_env({runtime.TUNING_ENV: value}) is True
    assert runtime.tuning_from_env({}) is True
    for value in ("0", "off", " False ", "NO"):
        assert runtime.tuning_from_env({runtime.TUNING_ENV: value}) is False
    for value in ("2", "disable"):
        with pytest.raises(ValueError, match=runtime.TUNING_ENV):
            runtime.tuning_from_env({runtime.TUNING_ENV: value})
    assert runtime.tuning_enabled() is runtime.tuning_from_env()


def test_a_process_started_with_tuning_off_solves_to_the_same_coef(tmp_path, tuning_on):
    """ASYNCOPT_RUNTIME_TUNING=0 in a new process's environment turns the tuning off
    there, and its Lasso fit gives the coef of this process's, bit for bit."""
    script = ("import numpy as np, sys; sys.path.insert(0, 'tests'); "
              "from asyncopt import runtime; from test_runtime import small_lasso_coef; "
              "assert not runtime.tuning_enabled(); "
              "np.save(sys.argv[1], small_lasso_coef())")
    path = tmp_path / "coef.npy"
    env = dict(os.environ, **{runtime.TUNING_ENV: "0"})
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, env=env,
                   check=True, timeout=300)
    off = np.load(path)
    on = small_lasso_coef()
    assert np.count_nonzero(on) > 0
    np.testing.assert_array_equal(off, on)


def test_blas_pools_are_limited_while_threads_or_ranks_compute(monkeypatch, tuning_on):
    """blas_threads: inside, every BLAS library's pool has the limit, or what it had where
    that was fewer; after, what it had before. solve_ddss on T threads runs with
    cores // T BLAS threads (OpenBLAS's idle workers spin on the cores the solver's
    threads use), on one thread with one (a serial solve is one core; a multi-threaded
    factorization of a small Newton system there only competes with other processes)."""
    from threadpoolctl import threadpool_limits

    assert runtime.blas_threads_beside(1) is None
    assert runtime.blas_threads_beside(3, cores=16) == 5
    assert runtime.blas_threads_beside(9, cores=2) == 1
    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_pools() and set(blas_pools()) == {2}
        with runtime.blas_threads(1):
            assert set(blas_pools()) == {1}
        assert set(blas_pools()) == {2}
        with runtime.blas_threads(8):   # never more than the user's own limit
            assert set(blas_pools()) == {2}
        with runtime.blas_threads(None):
            assert set(blas_pools()) == {2}
        problem = _small_lasso()
        monkeypatch.setattr(runtime, "available_cores", lambda: 4)
        for threads, expected in ((2, {2}), (4, {1}), (1, {1})):
            seen = []
            solve_ddss(problem, tol=1e-8, max_epochs=3, random_state=0,
                       inner_loop=ThreadsInnerLoop(n_jobs=threads),
                       callback=lambda record: seen.append(set(blas_pools())))
            assert seen and all(pools == expected for pools in seen)
        assert set(blas_pools()) == {2}


def test_a_block_inside_a_tighter_cap_keeps_it(monkeypatch, tuning_on):
    """blas_threads inside a block whose cap is at most its limit leaves the pools at
    that cap, inside and after it (no set and restore of its own), a looser outer cap
    is tightened and given back; lasso_path's solves run under the path's one cap."""
    from threadpoolctl import threadpool_limits

    from asyncopt import lasso_path

    with threadpool_limits(limits=2, user_api="blas"):
        with runtime.blas_threads(1):
            calls = []
            monkeypatch.setattr(runtime, "_blas_pools",
                                lambda: calls.append(1) or pytest.fail("pools reset"))
            with runtime.blas_threads(1):
                assert set(blas_pools()) == {1}
            with runtime.blas_threads(4):
                assert set(blas_pools()) == {1}
            assert set(blas_pools()) == {1} and not calls
            monkeypatch.undo()
        with runtime.blas_threads(2):
            with runtime.blas_threads(1):
                assert set(blas_pools()) == {1}
            assert set(blas_pools()) == {2}
        problem = _small_lasso()
        seen = []
        real = runtime.blas_threads

        def watched(limit):
            seen.append(set(blas_pools()))
            return real(limit)
        monkeypatch.setattr(runtime, "blas_threads", watched)
        # method "ddss": the Driver's solves (the Lasso's default path is compiled)
        lasso_path(problem.X, problem.y, n_alphas=4, method="ddss", random_state=0)
        assert len(seen) == 4 and all(pools == {1} for pools in seen)
        assert set(blas_pools()) == {2}


def test_with_tuning_off_the_blas_pools_are_left_alone(monkeypatch, tuning_off):
    """Off: blas_threads(1) leaves every pool's count as it was, inside and after, and so
    does solve_ddss on 4 threads of 4 cores (on: one BLAS thread each)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_pools() and set(blas_pools()) == {2}
        with runtime.blas_threads(1):
            assert set(blas_pools()) == {2}
        assert set(blas_pools()) == {2}
        problem = _small_lasso()
        monkeypatch.setattr(runtime, "available_cores", lambda: 4)
        seen = []
        solve_ddss(problem, tol=1e-8, max_epochs=3, random_state=0,
                   inner_loop=ThreadsInnerLoop(n_jobs=4),
                   callback=lambda record: seen.append(set(blas_pools())))
        assert seen and all(pools == {2} for pools in seen)
        assert set(blas_pools()) == {2}


def test_with_tuning_off_a_lasso_fit_gives_the_same_coef(monkeypatch):
    """The same Lasso fit with the tuning on and off: the same coef, bit for bit."""
    monkeypatch.setattr(runtime, "_TUNING", True)
    on = small_lasso_coef()
    monkeypatch.setattr(runtime, "_TUNING", False)
    off = small_lasso_coef()
    assert np.count_nonzero(on) > 0
    np.testing.assert_array_equal(off, on)


def test_solve_mpi_allocates_without_huge_pages_and_puts_numpy_back(tuning_on,
                                                                    set_madvise_hugepage):
    """small_pages: inside, numpy asks for no huge pages (its madvise switch off); after,
    numpy's own setting again, also when the block raises. solve_mpi runs in it
    (``in_small_pages`` keeps its name and docstring)."""
    from asyncopt.solvers.mpi import solve_mpi

    for before in (True, False):
        set_madvise_hugepage(before)
        with runtime.small_pages():
            assert madvise_hugepage() is False
        assert madvise_hugepage() is before
        with pytest.raises(RuntimeError), runtime.small_pages():
            raise RuntimeError
        assert madvise_hugepage() is before
    set_madvise_hugepage(True)
    seen = []
    wrapped = runtime.in_small_pages(lambda: seen.append(madvise_hugepage()) or 7)
    assert wrapped() == 7 and seen == [False] and madvise_hugepage() is True
    assert solve_mpi.__name__ == "solve_mpi" and "Dis-DDSS" in solve_mpi.__doc__
    assert solve_mpi.__wrapped__.__name__ == "solve_mpi"


def test_with_tuning_off_numpy_keeps_its_huge_page_setting(tuning_off, set_madvise_hugepage):
    """Off: inside small_pages (and a solver wrapped in it) numpy's setting is its own."""
    for before in (True, False):
        set_madvise_hugepage(before)
        with runtime.small_pages():
            assert madvise_hugepage() is before
        seen = []
        assert runtime.in_small_pages(lambda: seen.append(madvise_hugepage()))() is None
        assert seen == [before] and madvise_hugepage() is before


def test_page_touching_writes_zeros_at_page_starts_only_and_nothing_when_off(monkeypatch):
    """On: touch_pages zeroes the first byte of every 4 kB page and nothing else, and
    returns the bytes passed; touch_lower_triangle zeroes row starts and page starts
    only. Off: both write nothing, touch_pages returns 0."""
    monkeypatch.setattr(runtime, "_TUNING", True)
    memory = np.ones(5 * 4096 + 100, dtype=np.uint8)
    assert runtime.touch_pages(memory) == memory.shape[0]
    assert np.array_equal(np.flatnonzero(memory == 0), np.arange(0, memory.shape[0], 4096))
    square = np.ones(300 * 300 * 8, dtype=np.uint8)
    runtime.touch_lower_triangle(square, 300)
    zeros = np.flatnonzero(square == 0)
    assert np.all((zeros % 4096 == 0) | (zeros % (300 * 8) == 0))
    assert np.isin(np.arange(300) * 300 * 8, zeros).all()
    monkeypatch.setattr(runtime, "_TUNING", False)
    memory[:] = 1
    square[:] = 1
    assert runtime.touch_pages(memory) == 0
    assert runtime.touch_pages(memory, np.zeros(1, dtype=np.uint8)) == 0
    runtime.touch_lower_triangle(square, 300)
    assert np.all(memory == 1) and np.all(square == 1)


def test_the_idle_toucher_gives_touched_arrays_on_and_starts_nothing_off(monkeypatch):
    """On: take returns make()'s arrays, their pages touched. Off: no thread starts, make
    is never called and take returns None (the caller makes its own)."""
    import threading
    monkeypatch.setattr(runtime, "_TUNING", True)
    made = [np.ones(3 * 4096, dtype=np.uint8), np.ones((10, 1000))]
    toucher = runtime.IdlePageToucher(lambda: made)
    arrays = toucher.take(30.0)
    assert arrays is made and np.all(made[0][::4096] == 0) and made[0][1] == 1
    monkeypatch.setattr(runtime, "_TUNING", False)
    calls, before = [], threading.active_count()
    toucher = runtime.IdlePageToucher(lambda: calls.append(1) or made)
    assert threading.active_count() == before
    assert toucher.take(30.0) is None and calls == []


def test_with_tuning_off_the_epoch_view_is_the_same_without_a_touching_thread(monkeypatch):
    """ActiveSet.touch_view_buffers with the tuning off starts no thread; the first epoch
    view then has the rows of one formed with the tuning on, or without touching."""
    from asyncopt.data import make_ctr
    X, y = make_ctr(2000, 400, nnz_per_row=10, random_state=0)[:2]
    thresholds = np.full(400, np.inf)
    thresholds[:40] = 0.0

    def view(touch):
        active = Problem(X, y, "squared", L1(400), 0.01, True).full_active_set()
        if touch:
            active.touch_view_buffers()
            assert (active._touching._thread is not None) is runtime.tuning_enabled()
        rows = active.without_frozen(thresholds)
        assert rows is not active
        return rows.indptr.copy(), rows.indices.copy(), rows.data.copy()

    plain = view(False)
    monkeypatch.setattr(runtime, "_TUNING", True)
    on = view(True)
    monkeypatch.setattr(runtime, "_TUNING", False)
    off = view(True)
    for got_on, got_off, want in zip(on, off, plain):
        np.testing.assert_array_equal(got_on, want)
        np.testing.assert_array_equal(got_off, want)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's timer slack")
def test_fine_timer_slack_sets_1us_on_and_leaves_the_slack_off(monkeypatch):
    """On: this thread's timer slack becomes TIMER_SLACK_NS (prctl GET); off: it stays."""
    import ctypes
    prctl = ctypes.CDLL(None).prctl
    saved = prctl(30, 0, 0, 0, 0)                                     # PR_GET_TIMERSLACK
    try:
        prctl(runtime.PR_SET_TIMERSLACK, 50_000, 0, 0, 0)
        monkeypatch.setattr(runtime, "_TUNING", False)
        runtime.fine_timer_slack()
        assert prctl(30, 0, 0, 0, 0) == 50_000
        monkeypatch.setattr(runtime, "_TUNING", True)
        runtime.fine_timer_slack()
        assert prctl(30, 0, 0, 0, 0) == runtime.TIMER_SLACK_NS
    finally:
        prctl(runtime.PR_SET_TIMERSLACK, saved, 0, 0, 0)


def test_a_bad_switch_value_fails_the_solve_in_one_line_not_the_import():
    """ASYNCOPT_RUNTIME_TUNING=2: ``import asyncopt`` still works, and the command line's
    solve stops with one line naming the variable and a non-zero status."""
    env = dict(os.environ, **{runtime.TUNING_ENV: "2"}, PYTHONPATH=ROOT)
    imported = subprocess.run([sys.executable, "-c", "import asyncopt.estimators"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    run = subprocess.run([sys.executable, "-m", "asyncopt.cli.lasso", "--backend", "serial",
                          "--max-epochs", "2"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith("asyncopt-lasso: error: ") and runtime.TUNING_ENV in lines[0]
