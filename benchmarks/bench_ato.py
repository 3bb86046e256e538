"""ATO benchmark (thesis 002 ch. 4, METHODS card "ATO"): train once, prune structurally,
no fine-tuning, against baselines at equal FLOPs.

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_ato.py [--quick]
        [--epochs N] [--seeds 0 1 2] [--p 0.5] [--verbose]

Data: scikit-learn's digits (1,797 8x8 images, ships with the package), a fixed stratified
80/20 train/test split (random_state=0), standardised with the training mean and std.
Model: MLP 64-128-128-10 (GatedNet.mlp); the gated groups are the 2 x 128 hidden units
(Linear row + bias). Full mode: 60 epochs, p = 0.5, seeds 0..4; --quick: 30 epochs, seed 0
(well under 3 minutes on 2 cores).

Methods, all trained for the same epochs with the same SGD (lr 0.05, momentum 0.9, weight
decay 5e-4, cosine), none fine-tuned after pruning:
- dense: the full MLP;
- ato: train_ato (lam = 10, gamma = 4, T_start/T_w/T_end = 10/20/50%), evaluated as the
  physically compacted model;
- uniform (uniform pruning, Li et al. 2017): the trained dense MLP with every hidden layer
  pruned by the same kept fraction (uniform_widths at ATO's FLOPs: 80-80), the units of
  largest ||M_g||_2 kept per layer (uniform_masks), evaluated as the compacted model;
- uniform_width_scratch (NOT pruning, extra reference): an MLP of those same uniform widths
  trained from scratch with the same epochs and optimizer;
- random / magnitude: the trained dense MLP with, per block, as many units kept as ATO
  keeps (so exactly ATO's FLOPs), chosen at random / by largest ||M_g||_2;
- static_group_lasso (OTO-like): the ATO schedule without controller: at T_w the mask is
  frozen by magnitude with ATO's per-block counts, the rest are proxed to zero.

Targets: ATO's FLOPs kept within p +/- 0.05; ATO accuracy >= random and >= uniform pruning at
equal FLOPs (mean over seeds). How ATO compares with uniform_width_scratch is printed too (not
a target: a net trained from scratch at that width is not a pruning baseline). The last
printed line is one JSON object; it is also written, with the targets, every run, the
arguments and the machine info, to benchmarks/results/bench_ato_quick.json (--quick) or
bench_ato.json (``--out``: elsewhere).
"""
import argparse
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.common import finish_deep_benchmark, format_table  # noqa: E402


def run_seed(seed, data, epochs, p, verbose):
    import torch
    from asyncopt.deep.ato import (GatedNet, accuracy, magnitude_masks, random_masks,
                                   train_ato, train_dense, train_static_group_lasso,
                                   uniform_masks, uniform_widths)
    Xtr, ytr, Xte, yte = data
    sizes = (64, 128, 128, 10)
    common = dict(epochs=epochs, seed=seed, verbose=verbose)
    out, t0 = {"seed": seed}, time.perf_counter()

    torch.manual_seed(seed)
    dense = train_dense(GatedNet.mlp(sizes), Xtr, ytr, **common)
    out["dense"] = {"acc": accuracy(dense, Xte, yte), "flops_kept": 1.0}

    torch.manual_seed(seed)
    res = train_ato(GatedNet.mlp(sizes), Xtr, ytr, p=p, **common)
    counts = [int(m.sum()) for m in res.masks]
    out["ato"] = {"acc": accuracy(res.compact, Xte, yte), "flops_kept": res.flops_kept,
                  "kept": counts, "masked_acc": accuracy(res.model, Xte, yte, res.masks),
                  "budget_moved": int(sum(r["moved"] for r in res.history)),
                  "controller_flops_kept": next((r["controller_flops_kept"] for r in res.history
                                                 if "controller_flops_kept" in r), None)}
    total = dense.flops()

    uni_masks = uniform_masks(dense, res.flops_kept * total)
    uni = dense.compact(uni_masks).eval()
    out["uniform"] = {"acc": accuracy(uni, Xte, yte), "flops_kept": uni.flops() / total,
                      "kept": uni.widths}

    torch.manual_seed(seed)
    widths = uniform_widths(dense, res.flops_kept * total)
    scratch = train_dense(dense.like(widths), Xtr, ytr, **common)
    out["uniform_width_scratch"] = {"acc": accuracy(scratch, Xte, yte),
                                    "flops_kept": scratch.flops() / total, "kept": widths}

    rnd = random_masks(dense.widths, counts, seed=seed)
    out["random"] = {"acc": accuracy(dense, Xte, yte, rnd),
                     "flops_kept": float(dense.flops(rnd)) / total, "kept": counts}
    mag = magnitude_masks(dense, counts)
    out["magnitude"] = {"acc": accuracy(dense, Xte, yte, mag),
                        "flops_kept": float(dense.flops(mag)) / total, "kept": counts}

    torch.manual_seed(seed)
    sgl = train_static_group_lasso(GatedNet.mlp(sizes), Xtr, ytr, counts, p=p, **common)
    out["static_group_lasso"] = {"acc": accuracy(sgl.compact, Xte, yte),
                                 "flops_kept": sgl.flops_kept, "kept": counts}
    out["seconds"] = time.perf_counter() - t0
    return out


