"""Thread-runtime benchmark: which runtime drives DDSS's Hogwild inner epoch fastest?

Measures the wall time of ONE inner epoch of sparse prox-SVRG (Lasso, L1, the tracked
kernels) on T threads sharing x, driven three ways:

  python_threads  ThreadsInnerLoop(n_jobs=T, kernel="numba"): a ThreadPoolExecutor started
                  per epoch, each Python thread running the nogil numba kernel on its
                  np.array_split slice of the rows (the "threads" backend today; at T=1 it
                  calls the untracked serial kernel directly, no pool).
  numba_parallel  ``numba_parallel_epoch`` below: one @njit(parallel=True, nogil=True) call
                  whose ``prange(T)`` runs the same tracked kernel (svrg_epoch_l1_tracked)
                  on the same slices, each slice with a private intercept (a (T, 1) array);
                  numba's own thread pool, sized by numba.set_num_threads(T).
  native          ThreadsInnerLoop(n_jobs=T, kernel="native"): native/svrg.c on OpenMP
                  threads via ctypes (only when the library is built).

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_runtime.py [--quick]
        [--threads 1 2 4 8] [--repeat 7] [--overhead-samples 64] [--pause 0.1]
        [--start-tol 1e-3] [--output PATH]

Problem: make_ctr(200_000, 100_000, nnz_per_row=30, random_state=0) (``--quick``:
make_ctr(20_000, 10_000, ...)), squared loss + L1 with intercept, lam = 1e-3 lam_max.
The epoch is a realistic one: serial ``solve_ddss(problem, tol=1e-3)`` runs first, then its
end point is screened and compacted exactly like the outer loop does before an epoch
(solvers/ddss.py), and the epoch's arguments (eta, thresholds, weighted_mu, z_snap = cert.z,
samples = epoch_rows(...), one pass over the rows) are built the way ddss.py builds them.
Every timed call starts from a fresh copy of that x and intercept (copied outside the
timer) and visits the same samples.

Reported per driver and T:
  - best-of-N wall time (drivers interleaved inside each repetition, numba compilation
    excluded by a warm-up) and the median. Every timed call comes ``--pause`` seconds
    (0.1) after the previous one: after a parallel region, OpenMP workers (numba's omp
    layer, native/svrg.c) spin for several milliseconds, and on a 2-core machine they
    would take a core from whichever driver runs next (measured: ~+30% CPU, ~+10% wall
    time on the following serial epoch);
  - cpu/wall: process CPU time over wall time summed over the repetitions, about T when
    the T threads really ran side by side (less when the machine's other load took cores);
  - speedup vs the same driver at T=1 and python_threads time / this time at the same T
    (> 1: faster than python_threads);
  - P(x) after the epoch (certificate on the active set, intercept refitted; mean over the
    repetitions), its relative difference from the deterministic python_threads T=1 epoch,
    its decrease P_before - P_after over that epoch's decrease (about 1 for a sound driver)
    and the relative gap after the epoch, so that a broken driver shows.
A second table gives each driver's per-call overhead: the best-of-N mean time of a call on
a tiny epoch (``--overhead-samples`` rows, default 64), mostly the runtime's start-up cost
(a new thread pool, a parallel region, ctypes). Before and after the timings a
compute-bound probe measures how many cores T threads really get (T on an idle machine
with >= T cores), so that a shared, busy machine is visible in the results.
"""
import argparse
import os
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="make_ctr(20_000, 10_000, ...) instead of 200_000 x 100_000")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=7, help="best of N (default 7)")
    parser.add_argument("--overhead-samples", type=int, default=64)
    parser.add_argument("--overhead-calls", type=int, default=20,
                        help="calls averaged per overhead repetition (default 20)")
    parser.add_argument("--pause", type=float, default=0.1,
                        help="seconds slept before every timed call (default 0.1), so that "
                             "the OpenMP workers of the previous call stop spinning")
    parser.add_argument("--start-tol", type=float, default=1e-3,
                        help="tol of the serial solve giving the start point (default 1e-3)")
    parser.add_argument("--output", default=None)
    return parser.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and "NUMBA_NUM_THREADS" not in os.environ:
    # numba.set_num_threads(T) needs T <= NUMBA_NUM_THREADS, fixed when numba is imported
    os.environ["NUMBA_NUM_THREADS"] = str(max(max(ARGS.threads), os.cpu_count() or 1))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

# the repository root, after PYTHONPATH (so PYTHONPATH can point at another asyncopt tree)
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402

