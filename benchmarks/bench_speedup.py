"""Speed-up benchmark (thesis Figure 3): seconds to duality gap 1e-6 * P(0) of Dis-DDSS on
1, 2, 4, 8 MPI workers (mpirun -n 2, 3, 5, 9) and of Sha-DDSS on 1, 2 (4, 8 where the
machine has the cores) threads; speed-up t(1) / t(k) against the ideal k.

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_speedup.py [--quick]
        [--tall] [--workers 1 2 4 8] [--threads 1 2] [--time-cap S] [--repeat N]
        [--messages M]

Problem: Lasso with intercept at lam = 1e-3 lam_max on make_ctr(200_000, 100_000,
nnz_per_row=30, random_state=0) (bench_serial's ctr_lasso_1e-3); --quick:
make_ctr(20_000, 10_000, ...), 30 s cap, about 2-3 minutes; --tall: make_ctr(1_600_000,
100_000, ...), the same features with 8 times the rows (each of 8 workers then holds as
many rows as 1 worker of the default problem). On a machine without MPI (a bare many-core
one) benchmarks/run_speedup_bare.sh installs the mpich and mpi4py wheels first.

Dis-DDSS: one ``mpirun -n K+1 python benchmarks/_mpi_run.py`` per worker count and round
(bench_distributed.run_mpi); the solve time is the history's time at the first record with
rel gap <= target (solve_mpi's clock; data loading, numba loading and MPI start-up
excluded), and the wall time of the whole mpirun is kept too. Runs with more ranks than
cores are marked oversubscribed. Sha-DDSS: solve_ddss(problem, tol,
inner_loop=ThreadsInnerLoop(T)) in this process, the time read off its history the same way.
--repeat N: best of N (rounds interleaved).

Command runs (``run_command``; --no-command skips them): the same problem written once as a
LIBSVM file and solved by ``mpirun -n K+1 asyncopt-lasso FILE --alpha-ratio R --tol T``,
timed whole: the wall time a user waits, start-up and each worker's parse of its byte range
included (the table's "command s").

No communication (``no_communication_times``; --no-ceiling skips it): k forked processes
each run 8 epochs of the serial solver on worker i's row block at once, no messages at
all: t(1) / t(k) is what these cores give k processes whatever the protocol costs; the
table's "no comm." rows and the target lines show it. The "1 block" rows run the first of
the k blocks alone (what the work itself splits into k), and ``core_probe`` gives k
processes the same fixed arithmetic or streaming reads (what the machine's k cores give).
A table shows where Dis-DDSS's solve went on the server's clock (certificates, inner
loops, Newton steps; solve_mpi's record fields certificate_s, inner_s, newton_s), and the
CPU seconds of every rank in the solve with the floor they set on the machine's cores
(``cpu_floor``): where ranks outnumber cores, t(1) over that floor bounds the speed-up.
A worker's CPU over the worker counts is fitted to R / l + F (``worker_cpu_fit``): F, what
does not split with the rows, bounds the speed-up wherever the ranks run.

Targets: Dis-DDSS 2 workers >= 1.6x faster than 1 worker; -n 9 (8 workers) within 3x of
-n 3's time (solve, whole mpirun, whole command); 8 workers >= 6x faster than 1 on a
16-core machine ("not measurable here" with fewer than 9 cores).
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
from numba import njit

# the repository root, after PYTHONPATH (so PYTHONPATH can point at another asyncopt tree)
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._mpi_run import RANK_ENV, find_mpirun, run_job  # noqa: E402
from benchmarks.bench_distributed import (add_common_arguments, load_results,  # noqa: E402
                                          run_mpi, save_figure)
from benchmarks.bench_serial import (DATA_DESCRIPTION, _check, _yes_no, load_data,  # noqa: E402
                                     log, problem_specs, source_fingerprint)
from benchmarks.bench_shared import better  # noqa: E402
from benchmarks.common import (RESULTS_DIR, SolverRun, cpu_floor,  # noqa: E402
                               format_table, from_history, machine_info, ratio,
                               run_from_dict, write_json)

from asyncopt.data import make_ctr, save_libsvm  # noqa: E402
from asyncopt.problem import Problem  # noqa: E402
from asyncopt.solvers import solve_ddss  # noqa: E402
from asyncopt.solvers.threads import ThreadsInnerLoop  # noqa: E402

PROBLEM = "ctr_lasso_1e-3"
FAMILIES = {"dis": "Dis-DDSS (MPI workers)", "sha": "Sha-DDSS (threads)"}


def key_of(family, k):
    return f"{family}@{k}"


# --------------------------------------------------------------------------- runs

def run_dis(spec, workers, target, cap, rep, args, workdir, cores):
    """One Dis-DDSS mpirun on ``workers`` workers (bench_distributed.run_mpi)."""
    extra = (["--messages", str(args.messages)] if args.messages else []) + \
        (["--newton-products"] if args.newton_products else [])
    run, _ = run_mpi(spec, "ddss", workers, target, cap, rep, args, workdir,
                     extra_args=extra)
    run.solver = key_of("dis", workers)
    run.extra.update(k=workers, n_ranks=workers + 1, oversubscribed=workers + 1 > cores)
    ranks = run.extra.get("ranks")
    if ranks:
        # mpirun wall minus the slowest rank's solve: process start-up, imports, data,
        # warm-up, the final gather and exit
        run.extra["startup_s"] = run.extra["mpirun_wall_s"] - max(r["solve_s"] for r in ranks)
        cpu = [r["solve_cpu_s"] for r in ranks if "solve_cpu_s" in r]
        if len(cpu) == len(ranks):
            run.extra["solve_cpu_s"] = sum(cpu)
            run.extra["cpu_floor_s"] = cpu_floor(cpu, cores)
            run.extra["worker_cpu_s"] = float(np.mean(
                [r["solve_cpu_s"] for r in ranks if r.get("rank", 0) != 0]))
    return run


def worker_cpu_fit(best, workers):
    """{"rows_s": R, "fixed_s": F}: the least-squares fit of a worker's CPU seconds in
    the best round's solve (``worker_cpu_s``, the mean over the workers) to R / l + F
    over the worker counts l, or None with fewer than two. R is the work that splits
    with the rows; F, a worker's share that does not (its Hessian share, p-sized vectors,
    messages, waits), bounds the speed-up at (R + F) / (R / l + F) however the ranks
    overlap. On the 2-core VM (CTR 200,000 x 100,000, 1e-3 lam_max, 1 / 2 / 8 workers,
    2026-11-26 14:16): R = 0.218 s, F = 0.050 s, the waits' CPU included (per-rank
    timelines without the waits gave F ~60 ms before the workers' Hessian shares were
    packed, ~34 ms after). The fit assumes the same epochs at every count (the table
    shows them); where ranks outnumber cores, their switching inflates F."""
    points = [(1.0 / k, best[key_of("dis", k)].extra["worker_cpu_s"]) for k in workers
              if key_of("dis", k) in best and
              "worker_cpu_s" in best[key_of("dis", k)].extra]
    if len(points) < 2:
        return None
    inverse, cpu = np.array(points).T
    rows_s, fixed_s = np.polyfit(inverse, cpu, 1)
    return {"rows_s": float(rows_s), "fixed_s": float(fixed_s)}


def write_command_data(X, y, spec, workdir):
    """The problem's rows (X, y) as a LIBSVM file in workdir (``save_libsvm``: one-based,
    read back exactly), for the command runs; its path."""
    path = os.path.join(workdir, spec["data"] + ".svm")
    save_libsvm(path, X, y)
    return path


def run_command(svm_path, spec, workers, target, cap, rep, args, workdir):
    """One ``mpirun -n K+1 asyncopt-lasso DATA --alpha-ratio R --tol T`` (the console
    script's module), timed whole: what a user waits for, each worker's parse of its byte
    range of the LIBSVM file and every rank's start-up included. {"k", "round", "wall_s",
    "solve_s" (the history's last time), "rel_gap", "epochs", "error"}."""
    import json
    cli = "asyncopt.cli.lasso" if spec["loss"] == "squared" else "asyncopt.cli.logreg"
    history = os.path.join(workdir, f"command_{workers}_{rep}.json")
    cmd = [find_mpirun(args.mpirun), "-n", str(workers + 1), sys.executable, "-m", cli,
           svm_path, "--alpha-ratio", repr(float(spec["lam_ratio"])), "--tol",
           repr(float(target)), "--seed", str(rep), "--quiet", "--history-json", history] + \
        ([] if spec["fit_intercept"] else ["--no-intercept"])
    out = {"k": workers, "round": rep, "wall_s": None, "solve_s": None, "rel_gap": None,
           "epochs": None, "error": None}
    wall, out["error"] = run_job(cmd, history, cap + 120)
    if out["error"]:
        return out
    with open(history) as f:
        records = json.load(f)
    out.update(wall_s=wall, solve_s=records[-1]["time"], rel_gap=records[-1]["rel_gap"],
               epochs=records[-1]["epoch"])
    return out


def warm_up_threads(threads, fit_intercept):
    """Compile / load the serial and threaded DDSS epochs on a tiny problem."""
    X, y, _ = make_ctr(400, 300, nnz_per_row=5, random_state=1)
    tiny = Problem(X, y, "squared", lam=1.0, fit_intercept=fit_intercept)
    tiny = tiny.with_lam(0.1 * tiny.lam_max())
    for t in threads:
        solve_ddss(tiny, tol=1e-5, max_epochs=5, random_state=0,
                   inner_loop=ThreadsInnerLoop(n_jobs=t))


def run_sha(problem, threads, target, cap, rep, cores):
    """One Sha-DDSS solve on ``threads`` threads in this process."""
    t0 = time.perf_counter()
    result = solve_ddss(problem, tol=target, max_epochs=10 ** 7, random_state=rep,
                        max_time=cap, inner_loop=ThreadsInnerLoop(n_jobs=threads))
    wall = time.perf_counter() - t0
    run = from_history(key_of("sha", threads), result.history, target,
                       note="" if result.converged else "stopped at the time cap")
    if run.reached and run.time > cap:
        run.reached, run.time, run.note = False, None, "reached after the time cap"
    last = result.history[-1]
    run.extra.update(k=threads, threads=threads, oversubscribed=threads > cores,
                     call_wall_s=wall, converged=bool(result.converged),
                     staleness_mean=float(last["staleness_mean"]),
                     support=int((result.coef != 0).sum()))
    return run


def _shard_epochs(X, y, spec, lam, lo, hi, epochs, barrier, queue):
    """Child of ``no_communication_times``: the serial solver on rows lo..hi-1 (one warm-up
    epoch, then ``epochs`` timed epochs once every child is ready), BLAS on one thread."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    shard = Problem(X[lo:hi], y[lo:hi], spec["loss"], lam=lam,
                    fit_intercept=spec["fit_intercept"])
    solve_ddss(shard, tol=0.0, max_epochs=1, screening=False, random_state=0,
               support_newton=False)
    barrier.wait()
    t0 = time.perf_counter()
    solve_ddss(shard, tol=0.0, max_epochs=epochs, screening=False, random_state=0,
               support_newton=False)
    queue.put(time.perf_counter() - t0)


def _slowest_at_once(context, target, arg_lists):
    """Seconds of the slowest of len(arg_lists) forked children ``target(*args, barrier,
    queue)``, which start their timed work together (the barrier) and put its seconds on
    the queue."""
    barrier, queue = context.Barrier(len(arg_lists)), context.Queue()
    children = [context.Process(target=target, args=(*args, barrier, queue))
                for args in arg_lists]
    for child in children:
        child.start()
    slowest = max(queue.get(timeout=600) for _ in children)
    for child in children:
        child.join()
    return slowest


def _blocks_at_once(context, X, y, spec, lam, blocks, epochs):
    """Seconds of the slowest of len(blocks) ``_shard_epochs`` children, one per (lo, hi)
    row block, started together."""
    return _slowest_at_once(context, _shard_epochs,
                            [(X, y, spec, lam, lo, hi, epochs) for lo, hi in blocks])


def no_communication_times(X, y, spec, lam, counts, epochs, repeat):
    """What the machine gives k processes with nothing to communicate: for each k in
    ``counts``, k forked processes each run ``epochs`` epochs of the serial solver
    (screening off, every feature active: the work of Dis-DDSS's first epochs) on the
    contiguous row block Dis-DDSS worker i holds, started together; the time of k is that
    of the slowest. t(1) / t(k) bounds what k workers can gain on these cores whatever the
    protocol costs (memory bandwidth and caches are shared; more processes than cores
    share the cores). Also the first of those k blocks run alone: t(1) / that is what
    the work itself splits into k (the per-epoch work over the features, O(p) whatever
    the rows, does not), and that / t(k) what running k at once costs on this machine.
    Best of ``repeat`` rounds. ({k: seconds at once}, {k: seconds of one block alone}).
    """
    import multiprocessing
    from benchmarks._mpi_run import worker_rows
    context = multiprocessing.get_context("fork")
    at_once, alone = {}, {}
    for _ in range(max(1, repeat)):
        for k in counts:
            blocks = [worker_rows(X.shape[0], k, i) for i in range(k)]
            t = _blocks_at_once(context, X, y, spec, lam, blocks, epochs)
            at_once[k] = min(at_once.get(k, t), t)
            t = t if k == 1 else _blocks_at_once(context, X, y, spec, lam, blocks[:1],
                                                  epochs)
            alone[k] = min(alone.get(k, t), t)
    return at_once, alone


@njit(cache=False)
def _compute_kernel(n):
    """4 independent multiply-add chains, n steps each: the core's arithmetic, no
    memory traffic."""
    a, b, c, d = 1.0, 2.0, 3.0, 4.0
    for _ in range(n):
        a = a * 0.9999999 + 1e-7
        b = b * 0.9999999 + 1e-7
        c = c * 0.9999999 + 1e-7
        d = d * 0.9999999 + 1e-7
    return a + b + c + d


def _probe_child(kind, size, barrier, queue):
    """Child of ``core_probe``: one fixed piece of work of ``kind``, timed once every
    child is ready."""
    data = np.ones(size) if kind == "memory" else None
    barrier.wait()
    t0 = time.perf_counter()
    if kind == "memory":
        for _ in range(8):
            data.sum()
    else:
        _compute_kernel(size)
    queue.put(time.perf_counter() - t0)


def core_probe(counts, repeat, compute_steps=50_000_000, memory_doubles=16_000_000):
    """What k processes at once get of this machine, apart from any solver: k forked
    processes each run the same fixed work, ``compute`` (``_compute_kernel``: arithmetic
    in registers) or ``memory`` (8 sums over an array of 128 MB: streaming reads), and
    the throughput of k is k t(1) / t(k), t the slowest child, best of ``repeat`` rounds.
    A machine whose k cores are k real cores gives ~k for compute; cores that share
    their physical core (hyperthreads, a busy host) give less. {kind: {k: throughput}}."""
    import multiprocessing
    context = multiprocessing.get_context("fork")
    _compute_kernel(10)                     # compiled once, before the forks
    out = {}
    for kind, size in (("compute", compute_steps), ("memory", memory_doubles)):
        seconds = {}
        for _ in range(max(1, repeat)):
            for k in counts:
                slowest = _slowest_at_once(context, _probe_child, [(kind, size)] * k)
                seconds[k] = min(seconds.get(k, slowest), slowest)
        out[kind] = {k: k * seconds[min(seconds)] / seconds[k] for k in counts}
    return out


def round_summary(run, rep):
    e = run.extra
    return {"round": rep, "reached": run.reached, "solve_s": run.time,
            "best_rel_gap": run.best_rel_gap, "epochs": e.get("epochs"),
            "mpirun_wall_s": e.get("mpirun_wall_s"), "call_wall_s": e.get("call_wall_s"),
            "error": run.error}


# --------------------------------------------------------------------------- main

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="CTR 20k x 10k instead of 200k x 100k, 30 s cap: a 2-3 minute "
                             "smoke test")
    parser.add_argument("--tall", action="store_true",
                        help="CTR 1,600,000 x 100,000 (ctr_tall: 8 times the rows, the "
                             "same features): rows for 8 workers to split")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8], metavar="K",
                        help="MPI worker counts (mpirun -n K+1; default 1 2 4 8)")
    parser.add_argument("--threads", type=int, nargs="+", default=None, metavar="T",
                        help="Sha-DDSS thread counts (default: those of 1 2 4 8 that do not "
                             "exceed the cores, at least 1 2)")
    parser.add_argument("--messages", type=int, default=None, metavar="M",
                        help="Dis-DDSS messages per worker per epoch (batch n / (M k); "
                             "default: solve_mpi's default_batch)")
    parser.add_argument("--newton-products", action="store_true",
                        help="Dis-DDSS's Newton step asks the workers for each CG product "
                             "(what it does across machines) instead of reducing their "
                             "Hessian shares to the server (one node): an ablation")
    parser.add_argument("--no-mpi", action="store_true", help="skip the Dis-DDSS runs")
    parser.add_argument("--no-threads", action="store_true", help="skip the Sha-DDSS runs")
    parser.add_argument("--no-command", action="store_true",
                        help="skip the command runs (mpirun -n K+1 asyncopt-lasso on the "
                             "problem written as a LIBSVM file, timed whole; also skipped "
                             "with --tall)")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip the no-communication runs (k serial solves on the k "
                             "workers' row blocks at once)")
    parser.add_argument("--ceiling-epochs", type=int, default=8,
                        help="epochs of each no-communication run (default 8)")
    parser.add_argument("--time-cap", type=float, default=None,
                        help="seconds per run (max_time; default 300, 30 with --quick)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every count, interleaved; best of N (default 1)")
    add_common_arguments(parser, "bench_speedup")
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot)
    cores = os.cpu_count() or 1
    workers = [] if args.no_mpi else sorted(set(args.workers))
    threads = [] if args.no_threads else sorted(set(
        args.threads or [t for t in (1, 2, 4, 8) if t <= max(cores, 2)]))
    if any(k < 1 for k in workers + threads):
        parser.error("worker and thread counts must be >= 1")
    cap = args.time_cap if args.time_cap is not None else (30.0 if args.quick else 300.0)
    target = args.target
    spec = next(s for s in problem_specs(args.quick) if s["name"] == PROBLEM)
    stem = "bench_speedup_quick" if args.quick else "bench_speedup"
    if args.tall:
        if args.quick:
            parser.error("--tall and --quick exclude each other")
        spec = dict(spec, name=PROBLEM.replace("ctr", "ctr_tall"), data="ctr_tall")
        stem = "bench_speedup_tall"
    json_path = args.output or os.path.join(RESULTS_DIR, stem + ".json")
    png_path = os.path.splitext(json_path)[0] + ".png"

    info = machine_info(("mpi4py", "matplotlib"))
    info["asyncopt_source"] = source_fingerprint()
    info["mpirun"] = find_mpirun(args.mpirun)
    info["rank_env"] = {k: os.environ.get(k, v) for k, v in RANK_ENV.items()}
    log(f"bench_speedup: os.cpu_count() = {cores}, {info['cpu_model']}, mpirun "
        f"{info['mpirun']}, " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    log(f"{PROBLEM}: {DATA_DESCRIPTION[spec['data']]}, lam = {spec['lam_ratio']:g} lam_max; "
        f"target gap <= {target:g} * P(0), cap {cap:g} s, repeat {args.repeat}; "
        f"Dis-DDSS workers {workers} (ranks {[w + 1 for w in workers]}"
        + (f", {args.messages} messages per worker per epoch" if args.messages else "")
        + f"), Sha-DDSS threads "
        f"{threads}")
    over = [f"-n {w + 1}" for w in workers if w + 1 > cores] + \
        [f"{t} threads" for t in threads if t > cores]
    if over:
        log(f"warning: more ranks / threads than the {cores} cores (oversubscribed): "
            + ", ".join(over))
    if workers and info["mpirun"] is None:
        log("error: no mpirun (pip install mpich); use --no-mpi")
        return 1

    problem, meta = None, {**spec, "data_description": DATA_DESCRIPTION[spec["data"]]}
    ceiling_counts = [] if args.no_ceiling else workers
    command_counts = [] if args.no_command or args.tall else workers
    X = y = None
    t0 = time.perf_counter()
    if threads or ceiling_counts or command_counts:
        X, y = load_data(spec["data"])
    if threads or ceiling_counts:
        base = Problem(X, y, spec["loss"], lam=1.0, fit_intercept=spec["fit_intercept"])
        lam_max = base.lam_max()           # also builds the shuffled CSR copy, untimed
        problem = base.with_lam(spec["lam_ratio"] * lam_max)
        meta.update(n_samples=X.shape[0], n_features=X.shape[1], nnz=X.nnz,
                    lam_max_serial=lam_max, lam_serial=problem.lam,
                    P0=problem.zero_certificate().primal)
        log(f"data {X.shape}, nnz {X.nnz:,}, P(0) = {meta['P0']:.6g} "
            f"({time.perf_counter() - t0:.1f} s)")
    ceiling, alone, probe = {}, {}, {}
    if ceiling_counts:       # forks: before this process starts any thread
        ceiling, alone = no_communication_times(X, y, spec, problem.lam, ceiling_counts,
                                                args.ceiling_epochs, args.repeat)
        log(f"no communication, {args.ceiling_epochs} epochs on each block: " + ", ".join(
            f"{k} at once {t:.2f} s (one alone {alone[k]:.2f} s)"
            for k, t in ceiling.items()))
        probe = core_probe(ceiling_counts, args.repeat)
        log("the machine, k processes at once (throughput k t(1) / t(k)): " + "; ".join(
            f"{kind} " + ", ".join(f"{k}: {v:.2f}" for k, v in values.items())
            for kind, values in probe.items()))
    if threads:
        warm_up_threads(threads, spec["fit_intercept"])

    best, rounds, commands = {}, {}, {}
    t_start = time.perf_counter()
    order = [("dis", w) for w in workers] + [("sha", t) for t in threads] + \
        [("cmd", w) for w in command_counts]
    with tempfile.TemporaryDirectory(prefix="bench_speedup_") as workdir:
        svm_path = write_command_data(X, y, spec, workdir) if command_counts else None
        for rep in range(max(1, args.repeat)):
            for family, k in (order if rep % 2 == 0 else order[::-1]):
                key = key_of(family, k)
                t0 = time.perf_counter()
                if family == "cmd":
                    run = run_command(svm_path, spec, k, target, cap, rep, args, workdir)
                    commands.setdefault(k, []).append(run)
                    log(f"  [{rep}] {key:6s} " + (f"ERROR {run['error']}" if run["error"]
                        else f"whole command {run['wall_s']:.2f} s (solve {run['solve_s']:.2f}"
                        f" s, rel gap {run['rel_gap']:.1e}, {run['epochs']} epochs)"))
                    continue
                try:
                    if family == "dis":
                        run = run_dis(spec, k, target, cap, rep, args, workdir, cores)
                    else:
                        run = run_sha(problem, k, target, cap, rep, cores)
                except Exception as exc:  # noqa: BLE001 - report, go on with the rest
                    run = SolverRun(key, False, error=repr(exc), extra={"k": k})
                run.extra.setdefault("k", k)
                rounds.setdefault(key, []).append(round_summary(run, rep))
                if better(run, best.get(key)):
                    best[key] = run
                _log_run(rep, key, run, cap, time.perf_counter() - t0)
    for key, run in best.items():
        walls = [r["mpirun_wall_s"] for r in rounds[key] if r.get("mpirun_wall_s")
                 and not r["error"]]
        if walls:
            run.extra["best_mpirun_wall_s"] = min(walls)
        run.extra["rounds"] = rounds[key]
    report(best, workers, threads, cap, target, args, info, meta, cores, json_path,
           png_path, time.perf_counter() - t_start, ceiling, alone, probe, commands)
    return 0


def _log_run(rep, key, run, cap, wall):
    if run.error:
        log(f"  [{rep}] {key:6s} ERROR {run.error}")
        return
    e = run.extra
    t = f"{run.time:.2f} s" if run.reached else f">{cap:g} s"
    where = (f"mpirun {e['mpirun_wall_s']:.1f} s (start-up etc. {e.get('startup_s', 0):.1f} s)"
             if "mpirun_wall_s" in e else f"call {e.get('call_wall_s', wall):.2f} s")
    log(f"  [{rep}] {key:6s} to target {t:>8s}  best gap {run.best_rel_gap:.1e}  epochs "
        f"{e.get('epochs')}  {where}" + ("  [oversubscribed]" if e.get("oversubscribed")
                                         else ""))


# --------------------------------------------------------------------------- report

def speedups(best, family, counts, cap):
    """{k: (value, text, kind)} of t(first count) / t(k) on the solve time."""
    if not counts:
        return {}
    base = best.get(key_of(family, counts[0]))
    return {k: ratio(base, best.get(key_of(family, k)), cap) for k in counts}


def wall_ratio(best, a, b):
    """best mpirun wall of ``a`` / that of ``b`` (None if either is missing)."""
    wa = best.get(a).extra.get("best_mpirun_wall_s") if best.get(a) else None
    wb = best.get(b).extra.get("best_mpirun_wall_s") if best.get(b) else None
    return None if not wa or not wb else wa / wb


def paired_ratios(a, b):
    """t_a / t_b round by round (rounds interleaved, so each pair ran side by side on the
    same machine state), over the rounds both reached; [] when either run is missing."""
    if a is None or b is None:
        return []

    def reached(run):
        return {r["round"]: r["solve_s"] for r in run.extra.get("rounds", [])
                if r["reached"] and r["solve_s"]}
    times_a, times_b = reached(a), reached(b)
    return [times_a[r] / times_b[r] for r in sorted(times_a) if r in times_b]


def targets_report(best, cap, cores, free_speedup=None, commands=None):
    lines, out = [], {}
    free_speedup = free_speedup or {}
    commands = commands or {}

    def add(label, what, v, shown, kind, op, bound, note=""):
        ok = _check(v, kind, op, bound)
        out[label] = {"met": ok, "ratio": v, "ratio_text": shown, "ratio_kind": kind,
                      "what": what}
        lines.append(f"{what}: {shown} -> {_yes_no(ok)}{note}")

    d1, d2, d8 = (best.get(key_of("dis", k)) for k in (1, 2, 8))
    if d1 and d2:
        v, shown, kind = ratio(d1, d2, cap)
        free = (f"; with no communication at all the machine gives 2 processes "
                f"{free_speedup[2]:.2f}x" if 1 in free_speedup and 2 in free_speedup else "")
        pairs = paired_ratios(d1, d2)
        paired = (f"; round by round {', '.join(f'{r:.2f}' for r in pairs)} (median "
                  f"{float(np.median(pairs)):.2f})" if len(pairs) > 1 else "")
        floor = d2.extra.get("cpu_floor_s")
        solve1 = max((r["solve_s"] for r in d1.extra.get("ranks") or []), default=None)
        bound = solve1 / floor if floor and solve1 else None
        cpu = (f"; the CPU of the -n 3 solve ({d2.extra['solve_cpu_s']:.2f} s, all "
               f"ranks, waits included) on {cores} cores allows at most {bound:.2f}x "
               f"(whole solves, t1 / floor)" if bound else "")
        add("dis@1/dis@2 >= 1.6", "Dis-DDSS 2 workers >= 1.6x faster than 1 (t1/t2, solve "
            "to 1e-6, best of rounds)", v, shown, kind, ">=", 1.6, paired + free + cpu)
        out["dis@1/dis@2 >= 1.6"]["paired_ratios"] = pairs
        if bound:
            out["dis@1/dis@2 >= 1.6"]["cpu_floor_bound"] = bound
        if free:
            out["dis@1/dis@2 >= 1.6"]["no_communication_ratio"] = free_speedup[2]
    if d2 and d8:
        v, shown, kind = ratio(d8, d2, cap)
        add("dis@8/dis@2 <= 3 (solve)", "-n 9 within 3x of -n 3 (t8/t2, solve to 1e-6)",
            v, shown, kind, "<=", 3, "" if cores >= 9 else f" [-n 9 oversubscribed on "
                                                             f"{cores} cores]")
        w = wall_ratio(best, key_of("dis", 8), key_of("dis", 2))
        if w is not None:
            add("dis@8/dis@2 <= 3 (mpirun wall)", "-n 9 within 3x of -n 3 (whole mpirun "
                "wall, start-up included)", w, f"{w:.2f}", "exact", "<=", 3)
    c2, c8 = (commands.get(k, {}).get("best_wall_s") for k in (2, 8))
    if c2 and c8:
        add("cmd@8/cmd@2 <= 3", "-n 9 within 3x of -n 3 (the whole command mpirun "
            "asyncopt-lasso DATA.svm)", c8 / c2, f"{c8 / c2:.2f}", "exact", "<=", 3)
    if d1 and d8:
        v, shown, kind = ratio(d1, d8, cap)
        label = "dis@1/dis@8 >= 6 (16 cores)"
        what = "Dis-DDSS 8 workers >= 6x faster than 1 on a 16-core machine (t1/t8)"
        if cores < 9:
            out[label] = {"met": None, "ratio": v, "ratio_text": shown, "ratio_kind": kind,
                          "what": what, "status": f"not measurable here ({cores} cores < 9 "
                                                  f"ranks)"}
            lines.append(f"{what}: not measurable here ({cores} cores < 9 ranks; measured "
                         f"{shown}, oversubscribed)")
        else:
            free = (f"; with no communication at all the machine gives 8 processes "
                    f"{free_speedup[8]:.2f}x" if 1 in free_speedup and 8 in free_speedup
                    else "")
            add(label, what, v, shown, kind, ">=", 6,
                ("" if cores >= 16 else f" [{cores} cores, not 16]") + free)
    return lines, out


def phase_rows(best, workers):
    """(header, rows): per worker count, the best round's solve seconds and how the
    server's clock split them (``bench_distributed.phase_totals``); None without any."""
    rows = []
    for k in workers:
        run = best.get(key_of("dis", k))
        totals = run.extra.get("phase_totals") if run is not None else None
        if not totals:
            continue
        epochs = run.extra.get("epochs") or 1
        solve = run.extra["timeline"][-1]["time"]
        floor = run.extra.get("cpu_floor_s")
        rows.append([k, run.extra.get("batch", "-"), f"{solve:.3f}",
                     f"{totals['certificate_s']:.3f}", f"{totals['inner_s']:.3f}",
                     f"{totals['inner_s'] / epochs * 1e3:.1f}", f"{totals['newton_s']:.3f}",
                     totals["newton_products"], epochs,
                     "-" if floor is None else f"{run.extra['solve_cpu_s']:.3f}",
                     "-" if floor is None else f"{floor:.3f}",
                     "-" if floor is None else f"{run.extra['worker_cpu_s']:.3f}"])
    if not rows:
        return None
    return (["workers", "batch", "solve s", "certificate s", "inner s", "inner ms/epoch",
             "Newton s", "products", "epochs", "CPU s", "CPU floor s", "CPU s a worker"],
            rows)


def table_rows(best, workers, threads, cap, commands=None):
    header = ["backend", "k", "ranks/threads", "oversub.", "s to target", "speed-up",
              "ideal", "epochs", "best gap", "mpirun s", "mpirun speed-up", "start-up s",
              "command s"]
    commands = commands or {}
    rows = []
    dis_sp = speedups(best, "dis", workers, cap)
    sha_sp = speedups(best, "sha", threads, cap)
    base_wall = best.get(key_of("dis", workers[0])).extra.get("best_mpirun_wall_s") \
        if workers and best.get(key_of("dis", workers[0])) else None
    for family, counts, sp in (("dis", workers, dis_sp), ("sha", threads, sha_sp)):
        for k in counts:
            run = best.get(key_of(family, k))
            if run is None:
                continue
            e = run.extra
            wall = e.get("best_mpirun_wall_s")
            row = [FAMILIES[family].split(" ")[0], k,
                   f"-n {k + 1}" if family == "dis" else f"{k} thread" + "s" * (k > 1),
                   "yes" if e.get("oversubscribed") else "no",
                   "error" if run.error else (f"{run.time:.2f}" if run.reached
                                              else f">{cap:g}"),
                   sp[k][1], f"{k / counts[0]:g}", e.get("epochs", "-"),
                   "-" if run.best_rel_gap is None else f"{run.best_rel_gap:.1e}",
                   "-" if wall is None else f"{wall:.1f}",
                   "-" if wall is None or base_wall is None else f"{base_wall / wall:.2f}",
                   "-" if "startup_s" not in e else f"{e['startup_s']:.1f}",
                   _command_wall(commands, k) if family == "dis" else "-"]
            rows.append(row)
    return header, rows


def command_summary(commands, target):
    """{k: {"rounds", "best_wall_s"}}: the command runs of each worker count and the
    fastest whole command among those that reached the target (None if none did)."""
    out = {}
    for k, runs in sorted(commands.items()):
        walls = [r["wall_s"] for r in runs if not r["error"] and r["rel_gap"] is not None
                 and r["rel_gap"] <= target]
        out[k] = {"rounds": runs, "best_wall_s": min(walls) if walls else None}
    return out


def _command_wall(commands, k):
    wall = commands.get(k, {}).get("best_wall_s")
    return "-" if wall is None else f"{wall:.1f}"


def report(best, workers, threads, cap, target, args, info, meta, cores, json_path,
           png_path, seconds, ceiling=None, alone=None, probe=None, commands=None):
    ceiling, alone, probe = ceiling or {}, alone or {}, probe or {}
    commands = command_summary(commands or {}, target)
    # t(first count) / t(k) of the no-communication runs, as speedups() for the solvers
    free_speedup = {k: ceiling[min(ceiling)] / t for k, t in ceiling.items()}
    alone_speedup = {k: ceiling[min(ceiling)] / t for k, t in alone.items()}
    header, rows = table_rows(best, workers, threads, cap, commands)
    for k, t in ceiling.items():
        rows.append(["no comm.", k, f"{k} process" + "es" * (k > 1),
                     "yes" if k > cores else "no", f"{t:.2f}", f"{free_speedup[k]:.2f}",
                     f"{k / min(ceiling):g}", args.ceiling_epochs, "-", "-", "-", "-", "-"])
    for k, t in alone.items():
        if k > min(alone):
            rows.append(["1 block", k, "1 process", "no", f"{t:.2f}",
                         f"{alone_speedup[k]:.2f}", f"{k / min(alone):g}",
                         args.ceiling_epochs, "-", "-", "-", "-", "-"])
    table = format_table(header, rows)
    phases = phase_rows(best, workers)
    target_lines, met = targets_report(best, cap, cores, free_speedup, commands)
    dis = next((r for k, r in best.items() if k.startswith("dis@") and "lam" in r.extra),
               None)
    log(f"\nseconds to gap <= {target:g} * P(0) (solver clock; >cap: not reached in {cap:g} "
        f"s); speed-up = t(1) / t(k) ('>': a lower bound, '<': an upper bound); mpirun s: "
        f"the whole mpirun (best of rounds), start-up: mpirun wall - slowest rank's solve; "
        f"command s: the whole mpirun -n k+1 asyncopt-lasso on the LIBSVM file (best of "
        f"rounds that reached the target); os.cpu_count() = {cores}\n")
    log(table)
    if phases:
        log("\nwhere Dis-DDSS's solve went (server clock, best round; certificate: the "
            "synchronous part of every outer iteration, inner: the asynchronous inner "
            "loops, Newton: the support Newton steps with their Hessian products; CPU: all "
            "ranks' CPU seconds in the solve, and the floor that sets on these cores; CPU "
            "s a worker: the workers' mean)\n")
        log(format_table(*phases))
    fit = worker_cpu_fit(best, workers)
    if fit is not None:
        rows_s, fixed_s = fit["rows_s"], fit["fixed_s"]
        bound = (rows_s + fixed_s) / max(rows_s / 8 + fixed_s, 1e-12)
        log(f"\na worker's CPU in the solve fits R / l + F over l = "
            f"{', '.join(str(k) for k in workers)} workers: R = {rows_s:.3f} s (splits "
            f"with the rows), F = {fixed_s:.3f} s a worker (does not; alone it bounds 8 "
            f"workers at {bound:.1f}x)")
    if probe:
        log("\nthe machine: k processes at once, each the same fixed work (throughput "
            "k t(1) / t(k); ideal k): " + "; ".join(
                f"{kind} " + ", ".join(f"{k}: {v:.2f}" for k, v in values.items())
                for kind, values in probe.items()))
    log("\ntargets" + (" (quick sizes: not the 200,000 x 100,000 problem)" if args.quick
                       else " (--tall: CTR 1,600,000 x 100,000, not the problem they name)"
                       if args.tall else "") + ":")
    for line in target_lines:
        log("  " + line)
    payload = {
        "benchmark": "bench_speedup", "quick": args.quick, "complete": True,
        "target_rel_gap": target, "time_cap_s": cap, "repeat": args.repeat,
        "cpu_count": cores, "workers": workers, "threads": threads,
        "messages_per_worker": args.messages, "newton_products": args.newton_products,
        "worker_cpu_fit": fit,
        "n_ranks": [w + 1 for w in workers],
        "oversubscribed": {key: bool(r.extra.get("oversubscribed")) for key, r in best.items()},
        "machine": info, "total_seconds": seconds, "problem": meta,
        "runs": {key: r.as_dict() for key, r in best.items()},
        "speedup": {"dis": {str(k): v[0] for k, v in speedups(best, "dis", workers, cap).items()},
                    "sha": {str(k): v[0] for k, v in speedups(best, "sha", threads, cap).items()}},
        "table": {"header": header, "rows": rows}, "table_text": table,
        "targets": met, "targets_text": target_lines,
        "no_communication": {"epochs": args.ceiling_epochs,
                             "seconds": {str(k): t for k, t in ceiling.items()},
                             "speedup": {str(k): v for k, v in free_speedup.items()},
                             "one_block_alone_seconds": {str(k): t for k, t in alone.items()},
                             "one_block_alone_speedup": {str(k): v for k, v in
                                                         alone_speedup.items()}}
        if ceiling else None,
        "core_probe": {kind: {str(k): v for k, v in values.items()}
                       for kind, values in probe.items()} or None,
        "phases": {"header": phases[0], "rows": phases[1]} if phases else None,
        "commands": {str(k): v for k, v in commands.items()} or None,
        "method": {
            "dis": "mpirun -n k+1 python benchmarks/_mpi_run.py --method ddss (bench_distributed"
                   ".run_mpi): shards of contiguous rows, warm-up solve, barrier, solve_mpi(tol="
                   "target, max_time=cap); time = history time of the first record with "
                   "rel_gap <= target (solver clock); extra.mpirun_wall_s: the whole mpirun, "
                   "extra.startup_s: that minus the slowest rank's solve; extra.solve_cpu_s: "
                   "the ranks' CPU seconds in the solve, extra.cpu_floor_s: their sum over "
                   "the cores (no less than the busiest rank's)",
            "sha": "solve_ddss(problem, tol=target, inner_loop=ThreadsInnerLoop(T), max_time=cap)"
                   " in the driver after a warm-up; time read off its history the same way; "
                   "extra.call_wall_s: the whole call",
            "speedup": "t(first count) / t(k) on the solve time; capped runs give bounds",
            "repeat": "rounds interleave every count (odd rounds reversed); best of N on the "
                      "solve time (else lowest gap); best_mpirun_wall_s is the minimum over "
                      "rounds; extra.rounds has every round",
            "oversubscribed": "more MPI ranks (workers + server) or threads than "
                              "os.cpu_count()",
            "no_communication": "no_communication_times: k forked processes each run "
                                "ceiling epochs of the serial solver (screening off) on "
                                "worker i's row block, started together; seconds of the "
                                "slowest, best of the rounds; rows 'no comm.' (s to target "
                                "column: those seconds, not a solve to the target); rows "
                                "'1 block': the first of the k blocks alone",
            "core_probe": "core_probe: k forked processes each run the same arithmetic "
                          "(compute) or streaming reads of 128 MB (memory); k t(1) / t(k)",
            "phases": "solve_mpi's certificate_s, inner_s, newton_s summed over the best "
                      "round's records (bench_distributed.phase_totals)",
            "commands": "run_command: mpirun -n k+1 python -m asyncopt.cli.lasso DATA.svm "
                        "--alpha-ratio lam_ratio --tol target --seed round, timed whole "
                        "(start-up, each worker parsing its byte range, solve, summary); "
                        "DATA.svm written once by asyncopt.data.save_libsvm; best_wall_s "
                        "over the rounds that reached the target",
        },
    }
    if dis is not None:
        payload["problem"].update(lam_mpi=dis.extra["lam"], lam_max_mpi=dis.extra["lam_max"])
    write_json(json_path, payload)
    if not args.no_plot and best:
        plot_speedup(png_path, best, workers, threads, cap, target, info, meta)
    log(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {png_path}"))


def plot_speedup(path, best, workers, threads, cap, target, info, meta):
    """Left: speed-up t(1) / t(k) against k with the ideal line (hollow markers: more
    ranks / threads than cores; triangles: bounds from capped runs). Right: seconds to the
    target (solve, and the whole mpirun for Dis-DDSS)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.6))
    colours = {"dis": "tab:blue", "sha": "tab:orange"}
    counts_all = sorted(set(workers) | set(threads)) or [1]
    ax1.plot(counts_all, counts_all, color="k", ls="--", lw=0.8, label="ideal")
    for family, counts in (("dis", workers), ("sha", threads)):
        sp = speedups(best, family, counts, cap)
        xs, ys = [], []
        for k in counts:
            v, _, kind = sp.get(k, (None, None, None))
            run = best.get(key_of(family, k))
            if v is None or run is None:
                continue
            over = run.extra.get("oversubscribed")
            marker = {"lower": "^", "upper": "v"}.get(kind, "o")
            ax1.plot(k, v, marker=marker, ms=8, color=colours[family],
                     mfc="none" if over else colours[family], ls="none")
            xs.append(k)
            ys.append(v)
        if xs:
            ax1.plot(xs, ys, color=colours[family], lw=1.4, label=FAMILIES[family])
        for k in counts:
            run = best.get(key_of(family, k))
            if run is None or run.error:
                continue
            t = run.time if run.reached else cap
            over = run.extra.get("oversubscribed")
            ax2.plot(k, t, marker="o" if run.reached else "^", ms=7, color=colours[family],
                     mfc="none" if over else colours[family], ls="none")
        pts = [(k, best[key_of(family, k)].time) for k in counts
               if key_of(family, k) in best and best[key_of(family, k)].reached]
        if pts:
            ax2.plot(*zip(*pts), color=colours[family], lw=1.4,
                     label=f"{FAMILIES[family]}: solve")
    walls = [(k, best[key_of("dis", k)].extra.get("best_mpirun_wall_s")) for k in workers
             if key_of("dis", k) in best and best[key_of("dis", k)].extra.get(
                 "best_mpirun_wall_s")]
    if walls:
        ax2.plot(*zip(*walls), color=colours["dis"], ls=":", marker="s", ms=5,
                 label="Dis-DDSS: whole mpirun (start-up included)")
    ax2.axhline(cap, color="grey", ls=":", lw=0.8)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts_all, [str(k) for k in counts_all])
        ax.set_xlabel("workers (MPI) / threads")
        ax.grid(alpha=0.3)
    ax1.set_yscale("log", base=2)
    ax1.set_ylabel("speed-up t(1) / t(k)")
    ax1.set_title("speed-up to gap {:g} (hollow: oversubscribed)".format(target), fontsize=10)
    ax1.legend(fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("seconds")
    ax2.set_title(f"seconds to gap {target:g} (triangles: not reached in the cap)",
                  fontsize=10)
    ax2.legend(fontsize=8)
    fig.suptitle(f"{meta.get('name', PROBLEM)}: {meta.get('data_description', '')}, "
                 f"lam = {meta.get('lam_ratio', 1e-3):g} lam_max ({info['cpu_count']} cores, "
                 f"{info['cpu_model']}, {info['date'][:10]})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return save_figure(fig, path)


def replot(json_path):
    payload, png_path = load_results(json_path)
    best = {k: run_from_dict(v) for k, v in payload["runs"].items()}
    plot_speedup(png_path, best, payload["workers"], payload["threads"],
                 payload["time_cap_s"], payload["target_rel_gap"], payload["machine"],
                 payload["problem"])
    log(f"wrote {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
