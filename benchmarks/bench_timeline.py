"""Where each rank's time goes in one Dis-DDSS solve: the workers' kernels, the server's
inner loop and dense Newton solve, the synchronous rounds and every wait (``wire.poll``),
timed on every rank of ``mpirun -n K`` around ``_mpi_run.py``'s solve (its warm-up is not
recorded).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_timeline.py --ranks 9 --data ctr_tall

Each timed function is wrapped where solvers/mpi.py calls it, so the times are inclusive
(``_work_inner`` holds the worker's SVRG batches and its waits for replies). A worker
kernel that splits with the rows takes about 1/l of its time on one worker; what does not
split shows as waits. On the second 16-core lend (benchmarks/README.md) every kernel split
7.9-9x at 8 workers while each worker waited 25-30% of the solve, mostly for whichever
rank ran slower for a while.

Each rank also reports its process's CPU time in the solve and how much of it its waits
took (their spins and sleeps), and the run the floor those times set on this machine's
cores (``common.cpu_floor``: their sum over the cores, no less than the busiest rank's):
no schedule of that work on these cores ends sooner; without the waits' own CPU, the
floor of the work itself. Where there are more ranks than cores this floor
is what bounds a speed-up: on 2 cores, 1 worker's solve hides the server's CPU on the
second core, 2 workers' cannot.

Output: per rank, the solve's milliseconds, its CPU milliseconds and each timed name's
total; for each worker its waits in all and those at the inner loops' ends (its last
batch done, the server's stop not yet there); the floor; ``results/bench_timeline.json``
holds the machine, the run's history, the CPU total and every event (name, start, end;
seconds from the first rank's solve start).
"""
import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# (module, class or None, names): what the ranks time
TIMED = (("asyncopt.solvers.mpi", None,
          ("svrg_epoch_l1", "svrg_epoch_group", "csr_rmatvec", "_intercept_refit",
           "_anchor_without_optimal_zeros", "_serve_inner", "_work_inner", "dense_move",
           "from_upper_triangle")),
         ("asyncopt.problem", "ActiveSet", ("margins", "without_frozen")),
         ("asyncopt.support_newton", "SupportRows", ("hessian_sums", "trial_sums")))
WAIT = "wait"
TRACE_FLAG = "--trace"     # the rank side's own argument: where rank 0 writes the events
EPOCH_KERNELS = ("svrg_epoch_l1", "svrg_epoch_group")


# --------------------------------------------------------------------------- rank side

def install_timers(events):
    """Wrap TIMED and the waits (``wire.poll``, as solvers/wire.py and channels.py call
    it) so that each call appends (name, start, end, CPU seconds of this process in it)
    to ``events``."""
    import importlib

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((name, start, time.perf_counter(), time.process_time() - cpu))
        return wrapper

    for module_name, class_name, names in TIMED:
        owner = importlib.import_module(module_name)
        if class_name is not None:
            owner = getattr(owner, class_name)
        for name in names:
            setattr(owner, name, timed(name, getattr(owner, name)))
    wire = importlib.import_module("asyncopt.solvers.wire")
    channels = importlib.import_module("asyncopt.solvers.channels")
    wire.poll = channels.poll = timed(WAIT, wire.poll)


def rank_main(argv):
    """Under mpirun: _mpi_run.main(argv less ``--trace PATH``) with the timers; each
    solve_mpi starts a fresh event list, and at its end rank 0 writes every rank's (rank,
    solve start, solve end, events, CPU seconds of the solve) to PATH (the warm-up's
    solve is overwritten by the timed one)."""
    import asyncopt.solvers.mpi as mpi
    from benchmarks import _mpi_run

    at = argv.index(TRACE_FLAG)
    trace, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    events = []
    install_timers(events)
    solve = mpi.solve_mpi

    def traced(comm, *args, **kwargs):
        events.clear()
        start, cpu = time.perf_counter(), time.process_time()
        result = solve(comm, *args, **kwargs)
        ranks = comm.gather((comm.Get_rank(), start, time.perf_counter(), list(events),
                             time.process_time() - cpu), root=0)
        if comm.Get_rank() == 0:
            with open(trace + ".tmp", "w") as f:
                json.dump(ranks, f)
            os.replace(trace + ".tmp", trace)
        return result

    mpi.solve_mpi = traced
    _mpi_run.main(argv)


# --------------------------------------------------------------------------- driver side

