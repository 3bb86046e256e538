"""Attention-matrix pruning (paper 004, METHODS card "Attention-matrix pruning";
asyncopt.deep.attnprune) against Wanda, SparseGPT and fused-matrix magnitude pruning.

Instances (the paper's Section 6.1): d = 64; W_Q, W_K rank 4, each a Gaussian d x d matrix
with all but its 4 largest singular values zeroed; W = W_Q W_K^T; X (N x d) Gaussian
N(0, 1); causal softmax attention f = softmax(X W X^T) as in the paper (no 1/sqrt(d)). The
variance of the Gaussian weight matrices is not in our copy of the paper: entries are
N(0, 1/d) (``--weight-std``, default 1/sqrt(d)), which gives scores X W X^T of standard
deviation about 1.5 to 1.9 (growing with N), an attention neither uniform nor one-hot.

Methods, each at rho in {0.3, 0.5, 0.7, 0.9}:
- ours: Algorithm 1 (heavy-ball GD, momentum 0.9, from M = 1; lam_rel = 0.03, i.e.
  0.5 lam ||1||^2 = 0.03 L(empty mask); lr = 1 / (lam + Hessian norm at M = 1); 300
  steps; defaults chosen on seeds 100-102, not the benchmark's), binarised to exactly
  round(rho d^2) zeros of the fused W by |M o W|;
- wanda / sparsegpt: W_Q and W_K pruned separately at rho each (the paper's setting;
  SparseGPT blocksize 128 = one block here, percdamp 0.01), attention with their product,
  which is denser than rho (its zero fraction is printed and in the file; they store
  2 (1 - rho) d^2 numbers against (1 - rho) d^2 for ours and magnitude);
- magnitude: the fraction rho of smallest |W_ij| of the fused W zeroed.

Metric: relative attention error ||f(pruned) - f(dense)||_F / ||f(dense)||_F on the
calibration X and on held-out X (8 fresh Gaussian sequences of the same N), mean over
seeds. Full mode: N in {8, 16, 32, 64, 128}, seeds 0..9, plus the paper's lam sweep
(Figure 2a) at N = 64 and a sharp-attention regime (weight entries N(0, 1), scores scaled
by 1/sqrt(d), score std about 15) as extra tables. --quick: N in {16, 32, 64, 128}, seeds
0..4 (about 10 s on 2 cores).

Targets: ours' relative error at least 0.1 below Wanda's and SparseGPT's at rho 0.5 and
0.7 with N >= d/2, calibration and held-out. The last printed line is one JSON object
{"method": "attnprune", "rel_err": {rho: {method: ...}}, "heldout_rel_err": {...}}; its
figures are the mean over seeds and over N in {32, 64, 128} (N >= d/2 = 32); it is also
written, with per-N figures, per-seed runs, the targets, timings, the arguments and the
machine info, to benchmarks/results/bench_attnprune_quick.json (--quick) or
bench_attnprune.json (``--out``: elsewhere), with a figure next to it (.png).

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_attnprune.py [--quick]
"""
import argparse
import math
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from asyncopt.deep.attnprune import (METHODS, fused_from_factors, low_rank_factor,  # noqa: E402
                                     prune_fused, relative_attention_error)
from benchmarks.common import finish_deep_benchmark, format_table  # noqa: E402

RHOS = (0.3, 0.5, 0.7, 0.9)
D, RANK, HELDOUT_SEQUENCES = 64, 4, 8
LAM_SWEEP = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def make_instance(seed, n, d=D, rank=RANK, weight_std=None):
    """(W_Q, W_K, calibration X (N, d), held-out X (8, N, d)), float64, from one seed."""
    g = torch.Generator().manual_seed(seed)
    std = 1.0 / math.sqrt(d) if weight_std is None else weight_std
    w_q, w_k = low_rank_factor(d, rank, g, std), low_rank_factor(d, rank, g, std)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    heldout = torch.randn(HELDOUT_SEQUENCES, n, d, generator=g, dtype=torch.float64)
    return w_q, w_k, x, heldout


