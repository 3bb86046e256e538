"""Shared helpers for the benchmark scripts: machine info, time-to-gap measurement (asyncopt
history, tolerance sequences for external solvers, per-epoch callbacks), result tables,
JSON and PNG writing.

Every gap is *our* duality gap (DESIGN 1): for a coefficient vector returned by any solver,
``problem.certificate(coef, intercept).gap / P0`` with ``P0 = problem.zero_certificate()
.primal``. The certificate refits the intercept (when the problem has one) before computing
the dual point, so an external solver is never penalised for a slightly off intercept.
"""
import contextlib
import datetime
import json
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# --------------------------------------------------------------------------- machine info

def cpu_model():
    """The CPU model name from /proc/cpuinfo (or platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def total_memory_gb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    return None


def smt_siblings(root="/sys/devices/system/cpu"):
    """The logical CPUs that share a physical core, as sorted groups of two or more
    (Linux's ``topology/thread_siblings_list``; [] where no core has several, or the
    topology is not readable). Ranks on two CPUs of one group share that core's units:
    on the 16-core lends some workers ran the same work 1.4x slower for a whole solve
    (benchmarks/README.md), and bench_timeline names which ranks shared a core."""
    groups = set()
    try:
        names = [n for n in os.listdir(root) if n.startswith("cpu") and n[3:].isdigit()]
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(root, name, "topology", "thread_siblings_list")) as f:
                text = f.read().strip()
        except OSError:
            continue
        cpus = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        if len(cpus) > 1:
            groups.add(tuple(sorted(cpus)))
    return [list(group) for group in sorted(groups)]


def package_versions(names):
    """{name: version or None} for the importable packages among ``names``."""
    out = {}
    for name in names:
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "unknown")
        except Exception:  # noqa: BLE001 - a missing optional peer is just reported
            out[name] = None
    return out


def git_revision(path=None):
    path = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        import subprocess
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=path,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("+dirty" if dirty else "") if rev else None
    except Exception:  # noqa: BLE001
        return None


def machine_info(extra_packages=()):
    """Cores, CPU model, memory, OS, python and library versions, date, git revision."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gb": total_memory_gb(),
        "smt_siblings": smt_siblings(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": package_versions(("numpy", "scipy", "numba", "asyncopt")
                                     + tuple(extra_packages)),
        "git": git_revision(),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS",
                                           "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                           "HYDRA_BINDING", "ASYNCOPT_MPI_REDUCE",
                                           "ASYNCOPT_MPI_TRANSPORT")
                if k in os.environ},
    }


# --------------------------------------------------------------------------- measurement

class TimeCapReached(Exception):
    """Raised from inside a solver's callback to stop it at the time cap or at the target."""


class TargetReached(Exception):
    """Raised from inside a solver's callback once the target gap is reached."""


@dataclass
class SolverRun:
    """Outcome of one solver on one problem.

    time: seconds to reach the target (None when not reached within the cap);
    curve: (seconds, relative gap) points, time increasing;
    runs: for tolerance sequences, one dict per fit (parameter, seconds, rel_gap)."""

    solver: str
    reached: bool
    time: float = None
    curve: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    best_rel_gap: float = None
    note: str = ""
    error: str = None
    extra: dict = field(default_factory=dict)

    def as_dict(self):
        return asdict(self)


def cpu_floor(rank_cpu, cores):
    """The shortest time any schedule of the ranks' CPU times ``rank_cpu`` takes on
    ``cores`` cores: their sum over the cores, and no less than the busiest rank's. On 2
    cores 1 worker's solve hides the server's CPU on the second core and 2 workers'
    cannot, so t(1) / (the floor of k) bounds the speed-up of that work (bench_speedup,
    with the waits' spins and sleeps; bench_timeline, with and without them;
    benchmarks/README.md, "The CPU floor at 2 workers")."""
    return max(sum(rank_cpu) / max(1, cores), max(rank_cpu, default=0.0))


def first_time_below(curve, target):
    """The first time in a (time, rel_gap) curve with rel_gap <= target, or None."""
    for t, g in curve:
        if g is not None and g <= target:
            return t
    return None