from asyncopt.data import make_ctr  # noqa: E402
from asyncopt.kernels import native  # noqa: E402
from asyncopt.kernels.svrg import svrg_epoch_l1_tracked  # noqa: E402
from asyncopt.kernels.workspace import Clock, SvrgStep  # noqa: E402
from asyncopt.problem import Problem  # noqa: E402
from asyncopt.screening import screen_active_set  # noqa: E402
from asyncopt.solvers import solve_ddss  # noqa: E402
from asyncopt.solvers.ddss import epoch_rows  # noqa: E402
from asyncopt.solvers.threads import ThreadsInnerLoop  # noqa: E402

DRIVERS = ("python_threads", "numba_parallel", "native")


# --------------------------------------------------------------------------- numba driver

@njit(parallel=True, nogil=True)
def numba_parallel_epoch(rows, blocks, step, x, intercept, samples, bounds, steps, staleness):
    """One Hogwild epoch on numba's thread pool: iteration t of ``prange(T)`` runs the
    tracked kernel on samples[bounds[t]:bounds[t+1]] with its own intercept copy
    (staleness[t] its counters, ``steps`` the shared clock); the intercept deltas are
    summed at the end, as ThreadsInnerLoop does."""
    n_parts = bounds.shape[0] - 1
    own = np.empty((n_parts, 1))
    for t in range(n_parts):
        own[t, 0] = intercept[0]
    for t in prange(n_parts):
        svrg_epoch_l1_tracked(rows, blocks, step, x, own[t],
                              samples[bounds[t]:bounds[t + 1]], Clock(steps, staleness[t]))
    b0 = intercept[0]
    for t in range(n_parts):
        intercept[0] += own[t, 0] - b0


@njit(parallel=True, nogil=True)
def _spin(n_units, n_iter):
    """n_units independent compute-bound loops (no memory traffic) over numba's pool."""
    out = np.zeros(n_units)
    for t in prange(n_units):
        acc = 0.0
        for i in range(n_iter):
            acc += np.sin(i * 1e-3)
        out[t] = acc
    return out