def run_instance(seed, n, weight_std=None, scale=1.0, methods=METHODS, **gd_kwargs):
    """{method: {"rel_err": {rho}, "heldout_rel_err": {rho}, "fused_zero_fraction": {rho},
    "seconds"}} on one instance."""
    w_q, w_k, x, heldout = make_instance(seed, n, weight_std=weight_std)
    weight = fused_from_factors(w_q, w_k)
    out = {"score_std": float((scale * x @ weight @ x.T).std())}
    for method in methods:
        t0 = time.perf_counter()
        kw = gd_kwargs if method == "ours" else {}
        pruned = prune_fused(method, x, w_q, w_k, RHOS, scale=scale, **kw)
        seconds = time.perf_counter() - t0
        out[method] = {
            "rel_err": {r: relative_attention_error(x, weight, pruned[r], scale=scale)
                        for r in RHOS},
            "heldout_rel_err": {r: relative_attention_error(heldout, weight, pruned[r],
                                                            scale=scale) for r in RHOS},
            "fused_zero_fraction": {r: float((pruned[r] == 0).double().mean()) for r in RHOS},
            "seconds": seconds}
    return out


def run_grid(ns, seeds, label, **kwargs):
    runs = []
    for n in ns:
        t0 = time.perf_counter()
        for seed in seeds:
            runs.append({"n": n, "seed": seed, **run_instance(seed, n, **kwargs)})
        print(f"[{label}] N = {n:3d}: {len(seeds)} seeds in {time.perf_counter() - t0:.1f} s",
              flush=True)
    return runs


def mean_over(runs, methods, key, ns):
    """{rho: {method: mean over the runs with N in ns}}."""
    chosen = [r for r in runs if r["n"] in ns]
    return {r: {m: float(np.mean([run[m][key][r] for run in chosen])) for m in methods}
            for r in RHOS}


def table(runs, methods, ns):
    """Rows N, rho: calibration / held-out error of every method."""
    rows = []
    for n in ns:
        calib, held = mean_over(runs, methods, "rel_err", [n]), \
            mean_over(runs, methods, "heldout_rel_err", [n])
        for r in RHOS:
            rows.append([n, r] + [f"{calib[r][m]:.3f} / {held[r][m]:.3f}" for m in methods])
    return format_table(["N", "rho"] + [f"{m} (calib / held-out)" for m in methods], rows)


def check_targets(calib, held, margin=0.1):
    """ours <= baseline - margin at rho 0.5 and 0.7, calibration and held-out."""
    out = {}
    for name, figures in (("calibration", calib), ("heldout", held)):
        for r in (0.5, 0.7):
            for base in ("wanda", "sparsegpt"):
                gap = figures[r][base] - figures[r]["ours"]
                out[f"{name}_rho{r}_ours_vs_{base}"] = {"gap": round(gap, 4),
                                                       "met": bool(gap >= margin)}
    return out