METHODS = ("dense", "ato", "uniform", "uniform_width_scratch", "random", "magnitude",
           "static_group_lasso")
LABELS = {"uniform": "uniform (pruning)",
          "uniform_width_scratch": "uniform width (scratch, not pruning)"}
BASELINES = ("uniform", "random", "magnitude", "static_group_lasso", "uniform_width_scratch")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--p", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    from asyncopt.deep.ato import digits_train_test
    torch.set_num_threads(args.threads)
    args.epochs = epochs = args.epochs or (30 if args.quick else 60)
    args.seeds = seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])
    data = digits_train_test()
    t0 = time.perf_counter()
    runs = []
    for seed in seeds:
        runs.append(run_seed(seed, data, epochs, args.p, args.verbose))
        ato = runs[-1]["ato"]
        print(f"seed {seed} | {runs[-1]['seconds']:.1f} s | ato acc {ato['acc']:.4f} | flops "
              f"{ato['flops_kept']:.3f} (controller's own mask {ato['controller_flops_kept']:.3f}"
              f", {ato['budget_moved']} groups moved into the band) | kept {ato['kept']}",
              flush=True)

    def stat(method, key):
        v = np.array([r[method][key] for r in runs], dtype=float)
        return float(v.mean()), float(v.std())
    rows = []
    for m in METHODS:
        (a, sa), (f, _) = stat(m, "acc"), stat(m, "flops_kept")
        rows.append([LABELS.get(m, m), f"{a:.4f} +/- {sa:.4f}", f"{f:.3f}"])
    print(f"\nATO on digits, MLP 64-128-128-10, p = {args.p}, {epochs} epochs, seeds {seeds}, "
          "no fine-tuning (test accuracy, mean +/- std over seeds)")
    print(format_table(["method", "test acc", "FLOPs kept"], rows))
    ato_acc, flops = stat("ato", "acc")[0], stat("ato", "flops_kept")[0]
    targets = {
        "flops_within_p_0.05": bool(all(abs(r["ato"]["flops_kept"] - args.p) <= 0.05
                                        for r in runs)),
        "ato_ge_random": bool(ato_acc >= stat("random", "acc")[0]),
        "ato_ge_uniform": bool(ato_acc >= stat("uniform", "acc")[0]),
    }
    print("targets: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in targets.items()))
    scratch_acc = stat("uniform_width_scratch", "acc")[0]
    print(f"not a target: ato {ato_acc:.4f} vs uniform width trained from scratch "
          f"{scratch_acc:.4f} (ato - scratch = {ato_acc - scratch_acc:+.4f}; ato "
          f"{'>=' if ato_acc >= scratch_acc else '<'} scratch)")
    summary = {"method": "ato", "target_p": args.p, "flops_kept": round(flops, 4),
               "dense_acc": round(stat("dense", "acc")[0], 4), "ato_acc": round(ato_acc, 4),
               "baselines": {m: round(stat(m, "acc")[0], 4)
                             for m in BASELINES}}
    finish_deep_benchmark(
        args, "bench_ato" + ("_quick" if args.quick else ""), summary,
        time.perf_counter() - t0, targets=targets,
        not_targets={"ato_minus_uniform_width_scratch": round(ato_acc - scratch_acc, 4),
                     "ato_ge_uniform_width_scratch": bool(ato_acc >= scratch_acc)},
        setup={"model": "mlp 64-128-128-10", "lam": 10.0, "gamma": 4.0,
               "schedule": [0.1, 0.2, 0.5],
               "data": "sklearn digits, stratified 80/20 split (random_state=0), "
                       "standardised"},
        runs=runs)


if __name__ == "__main__":
    main()