def summarise(ranks):
    """Per rank: {"rank", "solve_ms", "cpu_ms" (the process's CPU time in the solve),
    "totals_ms" {name: inclusive ms}, "cpu_totals_ms" {name: CPU ms in it}, and for
    workers "inner_end_wait_ms"}; event times relative to the earliest solve start."""
    origin = min(start for _, start, _, _, _ in ranks)
    out = []
    for rank, start, end, events, cpu in sorted(ranks):
        totals = {}
        cpu_totals = {}
        for name, a, z, c in events:
            totals[name] = totals.get(name, 0.0) + 1e3 * (z - a)
            cpu_totals[name] = cpu_totals.get(name, 0.0) + 1e3 * c
        row = {"rank": rank, "solve_ms": 1e3 * (end - start), "cpu_ms": 1e3 * cpu,
               "totals_ms": totals, "cpu_totals_ms": cpu_totals,
               "events": [(name, a - origin, z - origin) for name, a, z, _ in events]}
        if rank > 0:
            tail = 0.0
            for name, a, z, _ in events:
                if name != "_work_inner":
                    continue
                batches = [zz for nn, aa, zz, _ in events
                           if nn in EPOCH_KERNELS and a <= aa <= z]
                tail += z - max(batches, default=z)
            row["inner_end_wait_ms"] = 1e3 * tail
        out.append(row)
    return out


def format_rank(row):
    totals = sorted(row["totals_ms"].items(), key=lambda item: -item[1])
    head = (f"rank {row['rank']}: solve {row['solve_ms']:.0f} ms, CPU "
            f"{row['cpu_ms']:.0f} ms ({row['cpu_totals_ms'].get(WAIT, 0.0):.0f} in waits)")
    if "inner_end_wait_ms" in row:
        head += (f", waits {row['totals_ms'].get(WAIT, 0.0):.0f} ms "
                 f"({row['inner_end_wait_ms']:.0f} at the inner loops' ends)")
    return head + "\n    " + ", ".join(f"{name} {ms:.1f}" for name, ms in totals)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3, help="mpirun -n K (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    from benchmarks._mpi_run import add_solve_arguments, find_mpirun, launch, solve_options
    add_solve_arguments(parser)
    args = parser.parse_args(argv)
    from benchmarks.bench_serial import DATA_DESCRIPTION
    from asyncopt.cores import available_cores
    from benchmarks.common import RESULTS_DIR, cpu_floor, machine_info, write_json
    if args.ranks < 2:
        parser.error("--ranks: at least 2 (1 server + 1 worker)")
    if find_mpirun(args.mpirun) is None:
        parser.error("no mpirun (pip install mpich)")
    with tempfile.TemporaryDirectory(prefix="bench_timeline_") as workdir:
        trace = os.path.join(workdir, "trace.json")
        run, _, error = launch(
            args.ranks, os.path.join(workdir, "run.json"), seed=args.seed,
            shard_root=args.shards or os.path.join(workdir, "shards"),
            script=os.path.abspath(__file__), **solve_options(args, [TRACE_FLAG, trace]))
        if error:
            print(f"bench_timeline: {error}", file=sys.stderr)
            return 1
        with open(trace) as f:
            ranks = json.load(f)
    rows = summarise(ranks)
    history = run["history"]
    print(f"bench_timeline: mpirun -n {args.ranks}, {args.data} "
          f"({DATA_DESCRIPTION[args.data]}), {args.loss}, lam = {args.lam_ratio:g} "
          f"lam_max, seed {args.seed}: {len(history)} records, certified gap "
          f"{history[-1]['rel_gap']:.1e}; times inclusive, in ms")
    for row in rows:
        print(format_rank(row))
    cores = available_cores()
    cpu = [row["cpu_ms"] for row in rows]
    waits = [row["cpu_totals_ms"].get(WAIT, 0.0) for row in rows]
    cpu_total, waiting = sum(cpu), sum(waits)
    print(f"CPU of all ranks {cpu_total:.0f} ms on {cores} cores: no schedule of this work "
          f"ends before {cpu_floor(cpu, cores):.0f} ms; {waiting:.0f} ms of it in waits "
          f"(spins and sleeps), without which "
          f"{cpu_floor([c - w for c, w in zip(cpu, waits)], cores):.0f} ms")
    path = args.output or os.path.join(RESULTS_DIR, "bench_timeline.json")
    write_json(path, {"benchmark": "bench_timeline", "machine": machine_info(("mpi4py",)),
                      "ranks": args.ranks, "data": args.data, "loss": args.loss,
                      "lam_ratio": args.lam_ratio, "seed": args.seed, "tol": args.tol,
                      "cores": cores, "cpu_ms": cpu_total, "wait_cpu_ms": waiting,
                      "history": history,
                      "per_rank": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    if TRACE_FLAG in sys.argv[1:]:      # a rank under the mpirun that ``main`` started
        rank_main(sys.argv[1:])
    else:
        sys.exit(main())
