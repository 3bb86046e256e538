"""The threads backend (Sha-DDSS, thesis Algorithm 4, docs/design.md §3).

T Python threads run the numba inner-loop kernels (compiled with ``nogil=True``, so they
execute truly in parallel) on disjoint slices of the epoch's rows, all writing the same
shared x lock-free (Hogwild). The SVRG kernels share the intercept too, each thread
publishing its delta every few steps (kernels/svrg.py); the baselines' kernels keep a
private intercept per thread for the epoch and their deltas are added when it ends
(the outer loop then refits the intercept exactly). An exception in any thread reaches
the caller once all threads have returned; no thread waits on another, so nothing can
hang. The threads come from a persistent pool (kernels/linalg.run_in_parallel), the
calling thread taking the first slice.
"""
import os
import numpy as np

from ..kernels import native
from ..kernels.linalg import run_in_parallel
from ..kernels.workspace import Clock
from .serial import SerialInnerLoop

KERNELS = ("auto", "native", "numba")


def effective_n_jobs(n_jobs):
    """n_jobs as a thread count: None or -1 -> all cores, -k -> cores + 1 - k."""
    cores = os.cpu_count() or 1
    if n_jobs is None:
        return cores
    n_jobs = int(n_jobs)
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 has no meaning: use a positive count or -1")
    return max(1, cores + 1 + n_jobs) if n_jobs < 0 else n_jobs


class ThreadsInnerLoop:
    """Runs one inner epoch on ``n_jobs`` threads sharing x (Hogwild).

    kernel: "numba" (nogil numba kernels on Python threads: plain racing stores to x),
    "native" (native/svrg.c on OpenMP threads, every write of x a compare-and-swap) or
    "auto" = "numba", the default because the racing stores beat the native kernel's
    compare-and-swap (benchmarks/notes/frontends.md).
    """

    name = "threads"

    def __init__(self, n_jobs=None, kernel="auto"):
        self.n_jobs = effective_n_jobs(n_jobs)
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}: expected one of {KERNELS}")
        if kernel == "native" and not native.available():
            raise ValueError(f"the native kernel is not available ({native.LOAD_ERROR})")
        self.kernel = "numba" if kernel == "auto" else kernel
        self._serial = SerialInnerLoop()

    def run(self, active, x, intercept, step, samples):
        """One prox-SVRG epoch at the ``workspace.SvrgStep`` ``step``; returns the
        staleness (mean, max) over all steps: tau = steps other threads finished between
        a step's read of x and its write, counted on a shared step clock a window of
        CLOCK_SYNC steps at a time (``kernels.svrg.tick``: the mean as it is, the max an
        upper bound; a racy counter, so a count lost to a race only makes tau look
        smaller)."""
        if self.kernel == "native":
            return self._run_native(active, x, intercept, step, samples)
        if self.n_jobs == 1:
            return self._serial.run(active, x, intercept, step, samples)
        steps = np.zeros(1, dtype=np.int64)
        # a 64-byte row per thread: counters of two threads on one cache line would move
        # it between their cores at every window
        staleness = np.zeros((self.n_jobs, 8), dtype=np.int64)
        self._on_threads(
            lambda t, rows, own: self._serial.run(active, x, intercept, step, rows,
                                                  Clock(steps, staleness[t, :2])),
            samples, [])
        mean = float(staleness[:, 0].sum()) / max(len(samples), 1)
        return mean, int(staleness[:, 1].max())

    def run_dense(self, active, x, intercept, step, samples):
        """One ProxASVRG epoch (dense steps) on n_jobs numba threads sharing x."""
        self._on_threads(
            lambda t, rows, own: self._serial.run_dense(active, x, own[0], step, rows),
            samples, [intercept])
        return 0.0, 0

    def run_saga(self, active, x, intercept, step, samples):
        """One ProxASAGA epoch on n_jobs numba threads sharing x, the gradient memory (rows
        are disjoint between threads) and its average; intercepts private, deltas summed."""
        self._on_threads(
            lambda t, rows, own: self._serial.run_saga(
                active, x, own[0], step._replace(average_intercept=own[1]), rows),
            samples, [intercept, step.average_intercept])
        return 0.0, 0

    def run_cd(self, columns, active, x, z, intercept, column_means, order, block_lipschitz,
               thresholds):
        """One pass of asynchronous block coordinate descent (PSE): thread t updates its
        slice of ``order`` (disjoint blocks, so x has one writer per coordinate) and adds
        to the shared margins z and intercept lock-free (numba kernel whatever ``kernel``
        is)."""
        self._on_threads(
            lambda t, blocks, own: self._serial.run_cd(
                columns, active, x, z, intercept, column_means, blocks, block_lipschitz,
                thresholds),
            order, [])
        return 0.0, 0

    def _on_threads(self, run_slice, samples, scalars):
        """Run ``run_slice(t, rows, own)`` on thread t for its slice of ``samples``
        (numpy.array_split), ``own`` being private copies of the length-1 arrays in
        ``scalars``; once every thread has returned, re-raise the first error, then add
        each thread's delta to every scalar."""
        parts = np.array_split(samples, self.n_jobs)
        own = [[scalar.copy() for scalar in scalars] for _ in parts]
        run_in_parallel([lambda t=t, rows=rows: run_slice(t, rows, own[t])
                         for t, rows in enumerate(parts)])
        for k, scalar in enumerate(scalars):
            scalar[0] += sum(mine[k][0] - scalar[0] for mine in own)

    def _run_native(self, active, x, intercept, step, samples):
        clock = Clock.fresh()
        active.penalty.native_kernel()(active.kernel_rows(), active.kernel_blocks(), step,
                                       x, intercept, samples, clock, n_threads=self.n_jobs)
        return float(clock.staleness[0]) / max(len(samples), 1), int(clock.staleness[1])