def cpu_capacity(threads, n_iter=5_000_000, repeat=3):
    """{T: cores actually free for T threads} = T * time(1 unit, 1 thread) / time(T units,
    T threads), best of ``repeat``: T on an idle machine with >= T cores, less when other
    processes hold cores (the machine this was written on is shared)."""
    _spin(1, 10)
    out = {}
    for t in threads:
        best = {}
        for units in sorted({1, t}):
            numba.set_num_threads(units)
            best[units] = min(_timed(lambda: _spin(units, n_iter)) for _ in range(repeat))
        out[t] = t * best[1] / best[t]
    return out


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def split_bounds(n, parts):
    """Slice boundaries of numpy.array_split(range(n), parts)."""
    sizes = np.full(parts, n // parts, dtype=np.int64)
    sizes[:n % parts] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


class NumbaParallelLoop:
    """ThreadsInnerLoop.run's signature on top of ``numba_parallel_epoch``."""

    def __init__(self, n_jobs):
        self.n_jobs = n_jobs

    def run(self, active, x, intercept, step, samples):
        numba.set_num_threads(self.n_jobs)
        staleness = np.zeros((self.n_jobs, 2), dtype=np.int64)
        numba_parallel_epoch(active.kernel_rows(), active.kernel_blocks(), step, x,
                             intercept, samples, split_bounds(len(samples), self.n_jobs),
                             np.zeros(1, dtype=np.int64), staleness)
        return float(staleness[:, 0].sum()) / max(len(samples), 1), int(staleness[:, 1].max())


def make_loop(driver, n_jobs):
    if driver == "python_threads":
        return ThreadsInnerLoop(n_jobs=n_jobs, kernel="numba")
    if driver == "numba_parallel":
        return NumbaParallelLoop(n_jobs)
    return ThreadsInnerLoop(n_jobs=n_jobs, kernel="native")


# --------------------------------------------------------------------------- the epoch

def realistic_epoch(problem, tol=1e-3, random_state=0):
    """(active set, x, intercept, epoch kwargs, info): the state serial DDSS reaches at
    ``tol``, screened and compacted, and the arguments of its next inner epoch, built as
    in solvers/ddss.py."""
    t0 = time.perf_counter()
    result = solve_ddss(problem, tol=tol, random_state=random_state)
    solve_seconds = time.perf_counter() - t0
    active = problem.full_active_set()
    x = result.coef[active.features]
    cert = active.certificate(x, result.intercept)
    keep = screen_active_set(active, cert)
    active, x, _ = active.compact(keep, x)
    cert = active.certificate(x, cert.intercept)
    n = problem.n_samples
    eta = 1.0 / (3.0 * problem.loss.lipschitz * max(active.max_row_sq_norm, 1e-300))
    block_reweight = active.reweighting()
    reweight = np.repeat(block_reweight, np.diff(active.block_indptr))
    kwargs = dict(step=SvrgStep(cert.z, -reweight * cert.correlation / n,
                                -float(np.sum(cert.rho)) / n,
                                eta * problem.lam * block_reweight * active.weights, eta,
                                eta * active.intercept_scale_sq),
                  samples=epoch_rows(np.random.default_rng(random_state), n, n))
    info = {"solve_seconds": solve_seconds, "solve_epochs": result.n_iter,
            "solve_rel_gap": result.gap / problem.null_objective(),
            "active_features": active.n_features, "active_nnz": active.nnz,
            "nonzero_coefs": int(np.count_nonzero(x)), "epoch_steps": n,
            "P_before": cert.primal, "rel_gap_before": cert.gap / problem.null_objective()}
    return active, x, np.array([cert.intercept]), kwargs, info


def time_epoch(loop, active, x0, b0, kwargs):
    """(wall seconds, process CPU seconds, x, intercept) of one epoch from fresh copies of
    x0, b0; CPU / wall is how many cores the epoch's threads kept busy on average."""
    x, b = x0.copy(), b0.copy()
    c0, t0 = time.process_time(), time.perf_counter()
    loop.run(active, x, b, **kwargs)
    return time.perf_counter() - t0, time.process_time() - c0, x, b


def time_overhead(loop, active, x0, b0, kwargs, n_samples, calls):
    """Mean seconds per call of an epoch on the first ``n_samples`` samples (on a scratch
    x, not reset between calls)."""
    x, b = x0.copy(), b0.copy()
    tiny = dict(kwargs, samples=np.ascontiguousarray(kwargs["samples"][:n_samples]))
    t0 = time.perf_counter()
    for _ in range(calls):
        loop.run(active, x, b, **tiny)
    return (time.perf_counter() - t0) / calls


# --------------------------------------------------------------------------- main

def log(msg):
    print(msg, flush=True)


def main(args):
    t_start = time.perf_counter()
    drivers = [d for d in DRIVERS if d != "native" or native.available()]
    if not native.available():
        log(f"native kernel unavailable, skipped: {native.LOAD_ERROR}")
    shape = (20_000, 10_000) if args.quick else (200_000, 100_000)
    t0 = time.perf_counter()
    X, y, _ = make_ctr(*shape, nnz_per_row=30, random_state=0)
    log(f"data make_ctr{shape}: nnz {X.nnz:,} ({time.perf_counter() - t0:.1f} s)")
    base = Problem(X, y, "squared", lam=1.0, fit_intercept=True)
    lam_max = base.lam_max()
    problem = base.with_lam(1e-3 * lam_max)
    p0 = problem.null_objective()
    active, x0, b0, kwargs, info = realistic_epoch(problem, args.start_tol)
    log(f"start point: serial solve_ddss(tol={args.start_tol:g}) "
        f"{info['solve_seconds']:.1f} s, {info['solve_epochs']} epochs; "
        f"active set {info['active_features']:,} features, "
        f"nnz {info['active_nnz']:,}; epoch of {info['epoch_steps']:,} steps; "
        f"P = {info['P_before']:.8g}")

    loops = {(d, t): make_loop(d, t) for t in args.threads for d in drivers}
    t0 = time.perf_counter()
    for loop in loops.values():              # warm-up: numba compilation, pools, caches
        time_overhead(loop, active, x0, b0, kwargs, args.overhead_samples, 2)
    log(f"warm-up (numba compilation): {time.perf_counter() - t0:.1f} s; numba threading "
        f"layer: {numba.threading_layer()}")

    capacity_before = cpu_capacity(args.threads)
    log("free cores seen by T threads (compute-bound probe, T = ideal): " +
        ", ".join(f"T={t}: {c:.2f}" for t, c in capacity_before.items()))

    times = {key: [] for key in loops}
    cpu = {key: [] for key in loops}
    primal = {key: [] for key in loops}
    gap = {key: [] for key in loops}
    overhead = {key: [] for key in loops}
    keys = list(loops)
    for rep in range(args.repeat):
        order = keys[rep % len(keys):] + keys[:rep % len(keys)]   # rotate the start
        for key in order:
            time.sleep(args.pause)
            seconds, cpu_seconds, x, b = time_epoch(loops[key], active, x0, b0, kwargs)
            times[key].append(seconds)
            cpu[key].append(cpu_seconds)
            cert = active.certificate(x, b[0])
            primal[key].append(cert.primal)
            gap[key].append(cert.gap / p0)
        for key in order:
            time.sleep(args.pause)
            overhead[key].append(time_overhead(loops[key], active, x0, b0, kwargs,
                                               args.overhead_samples, args.overhead_calls))
    capacity_after = cpu_capacity(args.threads)
    reference_key = ("python_threads", 1) if ("python_threads", 1) in loops else keys[0]
    p_ref = float(np.mean(primal[reference_key]))

    rows, table, over_rows = [], [], []
    for d in drivers:
        for t in args.threads:
            best = min(times[(d, t)])
            base_t = min(times[(d, args.threads[0])])
            py = min(times[("python_threads", t)])
            p_mean = float(np.mean(primal[(d, t)]))
            decrease = (info["P_before"] - p_mean) / (info["P_before"] - p_ref) \
                if info["P_before"] != p_ref else float("nan")
            row = {"driver": d, "threads": t, "best_seconds": best,
                   "median_seconds": float(np.median(times[(d, t)])),
                   "times": times[(d, t)], "cpu_times": cpu[(d, t)],
                   "cpu_over_wall": float(np.sum(cpu[(d, t)]) / np.sum(times[(d, t)])),
                   f"speedup_vs_T{args.threads[0]}": base_t / best,
                   "python_threads_over_this": py / best,
                   "primal_after": p_mean, "primal_after_min": min(primal[(d, t)]),
                   "primal_after_max": max(primal[(d, t)]),
                   "rel_gap_after": float(np.mean(gap[(d, t)])),
                   "primal_rel_diff_vs_ref": (p_mean - p_ref) / p_ref,
                   "decrease_vs_ref": decrease,
                   "overhead_seconds": min(overhead[(d, t)])}
            rows.append(row)
            table.append([d, t, f"{best * 1e3:.1f}", f"{row['median_seconds'] * 1e3:.1f}",
                          f"{row['cpu_over_wall']:.2f}",
                          f"{base_t / best:.2f}", f"{py / best:.2f}", f"{p_mean:.8g}",
                          f"{(p_mean - p_ref) / p_ref:+.1e}", f"{decrease:.2f}",
                          f"{row['rel_gap_after']:.2e}"])
            over_rows.append([d, t, f"{row['overhead_seconds'] * 1e6:.0f}"])
    header = ["driver", "T", "best ms", "median ms", "cpu/wall",
              f"speedup vs T={args.threads[0]}", "python_threads/this", "P after epoch",
              "dP/P vs ref", "decrease/ref",
              "gap/P0 after"]
    log("")
    log(f"one inner epoch ({info['epoch_steps']:,} steps, {info['active_features']:,} active "
        f"features), best of {args.repeat}; P before = {info['P_before']:.8g}, "
        f"P(0) = {p0:.6g}; ref = {reference_key[0]} T={reference_key[1]}")
    log(format_table(header, table))
    log("")
    log(f"per-call overhead: tiny epoch of {args.overhead_samples} samples, best of "
        f"{args.repeat} means over {args.overhead_calls} calls")
    log(format_table(["driver", "T", "us per call"], over_rows))
    log("free cores seen by T threads after the timings: " +
        ", ".join(f"T={t}: {c:.2f}" for t, c in capacity_after.items()))

    name = "bench_runtime_quick.json" if args.quick else "bench_runtime.json"
    path = args.output or os.path.join(RESULTS_DIR, name)
    write_json(path, {
        "benchmark": "bench_runtime", "quick": args.quick,
        "machine": machine_info(), "numba_threading_layer": numba.threading_layer(),
        "numba_num_threads": numba.config.NUMBA_NUM_THREADS,
        "native_available": native.available(), "native_library": native.LIBRARY_PATH,
        "problem": {"data": f"make_ctr({shape[0]}, {shape[1]}, nnz_per_row=30, "
                            "random_state=0)",
                    "loss": "squared", "penalty": "L1", "fit_intercept": True,
                    "lam_ratio": 1e-3, "lam_max": lam_max, "lam": problem.lam, "P0": p0,
                    "n_samples": X.shape[0], "n_features": X.shape[1], "nnz": X.nnz},
        "epoch": dict(info, start_tol=args.start_tol), "threads": args.threads,
        "repeat": args.repeat, "overhead_samples": args.overhead_samples,
        "overhead_calls": args.overhead_calls, "pause": args.pause,
        "reference": {"driver": reference_key[0], "threads": reference_key[1],
                      "primal_after": p_ref},
        "cpu_capacity_before": capacity_before, "cpu_capacity_after": capacity_after,
        "results": rows, "total_seconds": time.perf_counter() - t_start,
    })
    log(f"\nwrote {path} ({time.perf_counter() - t_start:.0f} s in all)")


if __name__ == "__main__":
    main(ARGS)