def from_history(solver, history, target, note=""):
    """SolverRun from asyncopt ``history`` records (dicts with 'time' and 'rel_gap')."""
    curve = [(float(r["time"]), float(r["rel_gap"])) for r in history]
    t = first_time_below(curve, target)
    best = min((g for _, g in curve), default=None)
    extra = {}
    if history:
        last = history[-1]
        extra = {"epochs": int(last["epoch"]), "final_active": int(last["n_active"]),
                 "n_features": int(last["n_features"])}
    return SolverRun(solver, t is not None, t, curve, best_rel_gap=best, note=note,
                     extra=extra)


def timed(fn, repeat=1):
    """(best wall time over ``repeat`` calls, the result of the fastest call)."""
    best, out = math.inf, None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        res = fn()
        elapsed = time.perf_counter() - t0
        if elapsed < best:
            best, out = elapsed, res
    return best, out


def tolerance_sequence(solver, fit, evaluate, target, params, *, cap, budget=None,
                       repeat=1, refine=None, note=""):
    """Time-to-gap of an external solver by a sequence of fits (celer's benchmark method).

    fit(param) -> (coef, intercept[, info]) runs one fit from scratch at ``param`` (a
    tolerance, decreasing along ``params``, or a growing iteration count); it is timed.
    evaluate(coef, intercept) -> relative gap (not timed). The first fit whose gap is
    <= target gives the time. The sequence stops there, when one fit takes longer than
    ``cap`` seconds, or when the fits together used ``budget`` (default 2 * cap).

    refine(param_before, param_hit) -> a parameter between the last failing and the first
    succeeding one (e.g. their geometric mean): tried once, if it also reaches the target
    and is faster, it gives the time (halves the over-solving of decade-spaced tolerances).
    Every fit is also a (time, gap) point of the curve.
    """
    budget = 2.0 * cap if budget is None else budget
    runs, spent = [], 0.0
    hit, previous = None, None
    for param in params:
        if spent >= budget:
            break
        try:
            elapsed, out = timed(lambda: fit(param), repeat)
        except Exception as exc:  # noqa: BLE001 - report, do not crash the benchmark
            runs.append({"param": param, "error": repr(exc)})
            return _sequence_result(solver, runs, target, note, error=repr(exc))
        spent += elapsed * max(1, repeat)
        gap = float(evaluate(*out[:2]))
        info = out[2] if len(out) > 2 else {}
        runs.append({"param": param, "time": elapsed, "rel_gap": gap, **info})
        if elapsed > cap:
            break
        if gap <= target:
            hit = param
            break
        previous = param
    if hit is not None and previous is not None and refine is not None \
            and spent + runs[-1]["time"] * max(1, repeat) <= budget:
        param = refine(previous, hit)
        try:
            elapsed, out = timed(lambda: fit(param), repeat)
            gap = float(evaluate(*out[:2]))
            info = out[2] if len(out) > 2 else {}
            runs.append({"param": param, "time": elapsed, "rel_gap": gap, "refine": True,
                         **info})
        except Exception as exc:  # noqa: BLE001
            runs.append({"param": param, "error": repr(exc), "refine": True})
    return _sequence_result(solver, runs, target, note, cap=cap)


def _sequence_result(solver, runs, target, note, error=None, cap=math.inf):
    ok = [r for r in runs if "time" in r]
    curve = sorted((r["time"], r["rel_gap"]) for r in ok)
    hits = [r["time"] for r in ok if r["rel_gap"] <= target and r["time"] <= cap]
    t = min(hits) if hits else None
    best = min((r["rel_gap"] for r in ok), default=None)
    return SolverRun(solver, t is not None, t, curve, runs, best, note, error)


class EpochClock:
    """Solver time excluding the time spent in our own per-epoch callback.

    ``start()`` once; in the callback call ``pause()`` first (returns the solver time so
    far) and ``resume()`` last."""

    def __init__(self):
        self.t0 = None
        self.excluded = 0.0
        self._paused_at = None

    def start(self):
        self.t0 = time.perf_counter()
        self.excluded = 0.0

    def pause(self):
        self._paused_at = time.perf_counter()
        return self._paused_at - self.t0 - self.excluded

    def resume(self):
        self.excluded += time.perf_counter() - self._paused_at

    def now(self):
        return time.perf_counter() - self.t0 - self.excluded


@contextlib.contextmanager
def quiet_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --------------------------------------------------------------------------- reporting

def format_seconds(run, cap):
    if run is None:
        return "-"
    if run.error:
        return "error"
    if run.reached:
        return f"{run.time:.2f}"
    return f">{cap:g}"


