"""Distributed benchmark (thesis Figure 2): duality gap against wall time of the MPI backend
-- Dis-DDSS, Dis-DDSS-Naive, Dis-ProxASAGA and Dis-ProxASVRG on the same number of workers
-- and the bytes each run moved through the parameter server.

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_distributed.py [--quick]
        [--workers 2] [--time-cap S] [--repeat N] [--only NAME ...] [--target 1e-6]
        [--reference-from RESULTS.json]

Every (problem, method) is one ``mpirun -n K+1 python benchmarks/_mpi_run.py ...`` (rank 0
the server, K workers on contiguous row shards; the data built identically on every rank);
rank 0 writes solve_mpi's history, read here. Problems: bench_serial.py's (--quick:
ctr_lasso_1e-3 on make_ctr(20_000, 10_000) and a9a_d2_logreg on the first 5,000 rows of a9a
degree 2, 10 s cap, about 2-3 minutes).

Columns: seconds to rel gap 1e-4 and to the target (history's clock, from the start of
solve_mpi; warm-up and data loading excluded), epochs, the server's bytes sent + received
at the end of the run, bytes per epoch, and the bytes ratio against Dis-ProxASVRG: per run,
and at the smallest gap both runs reached. Target: Dis-DDSS bytes per run <= 0.3 x
Dis-ProxASVRG's. --reference-from takes Dis-ProxASVRG's rounds from an earlier results file
(minutes a round) so that Dis-DDSS alone can be rerun against them.

--group-size G: the problems with the group penalty on consecutive groups of G features
(``*_groupG``, as bench_serial's). ``ddss_nonewton`` (Dis-DDSS without the support Newton
step, an ablation) runs only when named in --only.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np


# the repository root, after PYTHONPATH (so PYTHONPATH can point at another asyncopt tree)
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._mpi_run import RANK_ENV, find_mpirun, launch  # noqa: E402
from benchmarks.bench_serial import (DATA_DESCRIPTION, _check, _yes_no, load_data,  # noqa: E402
                                     log, problem_specs, select, source_fingerprint)
from benchmarks.bench_shared import (better, probe_dense_epoch, record_time_to,  # noqa: E402
                                     solve_async, time_to)
from benchmarks.common import (RESULTS_DIR, SolverRun, first_gap_at, format_table,  # noqa: E402
                               from_history, machine_info, run_from_dict, write_json)

METHODS = ("ddss", "ddss_naive", "prox_asaga", "prox_asvrg", "ddss_nonewton")
LABELS = {"ddss": "Dis-DDSS", "ddss_naive": "Dis-DDSS-Naive", "prox_asaga": "Dis-ProxASAGA",
          "prox_asvrg": "Dis-ProxASVRG", "ddss_nonewton": "Dis-DDSS, no Newton step"}
ABLATIONS = ("ddss_nonewton",)      # run only when --only names them
QUICK_PROBLEMS = ("ctr_lasso_1e-3", "a9a_d2_logreg")
LEVEL_1E4 = 1e-4
BYTES_TARGET = 0.3          # Dis-DDSS bytes per run <= 0.3 x Dis-ProxASVRG's
REFERENCE = "prox_asvrg"


# --------------------------------------------------------------------------- one run

def bytes_curve(history):
    """(server bytes sent + received so far, rel gap) at every history record."""
    return [(int(r["bytes_sent"]) + int(r["bytes_recv"]), float(r["rel_gap"]))
            for r in history]


def bytes_to(run, level):
    """Server bytes when ``run`` first reached rel gap ``level`` (None if never)."""
    for nbytes, gap in run.extra.get("bytes_curve", []):
        if gap <= level:
            return nbytes
    return None


PHASES = ("certificate_s", "inner_s", "newton_s")


def phase_timeline(history):
    """The server's clock per record (solve_mpi's ``certificate_s``, ``inner_s``,
    ``newton_s``, with the time, gap, epoch, Newton products and staleness): where a run's
    time went, epoch by epoch; [] for a history without them."""
    keys = ("epoch", "time", "rel_gap", "n_active", "coef_nnz", "newton_step",
            "newton_products", "staleness_mean") + PHASES
    return [{key: r.get(key) for key in keys} for r in history if "inner_s" in r]


def phase_totals(timeline):
    """Each phase's seconds summed over a ``phase_timeline`` (and the products)."""
    totals = {key: float(sum(r[key] for r in timeline)) for key in PHASES}
    totals["newton_products"] = int(sum(r["newton_products"] or 0 for r in timeline))
    return totals


