"""OS-level runtime tuning of asyncopt's solvers, behind one switch.

None of it changes what a solver computes: each piece asks the OS or a library for
better scheduling or memory mapping, and the iterates are the same with it or without
it. Each piece states below why it is there (``benchmarks/notes/runtime.md``).

The switch
----------
``ASYNCOPT_RUNTIME_TUNING`` in the environment, read once when this module is first
imported: unset, empty, ``1`` (or ``true``, ``yes``, ``on``) keeps the tuning on, the
default; ``0`` (or ``false``, ``no``, ``off``) turns all of it off; any other value is a
ValueError when a solve starts (:func:`check_switch`). :func:`tuning_enabled` tells
which. Off, every piece below keeps its signature, and its callers their results, but
makes no request of the OS: no BLAS cap, no huge-page switch, no page touched, no idle
thread, no timer slack. Under MPI set it in every rank's environment (``mpirun -genv
ASYNCOPT_RUNTIME_TUNING 0``).

The pieces
----------
- :func:`available_cores`, :func:`blas_threads_beside`: the cores this process may run
  on, and the BLAS threads each of several workers of one machine may use. Arithmetic,
  not tuning: the switch leaves them alone.
- :func:`blas_threads`: caps the BLAS libraries' thread pools for a block and restores
  them after; never raises a pool. Why: idle OpenBLAS threads spin on the cores the
  solvers' own threads or ranks compute on.
- :func:`small_pages`, :func:`in_small_pages`: numpy asks for no transparent huge pages
  on the arrays allocated in a block, then gets its own setting back. Why: the first
  touch of a huge page can stall in the kernel's compaction.
- :func:`touch_pages`, :func:`touch_lower_triangle`: map an array's pages now by writing
  one zero byte into each page (and into each row's first byte, for the triangle); the
  caller treats the contents as undefined, as those of ``np.empty``. Why: the page faults
  are taken where a core would otherwise wait, not in the first write that needs them.
- :class:`IdlePageToucher`: the same for arrays made and touched on a thread that runs
  only on an otherwise idle core (SCHED_IDLE), taken back within a bounded wait. Why: a
  caller that needs the arrays later does not take their page faults itself.
- :func:`fine_timer_slack`: the calling thread's sleeps (and those of the threads it
  starts later) end within 1 us of their time (Linux's timer slack). Why: a wait that
  sleeps between checks sees its message sooner.
"""
import contextlib
import ctypes
import functools
import os
import threading

import numpy as np
from numba import njit

TUNING_ENV = "ASYNCOPT_RUNTIME_TUNING"
_ON, _OFF = ("", "1", "true", "yes", "on"), ("0", "false", "no", "off")
PR_SET_TIMERSLACK, TIMER_SLACK_NS = 29, 1000
PAGE_BYTES = 4096


def tuning_from_env(environ=None):
    """Whether ``environ`` (``os.environ`` by default) leaves the tuning on: its
    ASYNCOPT_RUNTIME_TUNING unset or one of "", "1", "true", "yes", "on" (any case), off
    for "0", "false", "no", "off"; ValueError for anything else."""
    value = (os.environ if environ is None else environ).get(TUNING_ENV, "")
    value = value.strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{TUNING_ENV}={value!r}: expected 1 (tuning on) or 0 (off)")
    return value in _ON


try:
    _TUNING, _SWITCH_ERROR = tuning_from_env(), None
except ValueError as _exc:     # raised where a solve starts (check_switch), not at import
    _TUNING, _SWITCH_ERROR = True, str(_exc)


def tuning_enabled():
    """Whether the runtime tuning is on: ASYNCOPT_RUNTIME_TUNING as read at import."""
    return _TUNING


def check_switch():
    """Raise the ValueError of an ASYNCOPT_RUNTIME_TUNING value ``tuning_from_env``
    refused at import; every solve calls it as it starts, so that importing asyncopt
    never fails and the command line reports the value in one line."""
    if _SWITCH_ERROR is not None:
        raise ValueError(_SWITCH_ERROR)


def available_cores():
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def blas_threads_beside(workers, cores=None):
    """The BLAS threads each of ``workers`` threads or processes of this machine may use
    so that together they do not exceed its cores: cores // workers, at least 1; None
    (no limit) for a single worker. ``cores``: this process's (``available_cores``) by
    default."""
    if workers <= 1:
        return None
    return max(1, int(available_cores() if cores is None else cores) // int(workers))


_CONTROLLER = []     # threadpoolctl's controller, made once (``_blas_pools``)
# per thread, the caps of its ``blas_threads`` blocks open now, innermost last
_BLAS_CAPS = threading.local()


def _blas_pools():
    """threadpoolctl's BLAS pools (numpy's and scipy's): the libraries are scanned once a
    process (a scan costs ~0.7 ms, as much as a small solve's outer iteration), after
    scipy.linalg is imported so that its OpenBLAS is among them."""
    if not _CONTROLLER:
        import scipy.linalg  # noqa: F401  (loads scipy's BLAS before the scan)
        from threadpoolctl import ThreadpoolController
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].select(user_api="blas")