def ratio(numerator, denominator, cap):
    """(value, text, kind) of numerator.time / denominator.time with capped runs as bounds:
    kind is 'exact', 'lower' (numerator capped: at least), 'upper' (denominator capped: at
    most) or None (both capped or missing)."""
    if numerator is None or denominator is None or numerator.error or denominator.error:
        return None, "-", None
    if numerator.reached and denominator.reached:
        v = numerator.time / denominator.time
        return v, f"{v:.2f}", "exact"
    if not numerator.reached and denominator.reached:
        v = cap / denominator.time
        return v, f">{v:.1f}", "lower"
    if numerator.reached and not denominator.reached:
        v = numerator.time / cap
        return v, f"<{v:.2f}", "upper"
    return None, "both >cap", None


def format_table(header, rows):
    """Plain-text table with columns padded to their widest cell."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for k, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, SolverRun):
        return _jsonable(obj.as_dict())
    return obj


def write_json(path, payload):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(_jsonable(payload), f, indent=1)
        f.write("\n")
    return path


def finish_deep_benchmark(args, name, summary, seconds, **details):
    """The torch benchmarks' ending: write ``summary`` plus ``details``, the run's seconds,
    its arguments (``config``, without ``out``) and the machine (with torch and
    scikit-learn versions) to ``args.out`` or results/<name>.json, then print ``summary``
    as the one-line JSON that ends stdout."""
    out = getattr(args, "out", None) or os.path.join(RESULTS_DIR, name + ".json")
    write_json(out, dict(summary, **details, seconds=seconds,
                         config={k: v for k, v in vars(args).items() if k != "out"},
                         machine=machine_info(("torch", "sklearn"))))
    print(json.dumps(_jsonable(summary)))
    return out


SOLVER_STYLE = {}


def plot_gap_curves(path, panels, target=None, cap=None, title=None, solver_labels=None):
    """One panel per problem: relative duality gap (log) against seconds, one line per
    solver. ``panels`` is a list of (panel title, {solver: SolverRun})."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    ncols = min(n, 3)
    nrows = -(-n // ncols) if n else 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.0 * nrows),
                             squeeze=False)
    solvers = []
    for _, runs in panels:
        for name in runs:
            if name not in solvers:
                solvers.append(name)
    cmap = plt.get_cmap("tab10")
    markers = "osD^v<>ph*"
    styles = {s: (cmap(i % 10), markers[i % len(markers)]) for i, s in enumerate(solvers)}
    labels = solver_labels or {}
    for ax, (name, runs) in zip(axes.ravel(), panels):
        for solver, run in runs.items():
            pts = [(t, g) for t, g in run.curve if g is not None and g > 0]
            if not pts:
                continue
            t, g = zip(*pts)
            color, marker = styles[solver]
            many = len(pts) > 30
            ax.plot(t, g, color=color, marker=None if many else marker, markersize=4,
                    linewidth=1.0 if run.runs else 1.4,
                    linestyle="--" if run.runs else "-",     # separate fits: dashed
                    label=labels.get(solver, solver))
            if run.reached:
                ax.plot([run.time], [first_gap_at(run)], marker="*", color=color,
                        markersize=11, markeredgecolor="k", linestyle="none")
        if target:
            ax.axhline(target, color="k", linestyle="--", linewidth=0.8)
        if cap:
            ax.axvline(cap, color="grey", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("seconds")
        ax.set_ylabel("duality gap / P(0)")
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    handles, names = [], []
    for ax in axes.ravel()[:n]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in names:
                handles.append(h)
                names.append(lab)
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 3 if ncols == 1 else 4 * ncols),
               fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    rows_of_legend = -(-len(names) // min(max(len(names), 1), 3 if ncols == 1 else 4 * ncols))
    bottom = min(0.3, 0.05 * rows_of_legend / nrows + 0.02)
    fig.tight_layout(rect=(0, bottom, 1, 0.97 if title else 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_from_dict(d):
    """SolverRun from its JSON form (for redrawing a figure from a results file)."""
    d = dict(d)
    d["curve"] = [tuple(p) for p in d.get("curve", [])]
    return SolverRun(**d)


def first_gap_at(run):
    for t, g in run.curve:
        if t == run.time:
            return g
    return run.best_rel_gap
