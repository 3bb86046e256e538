"""Serial and threads DDSS on two source trees side by side: bench_serial's problems
solved by this checkout and by another (``--base DIR``, e.g. ``git worktree add /tmp/base
HEAD~1``), one pair per seed and backend, the order alternating, so that both trees meet
the machine minute by minute (``bench_paired.py`` does the same for mpirun).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_paired_local.py --base /tmp/base \\
        --seeds 1 2 3 4 5 --threads 1 2

Each tree runs in a process of its own (``_local_run.py`` with that tree's asyncopt first
on PYTHONPATH) that loads each problem once and warms its kernels up before the first
timed solve; the timed solve is ``solve_ddss(problem, tol=...)`` (serial, or a
``ThreadsInnerLoop`` of T threads), its seconds the solve's wall time.

Output: a table per problem and backend (each pair's times and ratio base / this, then
the medians and the median ratio) and ``results/bench_paired_local.json`` (the machine,
both trees, every run). A ratio above 1 means this checkout was faster.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import (RESULTS_DIR, format_table, git_revision,  # noqa: E402
                               machine_info, write_json)

PROBLEMS = {      # bench_serial's rows: (data, loss, lam / lam_max, intercept)
    "ctr_lasso_1e-3": ("ctr", "squared", 1e-3, True),
    "ctr_lasso_1e-4": ("ctr", "squared", 1e-4, True),
    "a9a_d2_lasso": ("a9a_d2", "squared", 1e-2, True),
    "a9a_d2_logreg": ("a9a_d2", "logistic", 1e-2, False),
    "a9a_d3_lasso": ("a9a_d3", "squared", 1e-2, True),
    "a9a_d3_logreg": ("a9a_d3", "logistic", 1e-2, False),
}
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_local_run.py")


class Tree:
    """A process solving with one tree's asyncopt: ``solve(request)`` -> its reply."""

    def __init__(self, path):
        env = dict(os.environ, PYTHONPATH=path)
        self.process = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env,
                                        cwd=path)

    def solve(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the solving process ended")
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, metavar="DIR",
                        help="the other source tree (holds asyncopt/)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], metavar="T",
                        help="1: the serial backend; T > 1: threads (default 1 2)")
    parser.add_argument("--only", nargs="+", default=sorted(PROBLEMS), metavar="NAME",
                        choices=sorted(PROBLEMS))
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    paths = {"base": os.path.abspath(args.base), "this": ROOT}
    trees = {label: Tree(path) for label, path in paths.items()}
    results, summary = [], []
    try:
        for name in args.only:
            data, loss, lam_ratio, intercept = PROBLEMS[name]
            for threads in args.threads:
                rows, ratios, runs = [], [], []
                for i, seed in enumerate(args.seeds):
                    order = ("base", "this") if i % 2 == 0 else ("this", "base")
                    request = dict(data=data, loss=loss, lam_ratio=lam_ratio,
                                   fit_intercept=intercept, threads=threads, seed=seed,
                                   tol=args.tol)
                    pair = {label: trees[label].solve(request) for label in order}
                    ok = all(pair[k]["converged"] for k in pair)
                    ratio = pair["base"]["solve_s"] / pair["this"]["solve_s"] if ok \
                        else None
                    if ratio is not None:
                        ratios.append(ratio)
                    runs.append(dict(seed=seed, order=list(order), **pair))
                    rows.append([seed] + [f"{pair[k]['solve_s']:.3f} ({pair[k]['epochs']})"
                                          for k in ("base", "this")] +
                                ["-" if ratio is None else f"{ratio:.2f}"])
                    print(f"  {name} T={threads} seed {seed}: " + ", ".join(rows[-1][1:]),
                          flush=True)
                medians = {k: statistics.median(r[k]["solve_s"] for r in runs)
                           for k in ("base", "this")}
                median_ratio = statistics.median(ratios) if ratios else None
                rows.append(["median", f"{medians['base']:.3f}", f"{medians['this']:.3f}",
                             "-" if median_ratio is None else f"{median_ratio:.2f}"])
                print(f"\n{name}, {'serial' if threads == 1 else f'{threads} threads'}: "
                      "solve s (outer iterations); ratio = base / this")
                print(format_table(["seed", "base", "this", "ratio"], rows) + "\n")
                results.append(dict(problem=name, threads=threads, runs=runs,
                                    median_s=medians, median_ratio=median_ratio))
                summary.append([name, "serial" if threads == 1 else f"{threads} threads",
                                f"{medians['base']:.3f}", f"{medians['this']:.3f}",
                                "-" if median_ratio is None else f"{median_ratio:.2f}"])
    finally:
        for tree in trees.values():
            tree.close()
    print("median solve seconds, ratio = base / this (paired)")
    print(format_table(["problem", "backend", "base", "this", "ratio"], summary))
    path = args.output or os.path.join(RESULTS_DIR, "bench_paired_local.json")
    write_json(path, {"benchmark": "bench_paired_local", "machine": machine_info(),
                      "trees": {label: {"path": tree, "git": git_revision(tree)}
                                for label, tree in paths.items()},
                      "tol": args.tol, "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