def plot(path, runs, ns):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    big = [n for n in ns if n >= D // 2]
    for ax, key, title in ((axes[0], "rel_err", f"calibration, N in {big}"),
                           (axes[1], "heldout_rel_err", f"held-out, N in {big}")):
        figures = mean_over(runs, METHODS, key, big)
        for m in METHODS:
            ax.plot(RHOS, [figures[r][m] for r in RHOS], marker="o", label=m)
        ax.set_xlabel("sparsity rho")
        ax.set_ylabel("relative attention error")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    for m in METHODS:
        axes[2].plot(ns, [mean_over(runs, [m], "heldout_rel_err", [n])[0.5][m] for n in ns],
                     marker="o", label=m)
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("N")
    axes[2].set_title("held-out, rho = 0.5", fontsize=10)
    axes[2].grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def rounded(figures):
    return {str(r): {m: round(v, 4) for m, v in row.items()} for r, row in figures.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--ns", type=int, nargs="+", default=None)
    ap.add_argument("--weight-std", type=float, default=None)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lam-rel", type=float, default=0.03)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.seeds = seeds = args.seeds or (list(range(5)) if args.quick else list(range(10)))
    args.ns = ns = args.ns or ([16, 32, 64, 128] if args.quick else [8, 16, 32, 64, 128])
    big = [n for n in ns if n >= D // 2]
    gd = dict(steps=args.steps, lam_rel=args.lam_rel)
    t0 = time.perf_counter()
    runs = run_grid(ns, seeds, "main", weight_std=args.weight_std, **gd)
    calib = mean_over(runs, METHODS, "rel_err", big)
    held = mean_over(runs, METHODS, "heldout_rel_err", big)
    print(f"\nRelative attention error, d = {D}, rank {RANK}, seeds {seeds}, mean over seeds "
          f"(score std {np.mean([r['score_std'] for r in runs]):.2f})")
    print(table(runs, METHODS, ns))
    print(f"\nMean over N in {big} (N >= d/2): calibration / held-out")
    print(format_table(["rho"] + list(METHODS),
                       [[r] + [f"{calib[r][m]:.3f} / {held[r][m]:.3f}" for m in METHODS]
                        for r in RHOS]))
    targets = check_targets(calib, held)
    per_n_targets = {n: check_targets(mean_over(runs, METHODS, "rel_err", [n]),
                                      mean_over(runs, METHODS, "heldout_rel_err", [n]))
                     for n in big}
    print("targets (ours >= 0.1 below, N >= d/2 aggregate): " + ", ".join(
        f"{k} {v['gap']:+.3f} {'yes' if v['met'] else 'NO'}" for k, v in targets.items()))
    for n, tg in per_n_targets.items():
        missed = [k for k, v in tg.items() if not v["met"]]
        print(f"  N = {n}: {'all met' if not missed else 'missed ' + ', '.join(missed)}")
    zero = {m: {r: float(np.mean([run[m]["fused_zero_fraction"][r] for run in runs]))
                for r in RHOS} for m in METHODS}
    print("fused zero fraction (wanda / sparsegpt prune the factors): " + ", ".join(
        f"{m} {[round(zero[m][r], 3) for r in RHOS]}" for m in METHODS))
    seconds = {m: float(np.mean([run[m]["seconds"] for run in runs])) for m in METHODS}
    print("seconds per instance (all four rho): " + ", ".join(
        f"{m} {s:.3f}" for m, s in seconds.items()))

    extra = {}
    if not args.quick:
        sweep_seeds = seeds[:5]
        sweep = {}
        for lam_rel in LAM_SWEEP:
            sub = run_grid([64], sweep_seeds, f"lam_rel {lam_rel}", methods=("ours",),
                           weight_std=args.weight_std, steps=args.steps, lam_rel=lam_rel)
            sweep[lam_rel] = {"rel_err": mean_over(sub, ["ours"], "rel_err", [64]),
                              "heldout_rel_err": mean_over(sub, ["ours"], "heldout_rel_err",
                                                           [64])}
        print(f"\nlam sweep (paper Figure 2a), N = 64, seeds {sweep_seeds}, ours: calib / "
              "held-out")
        print(format_table(["lam_rel"] + [f"rho {r}" for r in RHOS], [
            [lam] + [f"{v['rel_err'][r]['ours']:.3f} / {v['heldout_rel_err'][r]['ours']:.3f}"
                     for r in RHOS] for lam, v in sweep.items()]))
        sharp = run_grid(ns, seeds[:5], "sharp", weight_std=1.0, scale=1.0 / math.sqrt(D),
                         **gd)
        print(f"\nSharp attention: weight entries N(0, 1), scores / sqrt(d) (score std "
              f"{np.mean([r['score_std'] for r in sharp]):.1f}), seeds {seeds[:5]}")
        print(table(sharp, METHODS, ns))
        extra = {"lam_sweep_n64": {str(k): {kk: rounded(vv) for kk, vv in v.items()}
                                   for k, v in sweep.items()},
                 "sharp_regime": {"per_n": {n: {"rel_err": rounded(mean_over(
                     sharp, METHODS, "rel_err", [n])), "heldout_rel_err": rounded(mean_over(
                         sharp, METHODS, "heldout_rel_err", [n]))} for n in ns},
                     "targets": check_targets(mean_over(sharp, METHODS, "rel_err", big),
                                              mean_over(sharp, METHODS, "heldout_rel_err",
                                                        big)),
                     "runs": sharp}}
    summary = {"method": "attnprune", "rel_err": rounded(calib), "heldout_rel_err": rounded(held)}
    per_n = {n: {"rel_err": rounded(mean_over(runs, METHODS, "rel_err", [n])),
                 "heldout_rel_err": rounded(mean_over(runs, METHODS, "heldout_rel_err", [n]))}
             for n in ns}
    elapsed = time.perf_counter() - t0
    print(f"total {elapsed:.1f} s")
    path = finish_deep_benchmark(
        args, "bench_attnprune" + ("_quick" if args.quick else ""), summary, elapsed,
        summary_holds=f"mean over seeds and N in {big}", targets=targets,
        per_n_targets=per_n_targets, per_n=per_n, fused_zero_fraction=zero,
        seconds_per_instance=seconds,
        setup={"d": D, "rank": RANK, "rhos": RHOS,
               "weight_std": args.weight_std or 1 / math.sqrt(D), "scale": 1.0,
               "causal": True, "momentum": 0.9, "lr_rel": 1.0,
               "heldout_sequences": HELDOUT_SEQUENCES,
               "sparsegpt": {"blocksize": 128, "percdamp": 0.01}},
        runs=runs, **extra)
    try:
        plot(os.path.splitext(path)[0] + ".png", runs, ns)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