@contextlib.contextmanager
def blas_threads(limit):
    """Run the block with the BLAS libraries' thread pools (numpy's and scipy's OpenBLAS,
    MKL, BLIS: threadpoolctl) limited to ``limit`` threads each, or to the fewest any of
    them had, then put them back. ``limit`` None, or the tuning off, leaves them as they
    are, and so does a block inside another whose cap is at most ``limit`` (the pools
    are capped already; blocks of one thread): a path of solves enters the cap once, its
    solves at no cost.

    The solvers that compute on several threads or ranks of one machine run inside it:
    after a call that used several threads, OpenBLAS's worker threads keep spinning on
    the cores where the solver's own threads or ranks compute. scikit-learn limits BLAS
    around its OpenMP loops the same way."""
    caps = _BLAS_CAPS.__dict__.setdefault("open", [])
    if limit is None or not _TUNING or (caps and caps[-1] <= int(limit)):
        yield
        return
    pools = _blas_pools()
    # a cap, never a raise: the pools keep fewer threads where the user asked for fewer
    # (OPENBLAS_NUM_THREADS=1 in a rank's environment)
    counts = [pool.num_threads for pool in pools.lib_controllers]
    cap = max(1, min([int(limit)] + counts))
    with pools.limit(limits=cap):
        caps.append(cap)
        try:
            yield
        finally:
            caps.pop()


@contextlib.contextmanager
def small_pages():
    """Run the block with numpy asking the kernel for no huge pages on the large arrays it
    allocates (``madvise(MADV_HUGEPAGE)`` above 4 MB, numpy's default on Linux), then
    restore numpy's setting, also when the block raises; with the tuning off, numpy's
    setting is left alone. Arrays made before the block keep their pages.

    Where transparent huge pages are granted on request (``enabled`` and ``defrag`` of
    ``/sys/kernel/mm/transparent_hugepage`` at madvise), the first touch of such an array
    can stall in the kernel's compaction. Dis-DDSS runs in it (``solve_mpi``); serial
    DDSS, which allocates the same arrays again and again in one process, runs without."""
    if not _TUNING:
        yield
        return
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:          # pragma: no cover - another numpy layout
        yield
        return
    before = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(before)


def in_small_pages(solver):
    """``solver`` run inside ``small_pages`` (a decorator for the solvers' entry points;
    the wrapper keeps the solver's name and docstring)."""
    @functools.wraps(solver)
    def run(*args, **kwargs):
        with small_pages():
            return solver(*args, **kwargs)
    return run


@njit(cache=True, nogil=True)
def _touch_pages(memory, stop):
    for k in range(0, memory.shape[0], PAGE_BYTES):
        if stop is not None and k % (64 * PAGE_BYTES) == 0 and stop[0] != 0:
            return k
        memory[k] = 0
    return memory.shape[0]


def touch_pages(memory, stop=None):
    """Write a zero into the first byte of every 4 kB page of ``memory`` (uint8; an
    array's ``view(np.uint8)``), so that the OS maps each page now rather than at the
    first write of whatever fills the array later; nothing else of ``memory`` changes.
    ``stop`` (uint8, one element): once another thread sets it non-zero, return (checked
    every 64 pages; the kernel holds no GIL). Returns the bytes passed: up to where it
    stopped, 0 with the tuning off (nothing written)."""
    if not _TUNING:
        return 0
    return _touch_pages(memory, stop)


@njit(cache=True)
def _touch_lower_triangle(memory, dim):
    for j in range(dim):
        start = j * dim * 8
        end = start + (j + 1) * 8
        memory[start] = 0
        page = (start // PAGE_BYTES + 1) * PAGE_BYTES
        while page < end:
            memory[page] = 0
            page += PAGE_BYTES


def touch_lower_triangle(memory, dim):
    """``touch_pages`` for the pages of a C-ordered dim x dim float64 matrix (``memory``:
    its bytes, flat) that hold its lower triangle, row j's first j + 1 entries: a zero
    into the first byte of each row and of each page that begins within those entries,
    so exactly the pages the triangle lies in are mapped (more than half of them, as a
    page often holds the end of one row and the start of the next). With the tuning off,
    nothing is written."""
    if _TUNING:
        _touch_lower_triangle(memory, dim)


class IdlePageToucher:
    """The arrays ``make()`` returns, their pages mapped (``touch_pages``) on a thread
    that runs only on a core nothing else wants (SCHED_IDLE where the OS has it), for a
    caller that needs them later and would otherwise take their page faults itself.

    ``take(wait)`` waits for the thread at most ``wait`` seconds (a machine busy with
    other work may starve it indefinitely), stops it (within 64 pages) and returns the
    arrays if every page was mapped, else None, and the caller makes its own; the thread
    touches nothing after it finishes, so arrays it returns are the caller's alone. With
    the tuning off no thread starts, ``make`` is not called, and ``take`` returns None."""

    def __init__(self, make):
        self._stop = np.zeros(1, dtype=np.uint8)
        self._finished = []
        self._thread = None
        if _TUNING:
            self._thread = threading.Thread(target=self._run, args=(make,), daemon=True)
            self._thread.start()

    def _run(self, make):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            pass
        arrays = make()
        for array in arrays:
            memory = array.reshape(-1).view(np.uint8)
            if touch_pages(memory, self._stop) < memory.shape[0]:
                return
        self._finished.append(arrays)

    def take(self, wait):
        if self._thread is not None:
            self._thread.join(wait)
        self._stop[0] = 1
        return self._finished[0] if self._finished else None


@functools.lru_cache(maxsize=None)
def _libc():
    """This process's C library through ctypes (prctl), loaded once."""
    return ctypes.CDLL(None, use_errno=True)


def fine_timer_slack():
    """Let the calling thread's sleeps, and those of the threads it starts later, end
    within 1 us (TIMER_SLACK_NS) of their time (Linux's timer slack,
    ``prctl(PR_SET_TIMERSLACK)``; 50 us by default); elsewhere, or with the tuning off,
    nothing. A wait that sleeps between checks (``comm.wire.poll``) then sees its
    message up to 50 us sooner."""
    if not _TUNING:
        return
    try:
        _libc().prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
    except (AttributeError, OSError):
        pass
