"""Where each rank's time goes in one Dis-DDSS solve: the workers' kernels, the server's
inner loop and dense Newton solve, the synchronous rounds and every wait (``wire.poll``),
timed on every rank of ``mpirun -n K`` around ``_mpi_run.py``'s solve (its warm-up is not
recorded).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_timeline.py --ranks 9 --data ctr_tall

Each timed function is wrapped where solvers/mpi.py calls it, so the times are inclusive
(``work_epoch`` holds the worker's SVRG batches and its waits for replies). A worker
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

Where the cores idle (``idle_cores``): the core-ms that the ranks left unused while
fewer of them computed than there were cores, split by what the computing ones did. On
2 cores that is what 2 workers lose against the floor: CTR at -n 3, 18% of the cores'
time, a fifth of it with the server deciding alone.

Output: per rank, the solve's milliseconds, its CPU milliseconds (with those spent in the
kernel and the minor page faults: on the 2-core VM the first touch of new memory costs
~1-2.5 us a 4 KB page, a quarter of a rank's CPU in some solves) and each timed name's
total; for each worker its waits in all and those at the inner loops' ends (its last
batch done, the server's stop not yet there); the floor; the idle cores;
``results/bench_timeline.json`` holds the machine, the run's history, the CPU total, the
idle cores and every event (name, start, end; seconds from the first rank's solve start).

Where the ranks ran (``shared_cores``): each timed call notes the logical CPU it ended on,
and the run names the ranks whose main CPUs are two logical CPUs of one physical core
(``common.smt_siblings``; ``placement`` in the JSON). On the third 16-core lend the same
work took 370-393 CPU ms on some workers and 482-525 on others for the whole solve;
whether those shared physical cores was not recorded.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# (module, class or None, names): what the ranks time
TIMED = (("asyncopt.kernels.svrg", None, ("svrg_epoch_l1", "svrg_epoch_group")),
         ("asyncopt.solvers.mpi.worker", None,
          ("csr_rmatvec", "intercept_refit", "receive_anchor", "work_epoch")),
         ("asyncopt.solvers.mpi.server", None,
          ("intercept_refit", "send_anchor", "serve_epoch")),
         ("asyncopt.solvers.mpi.newton", None,
          ("dense_move", "from_upper_triangle", "lower_from_upper_triangle")),
         # a worker's certificate takes A^T rho through ActiveSet.residual_correlation_at
         ("asyncopt.problem", None, ("csr_rmatvec",)),
         ("asyncopt.problem", "ActiveSet", ("margins", "without_frozen")),
         ("asyncopt.newton.kernels", "SupportRows",
          ("hessian_sums", "hessian_triangle", "hessian_rows", "trial_sums")))
WAIT = "wait"
TRACE_FLAG = "--trace"     # the rank side's own argument: where rank 0 writes the events
EPOCH_KERNELS = ("svrg_epoch_l1", "svrg_epoch_group")


# --------------------------------------------------------------------------- rank side

def install_timers(events):
    """Wrap TIMED and the waits (``wire.poll``, as comm/wire.py and channels.py call
    it) so that each call appends (name, start, end, CPU seconds of this process in it,
    minor page faults of the calling thread in it, the logical CPU it ended on) to
    ``events``."""
    import importlib
    import resource

    current_cpu = running_cpu()

    def thread_faults():
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start, cpu, faults = time.perf_counter(), time.process_time(), thread_faults()
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((name, start, time.perf_counter(), time.process_time() - cpu,
                               thread_faults() - faults, current_cpu()))
        return wrapper

    for module_name, class_name, names in TIMED:
        owner = importlib.import_module(module_name)
        if class_name is not None:
            owner = getattr(owner, class_name)
        for name in names:
            setattr(owner, name, timed(name, getattr(owner, name)))
    wire = importlib.import_module("asyncopt.comm.wire")
    channels = importlib.import_module("asyncopt.comm.channels")
    wire.poll = channels.poll = timed(WAIT, wire.poll)


def running_cpu():
    """A function that returns the logical CPU the calling thread runs on (glibc's
    ``sched_getcpu``, a vDSO call of well under a microsecond), or -1 where there is
    none."""
    import ctypes
    try:
        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (AttributeError, OSError):
        return lambda: -1
    getcpu.restype = ctypes.c_int
    return getcpu


def kernel_usage():
    """[seconds of this process's CPU spent in the kernel, minor page faults] so far
    (``getrusage``): the page faults of first-touched memory are most of the kernel's
    share of a solve (zeroing each 4 KB page; on the 2-core VM ~1-2.5 us a fault)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return [usage.ru_stime, usage.ru_minflt]


def rank_main(argv):
    """Under mpirun: _mpi_run.main(argv less ``--trace PATH``) with the timers; each
    solve_mpi starts a fresh event list, and at its end rank 0 writes every rank's (rank,
    solve start, solve end, events, CPU seconds of the solve, ``kernel_usage`` in the
    solve) to PATH (the warm-up's solve is overwritten by the timed one)."""
    import asyncopt.solvers.mpi as mpi
    from benchmarks import _mpi_run

    at = argv.index(TRACE_FLAG)
    trace, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    events = []
    install_timers(events)
    solve = mpi.solve_mpi

    def traced(comm, *args, **kwargs):
        events.clear()
        start, cpu, usage = time.perf_counter(), time.process_time(), kernel_usage()
        result = solve(comm, *args, **kwargs)
        end, cpu = time.perf_counter(), time.process_time() - cpu
        usage = [after - before for after, before in zip(kernel_usage(), usage)]
        ranks = comm.gather((comm.Get_rank(), start, end, list(events), cpu, *usage),
                            root=0)
        if comm.Get_rank() == 0:
            with open(trace + ".tmp", "w") as f:
                json.dump(ranks, f)
            os.replace(trace + ".tmp", trace)
        return result

    mpi.solve_mpi = traced
    _mpi_run.main(argv)


# --------------------------------------------------------------------------- driver side

def summarise(ranks):
    """Per rank: {"rank", "start_s" (its solve's start), "solve_ms", "cpu_ms" (the
    process's CPU time in the solve), "system_ms" (of it in the kernel), "page_faults",
    "totals_ms" {name: inclusive ms}, "cpu_totals_ms" {name: CPU ms in it},
    "fault_totals" {name: the calling thread's minor page faults in it}, "cpus" [[logical
    CPU, timed calls that ended on it], ...] most first, and for workers
    "inner_end_wait_ms"}; event times relative to the earliest solve start."""
    origin = min(rank[1] for rank in ranks)
    out = []
    for rank, start, end, events, cpu, system, faults in sorted(ranks):
        totals = {}
        cpu_totals = {}
        fault_totals = {}
        cpus = {}
        for name, a, z, c, f, on in events:
            totals[name] = totals.get(name, 0.0) + 1e3 * (z - a)
            cpu_totals[name] = cpu_totals.get(name, 0.0) + 1e3 * c
            fault_totals[name] = fault_totals.get(name, 0) + int(f)
            cpus[on] = cpus.get(on, 0) + 1
        row = {"rank": rank, "start_s": start - origin, "solve_ms": 1e3 * (end - start),
               "cpu_ms": 1e3 * cpu,
               "system_ms": 1e3 * system, "page_faults": int(faults),
               "totals_ms": totals, "cpu_totals_ms": cpu_totals,
               "fault_totals": fault_totals,
               "cpus": sorted(([cpu, count] for cpu, count in cpus.items()),
                              key=lambda item: -item[1]),
               "events": [(name, a - origin, z - origin) for name, a, z, *_ in events]}
        if rank > 0:
            tail = 0.0
            for name, a, z, *_ in events:
                if name != "work_epoch":
                    continue
                batches = [zz for nn, aa, zz, *_ in events
                           if nn in EPOCH_KERNELS and a <= aa <= z]
                tail += z - max(batches, default=z)
            row["inner_end_wait_ms"] = 1e3 * tail
        out.append(row)
    return out


IDLE_BIN_S = 1e-4      # the idle cores' time is counted on this grid
IDLE_SHOWN = 6         # the activities the idle line names


def idle_cores(rows, cores):
    """Where the cores idle: on a grid of IDLE_BIN_S from the first solve's start to the
    last one's end, the cores that min(cores, ranks) could keep busy less the ranks
    then busy (in their solve and not in a wait), summed in core-ms, and that sum split
    by what the busy ranks were doing (each one's innermost timed name, "other" outside
    them): {"idle_core_ms", "span_core_ms" (the usable cores' time on that grid),
    "by_activity": [[activity, core-ms], ...] largest first}.
    On 2 cores, 2 workers lose to it what a perfect schedule of the same work would
    not: the server deciding alone, one worker's tail while the other waits."""
    def bin_of(seconds):
        return int(round(seconds / IDLE_BIN_S))

    bins = max(bin_of(row["start_s"] + row["solve_ms"] / 1e3) for row in rows)
    names = ["other"]
    busy = np.zeros((len(rows), bins), dtype=bool)
    doing = np.zeros((len(rows), bins), dtype=np.int64)
    for at, row in enumerate(rows):
        start = row["start_s"]
        busy[at, bin_of(start):bin_of(start + row["solve_ms"] / 1e3)] = True
        # nested events: the later start (the inner one) paints over the outer
        for name, a, z in sorted(row["events"], key=lambda event: (event[1], -event[2])):
            a, z = bin_of(a), bin_of(z)
            if name == WAIT:
                busy[at, a:z] = False
            else:
                if name not in names:
                    names.append(name)
                doing[at, a:z] = names.index(name)
    usable = min(cores, len(rows))
    idle = np.maximum(usable - busy.sum(axis=0), 0) * IDLE_BIN_S * 1e3
    by_activity = {}
    for k in np.flatnonzero(idle):
        label = activity_label([(row["rank"], names[doing[at, k]])
                                for at, row in enumerate(rows) if busy[at, k]])
        by_activity[label] = by_activity.get(label, 0.0) + float(idle[k])
    return {"idle_core_ms": float(idle.sum()),
            "span_core_ms": usable * bins * IDLE_BIN_S * 1e3,
            "by_activity": sorted(([label, ms] for label, ms in by_activity.items()),
                                  key=lambda item: -item[1])}


def activity_label(busy):
    """"server dense_move, 1 worker svrg_epoch_l1" for [(rank, name), ...] of the busy
    ranks; "every rank waits" when none is."""
    if not busy:
        return "every rank waits"
    parts = [f"server {name}" for rank, name in busy if rank == 0]
    counts = {}
    for rank, name in busy:
        if rank:
            counts[name] = counts.get(name, 0) + 1
    parts += [f"{k} worker{'s' if k > 1 else ''} {name}"
              for name, k in sorted(counts.items())]
    return ", ".join(parts)


def shared_cores(rows, siblings):
    """Where the ranks ran: ([rank, its main CPU (where most of its timed calls ended),
    that CPU's share of them] per rank, [[rank, rank, cpu, cpu], ...] the pairs whose
    main CPUs are two logical CPUs of one physical core (``siblings``:
    ``common.smt_siblings``), [[rank, rank, cpu], ...] the pairs on the same CPU)."""
    core_of = {cpu: index for index, group in enumerate(siblings) for cpu in group}
    placed = []
    for row in rows:
        if row.get("cpus"):
            cpu, count = row["cpus"][0]
            placed.append([row["rank"], cpu, count / sum(c for _, c in row["cpus"])])
    smt, same = [], []
    for i, (rank_a, cpu_a, _) in enumerate(placed):
        for rank_b, cpu_b, _ in placed[i + 1:]:
            if cpu_a == cpu_b:
                same.append([rank_a, rank_b, cpu_a])
            elif cpu_a in core_of and core_of.get(cpu_b) == core_of[cpu_a]:
                smt.append([rank_a, rank_b, cpu_a, cpu_b])
    return placed, smt, same


def format_placement(placed, smt, same, siblings):
    """One line for ``shared_cores``' answer."""
    line = "ranks on CPUs (share of timed calls): " + ", ".join(
        f"{rank}: {cpu} ({share:.0%})" for rank, cpu, share in placed)
    if not siblings:
        line += "; no physical core has several logical CPUs here"
    else:
        line += "; one physical core: " + (", ".join(
            f"ranks {a} and {b} (CPUs {x}, {y})" for a, b, x, y in smt) or "no two ranks")
    if same:
        line += "; one CPU: " + ", ".join(f"ranks {a} and {b} ({cpu})"
                                          for a, b, cpu in same)
    return line


def format_rank(row):
    totals = sorted(row["totals_ms"].items(), key=lambda item: -item[1])
    head = (f"rank {row['rank']}: solve {row['solve_ms']:.0f} ms, CPU "
            f"{row['cpu_ms']:.0f} ms ({row['cpu_totals_ms'].get(WAIT, 0.0):.0f} in waits, "
            f"{row['system_ms']:.0f} in the kernel, {row['page_faults']} page faults)")
    if "inner_end_wait_ms" in row:
        head += (f", waits {row['totals_ms'].get(WAIT, 0.0):.0f} ms "
                 f"({row['inner_end_wait_ms']:.0f} at the inner loops' ends)")
    faults = sorted(((name, f) for name, f in row.get("fault_totals", {}).items() if f),
                    key=lambda item: -item[1])
    return (head + "\n    " + ", ".join(f"{name} {ms:.1f}" for name, ms in totals) +
            "\n    page faults (inclusive): " +
            ", ".join(f"{name} {f}" for name, f in faults))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3, help="mpirun -n K (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    from benchmarks._mpi_run import add_solve_arguments, find_mpirun, launch, solve_options
    add_solve_arguments(parser)
    args = parser.parse_args(argv)
    from benchmarks.bench_serial import DATA_DESCRIPTION
    from asyncopt.runtime import available_cores
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
    idle = idle_cores(rows, cores)
    span = idle["span_core_ms"]
    print(f"cores idle {idle['idle_core_ms']:.0f} of {span:.0f} core-ms "
          f"({idle['idle_core_ms'] / span:.0%}), while: " + "; ".join(
              f"{label} {ms:.1f}" for label, ms in idle["by_activity"][:IDLE_SHOWN]))
    machine = machine_info(("mpi4py",))
    placed, smt, same = shared_cores(rows, machine["smt_siblings"])
    print(format_placement(placed, smt, same, machine["smt_siblings"]))
    path = args.output or os.path.join(RESULTS_DIR, "bench_timeline.json")
    write_json(path, {"benchmark": "bench_timeline", "machine": machine,
                      "ranks": args.ranks, "data": args.data, "loss": args.loss,
                      "lam_ratio": args.lam_ratio, "seed": args.seed, "tol": args.tol,
                      "cores": cores, "cpu_ms": cpu_total, "wait_cpu_ms": waiting,
                      "history": history, "idle": idle,
                      "placement": {"ranks": placed, "one_physical_core": smt,
                                    "one_cpu": same},
                      "per_rank": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    if TRACE_FLAG in sys.argv[1:]:      # a rank under the mpirun that ``main`` started
        rank_main(sys.argv[1:])
    else:
        sys.exit(main())
