"""Dis-DDSS on two source trees side by side: ``mpirun -n K`` solves of one problem by this
checkout and by another (``--base DIR``: a checkout of the commit to compare with, e.g.
``git worktree add /tmp/base HEAD~1``), one pair per seed, the order alternating (base
first on odd pairs), so that both meet the machine minute by minute. A shared VM's speed
drifts by 2x within minutes and a lent machine differs from the next one: quote the ratio
of paired runs made in one call, not times from different runs.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_paired.py --base /tmp/base \\
        --ranks 3 9 --seeds 1 2 3 4 5 6            # CTR 200,000 x 100,000, ~2 minutes

Both trees run their own ``benchmarks/_mpi_run.py`` (warm-up, then the timed solve on the
workers' prepared shards, written once by this checkout's ``prepare_shards``) with their
own asyncopt first on PYTHONPATH, so the base must take the same arguments. Each run
gives the seconds to the target (the solve's own clock on the server), the records, the
outer iterations that took a support Newton step, the Newton seconds (in all and each
step's), the bytes the server sent and received, and the certified gap.

Output: a table per rank count (each pair and its ratio base / this, then the medians and
the median ratio), and ``results/bench_paired.json`` (the machine, both trees and every
run). A ratio above 1 means this checkout was faster.
"""
import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks._mpi_run import (add_solve_arguments, launch, prepare_shards,  # noqa: E402
                                 solve_options)
from benchmarks.bench_serial import DATA_DESCRIPTION  # noqa: E402
from benchmarks.common import (RESULTS_DIR, format_table, git_revision,  # noqa: E402
                               machine_info, write_json)


def summary(payload):
    """What one run's payload (``_mpi_run``'s JSON) says about its solve."""
    history = payload["history"]
    return {"solve_s": payload["ranks"][0]["solve_s"], "records": len(history),
            "epochs": payload["epochs"],
            "newton_epochs": [r["epoch"] for r in history if r.get("newton_step")],
            "newton_s": sum(r.get("newton_s", 0.0) for r in history),
            "newton_step_s": [r.get("newton_s", 0.0) for r in history
                              if r.get("newton_step")],
            "bytes": history[-1]["bytes_sent"] + history[-1]["bytes_recv"],
            "rel_gap": history[-1]["rel_gap"], "converged": payload["converged"],
            "source": payload.get("source")}


def run_pair(trees, order, n_ranks, seed, args, workdir, shard_root):
    """One solve by each tree, in ``order``: {tree label: summary or {"error": ...}}."""
    runs = {}
    for label in order:
        payload, wall, error = launch(
            n_ranks, os.path.join(workdir, f"{label}.json"), seed=seed,
            shard_root=shard_root, root=trees[label], **solve_options(args))
        runs[label] = {"error": error, "wall_s": wall} if error else \
            dict(summary(payload), wall_s=wall)
    return runs


def pair_row(seed, runs):
    cells = [seed]
    for label in ("base", "this"):
        run = runs[label]
        cells.append("error" if run.get("error") else
                     f"{run['solve_s']:.3f} {run['newton_epochs']} {run['rel_gap']:.0e}")
    ratio = paired_ratio(runs)
    cells.append("-" if ratio is None else f"{ratio:.2f}")
    return cells


def paired_ratio(runs):
    """base seconds / this checkout's, where both reached the target."""
    base, this = runs["base"], runs["this"]
    if base.get("error") or this.get("error") or not (base["converged"] and
                                                      this["converged"]):
        return None
    return base["solve_s"] / this["solve_s"]


def median_of(runs, label):
    values = [r[label]["solve_s"] for r in runs if not r[label].get("error")]
    return statistics.median(values) if values else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, metavar="DIR",
                        help="the other source tree (holds asyncopt/ and benchmarks/)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[3], metavar="K",
                        help="mpirun -n K (1 server + K-1 workers; default 3)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    add_solve_arguments(parser)
    args = parser.parse_args(argv)
    base = os.path.abspath(args.base)
    if not os.path.isfile(os.path.join(base, "benchmarks", "_mpi_run.py")):
        parser.error(f"--base {args.base}: no benchmarks/_mpi_run.py there")
    if min(args.ranks) < 2:
        parser.error("--ranks: at least 2 (1 server + 1 worker)")
    trees = {"base": base, "this": ROOT}
    print(f"bench_paired: {args.data} ({DATA_DESCRIPTION[args.data]}), {args.loss}, "
          f"lam = {args.lam_ratio:g} lam_max, to {args.tol:g}; base {base} "
          f"({git_revision(base)}), this {ROOT} ({git_revision(ROOT)})", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_paired_") as workdir:
        shard_root = args.shards or os.path.join(workdir, "shards")
        for n_ranks in args.ranks:
            prepare_shards(args.data, n_ranks - 1, shard_root)
            rows, pairs, orders = [], [], []
            for i, seed in enumerate(args.seeds):
                orders.append(("base", "this") if i % 2 == 0 else ("this", "base"))
                runs = run_pair(trees, orders[-1], n_ranks, seed, args, workdir, shard_root)
                pairs.append(runs)
                rows.append(pair_row(seed, runs))
                print(f"  -n {n_ranks} seed {seed}: base " + rows[-1][1] + ", this " +
                      rows[-1][2] + ", ratio " + rows[-1][3], flush=True)
            ratios = [r for r in map(paired_ratio, pairs) if r is not None]
            medians = {label: median_of(pairs, label) for label in trees}
            rows.append(["median"] + [
                "-" if medians[label] is None else f"{medians[label]:.3f}"
                for label in ("base", "this")] +
                ["-" if not ratios else f"{statistics.median(ratios):.2f}"])
            print(f"\nmpirun -n {n_ranks}: solve s [outer iterations with a Newton step] "
                  "certified gap; ratio = base / this")
            print(format_table(["seed", "base", "this", "ratio"], rows))
            results.append({"n_ranks": n_ranks, "pairs": [
                dict(seed=seed, order=list(order), **runs)
                for seed, order, runs in zip(args.seeds, orders, pairs)],
                "median_s": medians,
                "median_ratio": statistics.median(ratios) if ratios else None})
    path = args.output or os.path.join(RESULTS_DIR, "bench_paired.json")
    write_json(path, {"benchmark": "bench_paired", "machine": machine_info(("mpi4py",)),
                      "trees": {label: {"path": tree, "git": git_revision(tree)}
                                for label, tree in trees.items()},
                      "problem": {"data": args.data, "description":
                                  DATA_DESCRIPTION[args.data], "loss": args.loss,
                                  "lam_ratio": args.lam_ratio,
                                  "fit_intercept": not args.no_intercept,
                                  "method": args.method, "tol": args.tol},
                      "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