def run_mpi(spec, method, workers, target, cap, seed, args, workdir, epoch_estimate=None,
            extra_args=()):
    """One mpirun of ``method`` on ``spec``: a SolverRun whose curve is the history and
    whose extra holds the bytes, epochs, staleness, the ranks' timings and the server's
    phase timeline. ``extra_args``: more _mpi_run.py flags."""
    out = os.path.join(workdir, f"{spec['name']}_{method}_{seed}.json")
    timeout = 3 * cap + 180 + 3 * (epoch_estimate or 0.0)
    extra = ["--group-size", str(spec["group_size"])] + list(extra_args)
    if method == "ddss_nonewton":
        method, extra = "ddss", extra + ["--no-support-newton"]
    payload, wall, error = launch(workers + 1, out, data=spec["data"], loss=spec["loss"],
                                  lam_ratio=spec["lam_ratio"],
                                  fit_intercept=spec["fit_intercept"], method=method,
                                  tol=target, max_time=cap, seed=seed, timeout=timeout,
                                  mpirun=args.mpirun, extra_args=extra,
                                  shard_root=os.path.join(workdir, "shards"))
    if error:
        return SolverRun(method, False, error=error, extra={"mpirun_wall_s": wall}), None
    history = payload["history"]
    run = from_history(method, history, target,
                       note="" if payload["converged"] else "stopped at the time cap")
    if run.reached and run.time > cap:
        run.reached, run.time, run.note = False, None, "reached after the time cap"
    last = history[-1]
    total = int(last["bytes_sent"]) + int(last["bytes_recv"])
    epochs = max(int(payload["epochs"]), 1)
    run.extra.update(
        workers=workers, n_ranks=workers + 1, converged=payload["converged"],
        lam=payload["lam"], lam_max=payload["lam_max"], P0=history[0]["primal"],
        support=payload["support"], mpirun_wall_s=wall,
        bytes_sent=int(last["bytes_sent"]), bytes_recv=int(last["bytes_recv"]),
        total_bytes=total, bytes_per_epoch=total / epochs,
        bytes_curve=bytes_curve(history),
        staleness_mean=float(last["staleness_mean"]),
        staleness_max_all_epochs=int(max(r["staleness_max"] for r in history)),
        step_factor=float(last["step_factor"]),
        rejected_epochs=int(sum(1 for a, b in zip(history, history[1:])
                                if b["step_factor"] < a["step_factor"])),
        ranks=payload["ranks"], timeline=phase_timeline(history), batch=payload["batch"])
    if run.extra["timeline"]:
        run.extra["phase_totals"] = phase_totals(run.extra["timeline"])
    if epoch_estimate is not None:
        run.extra["estimated_epoch_seconds"] = epoch_estimate
    return run, payload


def probe_asvrg(spec, workers, cores):
    """Seconds of one Dis-ProxASVRG epoch, estimated in this process: bench_shared's probe
    (serial dense epochs of k and 2k rows, extrapolated to n) divided by the workers that
    can run at once. (estimate, k)."""
    X, y = load_data(spec["data"])
    from asyncopt.problem import Problem
    base = Problem(X, y, spec["loss"], lam=1.0, fit_intercept=spec["fit_intercept"])
    problem = base.with_lam(spec["lam_ratio"] * base.lam_max())
    tiny = Problem(X[:200], y[:200], spec["loss"], lam=1.0,
                   fit_intercept=spec["fit_intercept"])
    solve_async(tiny.with_lam(0.2 * tiny.lam_max()), REFERENCE, 1, "numba", tol=1e-5,
                max_epochs=2, random_state=0)                 # compile the dense epoch
    serial, k, _ = probe_dense_epoch(REFERENCE, 1, problem, "numba")
    return serial / max(1, min(workers, cores)), k


