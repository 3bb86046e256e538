"""The threads backend (Sha-DDSS, thesis Algorithm 4, DESIGN 3).

T Python threads run the numba inner-loop kernels (compiled with ``nogil=True``, so they
execute truly in parallel) on disjoint slices of the epoch's rows, all writing the same
shared x lock-free (Hogwild). Each thread keeps a private copy of the intercept for the
epoch; their deltas are added to the shared intercept when the epoch ends (the outer loop
then refits it exactly). An exception in any thread reaches the caller once all threads
have returned; no thread waits on another, so nothing can hang.
"""
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..kernels import native
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

    kernel: "native" (native/svrg.c on OpenMP threads, coordinate-wise compare-and-swap
    updates of x), "numba" (nogil numba kernels on Python threads) or "auto" (native when
    it was built, else numba).
    """

    name = "threads"

    def __init__(self, n_jobs=None, kernel="auto"):
        self.n_jobs = effective_n_jobs(n_jobs)
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}: expected one of {KERNELS}")
        if kernel == "native" and not native.available():
            raise ValueError(f"the native kernel is not available ({native.LOAD_ERROR})")
        self.kernel = "native" if kernel == "auto" and native.available() else \
            ("numba" if kernel == "auto" else kernel)
        self._serial = SerialInnerLoop()

    def run(self, active, x, intercept, eta_intercept, z_snap, weighted_mu, mu_intercept,
            thresholds, eta, samples, variance_reduced):
        """Update x and intercept in place; returns the staleness (mean, max) over all
        steps: tau = steps other threads finished between a step's read of x and its write,
        counted on a shared step clock (a racy counter: a count lost to a race only makes
        tau look smaller by one)."""
        if self.kernel == "native":
            return self._run_native(active, x, intercept, eta_intercept, z_snap, weighted_mu,
                                    mu_intercept, thresholds, eta, samples,
                                    variance_reduced)
        parts = np.array_split(samples, self.n_jobs)
        if self.n_jobs == 1:
            return self._serial.run(active, x, intercept, eta_intercept, z_snap, weighted_mu,
                                    mu_intercept, thresholds, eta, samples,
                                    variance_reduced)
        private = [intercept.copy() for _ in parts]
        clock = np.zeros(1, dtype=np.int64)
        staleness = np.zeros((len(parts), 2), dtype=np.int64)
        with ThreadPoolExecutor(max_workers=self.n_jobs) as pool:
            futures = [pool.submit(self._serial.run, active, x, own, eta_intercept, z_snap,
                                   weighted_mu, mu_intercept, thresholds, eta, part,
                                   variance_reduced, clock, staleness[t])
                       for t, (own, part) in enumerate(zip(private, parts))]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
        intercept[0] += sum(own[0] - intercept[0] for own in private)
        mean = float(staleness[:, 0].sum()) / max(len(samples), 1)
        return mean, int(staleness[:, 1].max())

    def run_dense(self, active, x, intercept, eta_intercept, z_snap, mu, mu_intercept,
                  thresholds, eta, samples):
        """One ProxASVRG epoch (dense steps) on n_jobs numba threads sharing x."""
        parts = np.array_split(samples, self.n_jobs)
        own_b = [intercept.copy() for _ in parts]
        with ThreadPoolExecutor(max_workers=self.n_jobs) as pool:
            futures = [pool.submit(self._serial.run_dense, active, x, b, eta_intercept,
                                   z_snap, mu, mu_intercept, thresholds, eta, part)
                       for b, part in zip(own_b, parts)]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
        intercept[0] += sum(b[0] - intercept[0] for b in own_b)
        return 0.0, 0

    def run_saga(self, active, x, intercept, eta_intercept, memory, average,
                 average_intercept, reweight, thresholds, eta, samples):
        """One ProxASAGA epoch on n_jobs numba threads sharing x, the gradient memory (rows
        are disjoint between threads) and its average; intercepts private, deltas summed."""
        parts = np.array_split(samples, self.n_jobs)
        own_b = [intercept.copy() for _ in parts]
        own_avg = [average_intercept.copy() for _ in parts]
        with ThreadPoolExecutor(max_workers=self.n_jobs) as pool:
            futures = [pool.submit(self._serial.run_saga, active, x, b, eta_intercept, memory,
                                   average, avg, reweight, thresholds, eta, part)
                       for b, avg, part in zip(own_b, own_avg, parts)]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
        intercept[0] += sum(b[0] - intercept[0] for b in own_b)
        average_intercept[0] += sum(a[0] - average_intercept[0] for a in own_avg)
        return 0.0, 0

    def _run_native(self, active, x, intercept, eta_intercept, z_snap, weighted_mu,
                    mu_intercept, thresholds, eta, samples, variance_reduced):
        staleness = np.zeros(2, dtype=np.int64)
        args = (active.indptr, active.indices, active.data, active.y,
                active.problem.loss.code, x, intercept, eta_intercept, z_snap, weighted_mu,
                mu_intercept, thresholds, eta, samples, variance_reduced,
                np.zeros(1, dtype=np.int64), staleness)
        if active.penalty.is_l1:
            native.native_epoch_l1(*args, n_threads=self.n_jobs)
        else:
            native.native_epoch_group(*args, active.block_indptr, active.feature_block,
                                      n_threads=self.n_jobs)
        return float(staleness[0]) / max(len(samples), 1), int(staleness[1])