# --------------------------------------------------------------------------- main

def add_common_arguments(parser, stem):
    """--target, --mpirun, --output, --no-plot, --replot (shared with bench_speedup)."""
    parser.add_argument("--target", type=float, default=1e-6,
                        help="relative duality gap to reach (default 1e-6)")
    parser.add_argument("--mpirun", default=None,
                        help="mpirun to use (default: next to the interpreter, else PATH)")
    parser.add_argument("--output", default=None,
                        help=f"JSON path (default benchmarks/results/{stem}[_quick].json; "
                             f"the PNG goes next to it)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--replot", metavar="JSON",
                        help="only redraw the PNG (next to JSON) from a results file")


def save_figure(fig, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def load_results(json_path):
    """(payload, PNG path next to it) of a results file, for --replot."""
    import json
    with open(json_path) as f:
        return json.load(f), os.path.splitext(json_path)[0] + ".png"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="CTR 20k x 10k Lasso and a9a (5,000 rows) L1 logistic, 10 s cap:"
                             " a 2-3 minute smoke test")
    parser.add_argument("--workers", type=int, default=2,
                        help="MPI workers (mpirun -n WORKERS+1; default 2)")
    parser.add_argument("--time-cap", type=float, default=None,
                        help="seconds per method and problem, solve_mpi's max_time (default "
                             "120, 10 with --quick); checked between epochs")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every method, interleaved; best of N (default 1)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="keep problems and/or methods whose name contains NAME")
    parser.add_argument("--reference-from", metavar="JSON", default=None,
                        help=f"take the {REFERENCE} rounds from an earlier results file "
                             "(same problems, workers and wire) instead of running them "
                             "again: they take minutes per round, Dis-DDSS seconds")
    parser.add_argument("--no-epoch-probe", action="store_true",
                        help="run Dis-ProxASVRG even when one dense epoch is estimated at "
                             "over 2 x the cap (by default it is then not run: capped)")
    parser.add_argument("--group-size", type=int, default=1, metavar="G",
                        help="the group penalty on consecutive groups of G features "
                             "instead of L1 (problems *_groupG; default 1: L1)")
    add_common_arguments(parser, "bench_distributed")
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    cap = args.time_cap if args.time_cap is not None else (10.0 if args.quick else 120.0)
    target = args.target
    levels = sorted({LEVEL_1E4, target}, reverse=True)
    if args.group_size < 1:
        parser.error(f"--group-size must be >= 1, got {args.group_size}")
    specs = problem_specs(args.quick, args.group_size)
    if args.quick:
        specs = [s for s in specs if s["name"].split("_group")[0] in QUICK_PROBLEMS]
    keep = select([s["name"] for s in specs], args.only)
    specs = [s for s in specs if s["name"] in keep]
    methods = [m for m in select(METHODS, args.only)
               if m not in ABLATIONS or m in args.only]
    reference_runs = {}
    if args.reference_from:
        reference_runs, reference_info = load_reference(args.reference_from, args.workers)
        if REFERENCE not in methods:
            methods = methods + [REFERENCE]
    stem = ("bench_distributed_quick" if args.quick else "bench_distributed") + \
        (f"_group{args.group_size}" if args.group_size > 1 else "")
    json_path = args.output or os.path.join(RESULTS_DIR, stem + ".json")
    png_path = os.path.splitext(json_path)[0] + ".png"

    info = machine_info(("mpi4py", "matplotlib"))
    info["asyncopt_source"] = source_fingerprint()
    info["mpirun"] = find_mpirun(args.mpirun)
    info["rank_env"] = {k: os.environ.get(k, v) for k, v in RANK_ENV.items()}
    cores = info["cpu_count"] or 1
    n_ranks = args.workers + 1
    info["oversubscribed"] = n_ranks > cores
    if args.reference_from:
        info["reference_from"] = {"path": os.path.abspath(args.reference_from),
                                  **reference_info}
    log(f"bench_distributed: {cores} cores, {info['cpu_model']}, mpirun {info['mpirun']}, "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    log(f"{args.workers} workers (mpirun -n {n_ranks}"
        + (", more ranks than cores: oversubscribed" if n_ranks > cores else "")
        + f"), target gap <= {target:g} * P(0), time cap {cap:g} s, repeat {args.repeat}, "
          f"problems {[s['name'] for s in specs]}, methods {methods}")
    if info["mpirun"] is None:
        log("error: no mpirun (pip install mpich)")
        return 1

    state = dict(results={}, problems=[], t_start=time.perf_counter())
    with tempfile.TemporaryDirectory(prefix="bench_distributed_") as workdir:
        for spec in specs:
            runs, meta = run_problem(spec, methods, args.workers, target, cap, args,
                                     workdir, cores, reference_runs.get(spec["name"]))
            state["results"][spec["name"]] = runs
            state["problems"].append({**meta,
                                      "runs": {k: v.as_dict() for k, v in runs.items()}})
            report(specs, state, methods, levels, cap, target, args, info, json_path,
                   png_path, final=False)
    report(specs, state, methods, levels, cap, target, args, info, json_path, png_path,
           final=True)
    return 0


def load_reference(json_path, workers):
    """({problem: the REFERENCE run, its rounds in extra.bytes_rounds}, where they came
    from) of an earlier bench_distributed results file with the same worker count."""
    payload, _ = load_results(json_path)
    if payload.get("workers") != workers:
        raise SystemExit(f"--reference-from {json_path}: {payload.get('workers')} workers, "
                         f"not {workers}")
    runs = {p["name"]: run_from_dict(p["runs"][REFERENCE]) for p in payload["problems"]
            if REFERENCE in p.get("runs", {})}
    machine = payload.get("machine", {})
    return runs, {"date": machine.get("date"), "time_cap_s": payload.get("time_cap_s"),
                  "repeat": payload.get("repeat"),
                  "asyncopt_source": machine.get("asyncopt_source")}


def run_problem(spec, methods, workers, target, cap, args, workdir, cores, reference=None):
    """Every method on one problem, ``args.repeat`` interleaved rounds: ({method: best
    run}, the problem's description for the JSON). ``reference``: the REFERENCE run
    loaded from an earlier file (``--reference-from``), not run again."""
    log(f"\n== {spec['name']}: {DATA_DESCRIPTION[spec['data']]}, {spec['loss']}, "
        f"lam = {spec['lam_ratio']:g} lam_max, fit_intercept={spec['fit_intercept']}")
    if reference is not None:
        methods = [m for m in methods if m != REFERENCE]
        log(f"  {REFERENCE}: {len(reference.extra.get('bytes_rounds', []))} rounds from "
            f"{args.reference_from}")
    estimate = None
    if REFERENCE in methods and not args.no_epoch_probe:
        t0 = time.perf_counter()
        estimate, k = probe_asvrg(spec, workers, cores)
        log(f"  {REFERENCE} probe: one epoch ~{estimate:.1f} s on {workers} workers (serial "
            f"dense epochs of {k} and {2 * k} rows extrapolated; "
            f"{time.perf_counter() - t0:.1f} s)")
    best, meta, rounds = {}, {}, {}
    for rep in range(max(1, args.repeat)):
        for method in (methods if rep % 2 == 0 else methods[::-1]):
            t0 = time.perf_counter()
            if method == REFERENCE and estimate is not None and estimate > 2 * cap:
                run = SolverRun(method, False,
                                note=f"not run: one epoch estimated at {estimate:.0f} s "
                                     f"> 2 x cap",
                                extra={"estimated_epoch_seconds": estimate,
                                       "workers": workers})
                payload = None
            else:
                run, payload = run_mpi(spec, method, workers, target, cap, rep, args,
                                       workdir, estimate if method == REFERENCE else None)
            if payload and not meta:
                first = payload["history"][0]
                meta = {k: payload[k] for k in ("n_samples", "n_features", "nnz", "lam",
                                                "lam_max", "mpi_library")}
                meta["P0"] = first["primal"]
            if better(run, best.get(method)):
                best[method] = run
            if not run.error and "total_bytes" in run.extra:
                # the gap reached, in or after the time cap: the bytes count to the
                # target either way (a run stops once it converges)
                rounds.setdefault(method, []).append(
                    {"total_bytes": run.extra["total_bytes"],
                     "reached_gap": run.best_rel_gap is not None and
                     run.best_rel_gap <= target, "epochs": run.extra.get("epochs")})
            _log_run(rep, method, run, levels_of(target), cap, time.perf_counter() - t0)
    for method, kept in best.items():
        kept.extra["bytes_rounds"] = rounds.get(method, [])
    if reference is not None:
        best[REFERENCE] = reference
        methods = methods + [REFERENCE]
    meta = {**spec, "data_description": DATA_DESCRIPTION[spec["data"]], **meta,
            "workers": workers, "n_ranks": workers + 1}
    return {m: best[m] for m in methods if m in best}, meta


def levels_of(target):
    return sorted({LEVEL_1E4, target}, reverse=True)


def _log_run(rep, method, run, levels, cap, wall):
    if run.error:
        log(f"  [{rep}] {method:11s} ERROR {run.error}")
        return
    e = run.extra
    times = "  ".join(f"{lv:g}: {_cell(run, lv, cap):>6s}" for lv in levels)
    best = "-" if run.best_rel_gap is None else f"{run.best_rel_gap:.1e}"
    log(f"  [{rep}] {method:11s} {times}  best {best}  (mpirun {wall:.1f} s)")
    if run.note.startswith("not run"):
        log(f"        {run.note}")
        return
    log(f"        epochs {e.get('epochs')}, active {e.get('final_active')}/"
        f"{e.get('n_features')}, bytes {_mb(e.get('total_bytes'))} MB "
        f"({_mb(e.get('bytes_per_epoch'))} MB/epoch), staleness mean "
        f"{e.get('staleness_mean', 0):.1f} max {e.get('staleness_max_all_epochs')}, "
        f"step factor {e.get('step_factor')}")


def _cell(run, level, cap):
    if run is None:
        return "-"
    if run.error:
        return "error"
    t = time_to(run, level, cap)
    return f">{cap:g}" if t is None else f"{t:.2f}"


def _mb(nbytes):
    return "-" if nbytes is None else f"{nbytes / 1e6:.3g}"


# --------------------------------------------------------------------------- bytes ratios

def bytes_ratio(run, ref):
    """Bytes per run of ``run`` over ``ref`` as (value, text, kind): exact when both reached
    the target; a run stopped at the cap would have needed more bytes, so its count is a
    lower bound ('upper' when only ref was stopped, 'lower' when only run was)."""
    if run is None or ref is None or run.error or ref.error or \
            "total_bytes" not in run.extra or "total_bytes" not in ref.extra:
        return None, "-", None
    v = run.extra["total_bytes"] / max(ref.extra["total_bytes"], 1)
    if run.reached and ref.reached:
        return v, f"{v:.3g}", "exact"
    if run.reached:
        return v, f"<{v:.3g}", "upper"
    if ref.reached:
        return v, f">{v:.3g}", "lower"
    return v, f"~{v:.3g}", None


def matched_gap_ratio(run, ref):
    """(ratio of the bytes each needed to reach the smallest gap both reached, that gap)."""
    if run is None or ref is None or run.error or ref.error or \
            run.best_rel_gap is None or ref.best_rel_gap is None:
        return None, None
    level = max(run.best_rel_gap, ref.best_rel_gap)
    a, b = bytes_to(run, level), bytes_to(ref, level)
    if a is None or not b:
        return None, level
    return a / b, level


def median_bytes_ratio(run, ref):
    """Over the rounds (``--repeat``): (median of Dis-DDSS's bytes per run over the median of
    the reference's, DDSS's lowest and highest over that median, DDSS rounds, kind); None
    with fewer than two rounds of either. A round that did not reach the target gap
    (stopped at the cap) counts its bytes as a lower bound, so the median is one too:
    kind 'exact', 'upper' (only the reference has such rounds), 'lower' (only DDSS) or
    None (both). Bytes follow the epoch count, which varies from round to round with the
    timing of the asynchronous steps (CTR 1e-4 lam_max, 2 workers: Dis-DDSS 9-17 epochs,
    93-147 MB; Dis-ProxASVRG 24-31 epochs, 266-391 MB)."""
    if run is None or ref is None:
        return None
    mine = run.extra.get("bytes_rounds", [])
    theirs = ref.extra.get("bytes_rounds", [])
    if len(mine) < 2 or len(theirs) < 2:
        return None
    base = float(np.median([r["total_bytes"] for r in theirs]))
    values = [r["total_bytes"] for r in mine]
    mine_capped = not all(r["reached_gap"] for r in mine)
    theirs_capped = not all(r["reached_gap"] for r in theirs)
    kind = {(False, False): "exact", (False, True): "upper",
            (True, False): "lower"}.get((mine_capped, theirs_capped))
    return (float(np.median(values)) / base, min(values) / base, max(values) / base,
            len(values), kind)


def targets_report(results):
    """Dis-DDSS bytes per run <= 0.3 x Dis-ProxASVRG's, on every problem: (lines, dict).
    With two or more rounds of both the verdict is on the median ratio
    (``median_bytes_ratio``), else on the kept (fastest) rounds."""
    lines, out = [], {}
    for name, runs in results.items():
        ddss, ref = runs.get("ddss"), runs.get(REFERENCE)
        if ddss is None or ref is None:
            continue
        v, shown, kind = bytes_ratio(ddss, ref)
        median = median_bytes_ratio(ddss, ref)
        if median is not None:
            v, kind = median[0], median[4]
            mark = {"exact": "", "upper": "<", "lower": ">"}.get(kind, "~")
            shown = (f"median {mark}{median[0]:.3g} over {median[3]} rounds "
                     f"({median[1]:.3g}-{median[2]:.3g})")
        ok = _check(v, kind, "<=", BYTES_TARGET)
        mv, level = matched_gap_ratio(ddss, ref)
        label = f"{name}: ddss/{REFERENCE} bytes <= {BYTES_TARGET}"
        per_epoch = None
        if "bytes_per_epoch" in ddss.extra and ref.extra.get("bytes_per_epoch"):
            per_epoch = ddss.extra["bytes_per_epoch"] / ref.extra["bytes_per_epoch"]
        out[label] = {"met": ok, "ratio": v, "ratio_text": shown, "ratio_kind": kind,
                      "median_ratio_rounds": None if median is None else {
                          "median": median[0], "lowest": median[1], "highest": median[2],
                          "rounds": median[3], "kind": median[4]},
                      "matched_gap": level, "matched_gap_ratio": mv,
                      "matched_gap_met": None if mv is None else mv <= BYTES_TARGET,
                      "per_epoch_ratio": per_epoch}
        why = "" if ok is not None else (
            " (ProxASVRG not run)" if ref.note.startswith("not run") else
            " (both stopped at the cap)" if not ddss.reached and not ref.reached else
            " (ProxASVRG stopped at the cap: its bytes per run are a lower bound)")
        matched = "-" if mv is None else (
            f"{mv:.3g} -> {_yes_no(mv <= BYTES_TARGET)}")
        lines.append(f"{name}: Dis-DDSS bytes per run <= {BYTES_TARGET} x Dis-ProxASVRG's: "
                     f"{shown} -> {_yes_no(ok)}{why}; bytes to the gap both reached"
                     f" ({'-' if level is None else f'{level:.1e}'}): {matched}; per epoch:"
                     f" {'-' if per_epoch is None else f'{per_epoch:.3g}'}")
    return lines, out


# --------------------------------------------------------------------------- report

def table_rows(specs, results, methods, levels, cap):
    header = ["problem", "method"] + [f"s to {lv:g}" for lv in levels] + \
        ["epochs", "best gap", "MB total", "MB/epoch", f"bytes/{REFERENCE}",
         "@gap both reached", "mpirun s"]
    rows = []
    for spec in specs:
        runs = results.get(spec["name"])
        if not runs:
            continue
        ref = runs.get(REFERENCE)
        for m in methods:
            run = runs.get(m)
            if run is None:
                continue
            e = run.extra
            mv, level = matched_gap_ratio(run, ref)
            row = [spec["name"], m] + [_cell(run, lv, cap) for lv in levels]
            row += [e.get("epochs", "-"),
                    "-" if run.best_rel_gap is None else f"{run.best_rel_gap:.1e}",
                    _mb(e.get("total_bytes")), _mb(e.get("bytes_per_epoch")),
                    bytes_ratio(run, ref)[1],
                    "-" if mv is None else f"{mv:.3g} @{level:.0e}",
                    "-" if "mpirun_wall_s" not in e else f"{e['mpirun_wall_s']:.1f}"]
            if run.error:
                row[-1] = "error"
            elif run.note.startswith("not run"):
                row[2 + len(levels) + 2] = "not run"
            rows.append(row)
    return header, rows


def report(specs, state, methods, levels, cap, target, args, info, json_path, png_path,
           final):
    """Table, targets, JSON and PNG of the problems done so far (after each problem)."""
    results = state["results"]
    header, rows = table_rows(specs, results, methods, levels, cap)
    table = format_table(header, rows)
    target_lines, met = targets_report(results)
    record_time_to(state["problems"], results, levels, cap)
    if final:
        log(f"\nDis-* on {args.workers} workers (mpirun -n {args.workers + 1}): seconds to "
            f"rel gap (>cap: not reached in {cap:g} s), server bytes sent + received per "
            f"run; bytes/{REFERENCE}: per run ('<' / '>': a side stopped at the cap), and "
            f"at the smallest gap both runs reached\n")
        log(table)
        if target_lines:
            log("\ntarget (Dis-DDSS bytes per run <= 0.3 x Dis-ProxASVRG's)"
                + (", quick sizes" if args.quick else "") + ":")
            for line in target_lines:
                log("  " + line)
    payload = {
        "benchmark": "bench_distributed", "quick": args.quick, "complete": final,
        "target_rel_gap": target, "levels": levels, "time_cap_s": cap,
        "repeat": args.repeat, "workers": args.workers, "n_ranks": args.workers + 1,
        "machine": info, "total_seconds": time.perf_counter() - state["t_start"],
        "methods": {m: LABELS[m] for m in methods},
        "problems": state["problems"], "table": {"header": header, "rows": rows},
        "table_text": table, "targets": met, "targets_text": target_lines,
        "method": {
            "run": "one `mpirun -n workers+1 python benchmarks/_mpi_run.py` per method, "
                   "problem and round: every rank builds the data (bench_serial.load_data),"
                   " workers take contiguous row shards, lam = lam_ratio * "
                   "distributed_lam_max; a warm-up solve of the same method on a tiny "
                   "problem, a barrier, then solve_mpi(tol=target, max_time=cap)",
            "time": "solve_mpi's history clock (from the start of the solve; data loading, "
                    "numba loading and MPI start-up excluded; extra.mpirun_wall_s has the "
                    "whole mpirun); a level reached after the cap counts as not reached",
            "bytes": "the server's bytes_sent + bytes_recv (collectives and messages, "
                     "Wire counters) at the last history record; extra.bytes_curve has "
                     "(bytes, rel gap) at every record",
            "ratios": "bytes per run: exact when both reached the target, a bound when one "
                      "stopped at the cap; matched gap: bytes to the smallest gap both runs "
                      "reached",
            "asvrg_probe": "bench_shared.probe_dense_epoch (serial dense epochs of k and 2k "
                           "rows, extrapolated) / workers; over 2 x cap: not run",
            "repeat": "rounds interleave the methods (odd rounds reversed); each keeps the "
                      "round reaching the target soonest, else the lowest gap; "
                      "extra.bytes_rounds has every round's bytes, and with two or more "
                      "rounds of both methods the bytes target is judged on the median "
                      "ratio (a round that did not reach the gap counts as a lower "
                      "bound)",
        },
    }
    write_json(json_path, payload)
    if not args.no_plot and results:
        plot_distributed(png_path, specs, results, target, cap, info, args.workers)
    if final:
        log(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {png_path}"))


def plot_distributed(path, specs, results, target, cap, info, workers):
    """Per problem (a column): gap / P(0) against seconds (top), total bytes per method
    (bottom, hatched where the run stopped at the cap)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [s for s in specs if s["name"] in results]
    colour = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(METHODS)}
    ncols = max(len(panels), 1)
    fig, axes = plt.subplots(2, ncols, figsize=(5.6 * ncols, 7.6), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for col, spec in enumerate(panels):
        runs = results[spec["name"]]
        ax = axes[0, col]
        for method, run in runs.items():
            points = [(t, g) for t, g in run.curve if g is not None and g > 0]
            if not points:
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, color=colour[method], lw=1.5, label=LABELS[method],
                    marker="o" if len(points) < 15 else None, ms=3)
            if run.reached:
                ax.plot(run.time, first_gap_at(run), "*", color=colour[method], ms=11,
                        mec="k")
        ax.axhline(target, color="k", ls="--", lw=0.7)
        ax.axhline(LEVEL_1E4, color="grey", ls="--", lw=0.5)
        ax.axvline(cap, color="grey", ls=":", lw=0.8)
        ax.set(yscale="log", xlabel="seconds", ylabel="duality gap / P(0)",
               title=f"{spec['name']} (lam={spec['lam_ratio']:g} lam_max)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1, col]
        names = [m for m in METHODS if m in runs]
        values = [runs[m].extra.get("total_bytes", 0) / 1e6 for m in names]
        bars = ax.barh(range(len(names)), values, color=[colour[m] for m in names])
        for bar, m, v in zip(bars, names, values):
            run = runs[m]
            if not run.reached:
                bar.set_hatch("//")
            text = ("not run" if run.note.startswith("not run") else
                    "error" if run.error else
                    f"{v:.3g} MB" + ("" if run.reached else " (capped)"))
            ax.text(max(v, 1e-3), bar.get_y() + bar.get_height() / 2, " " + text,
                    va="center", fontsize=8)
        ax.set_yticks(range(len(names)), [LABELS[m] for m in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(left=max(min([v for v in values if v > 0], default=1) / 3, 1e-3),
                    right=max(values + [1e-3]) * 8)
        ax.set_xlabel("MB through the server per run (sent + received; log)")
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"MPI, {workers} workers (mpirun -n {workers + 1}): gap vs seconds and "
                 f"bytes ({info['cpu_count']} cores, {info['cpu_model']}, "
                 f"{info['date'][:10]})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return save_figure(fig, path)


def replot(json_path):
    payload, png_path = load_results(json_path)
    results = {p["name"]: {k: run_from_dict(v) for k, v in p["runs"].items()}
               for p in payload["problems"]}
    plot_distributed(png_path, payload["problems"], results, payload["target_rel_gap"],
                     payload["time_cap_s"], payload["machine"], payload["workers"])
    log(f"wrote {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
