"""SGR benchmark (paper 001, METHODS card "SGR"): successive gradient reconciliation against
global BP, layer-wise and reforward local learning.

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_sgr.py [--quick]
        [--modules 6 8 10] [--epochs N] [--seeds 0 1 2] [--lam 1] [--lr 0.02] [--etf]

Data: scikit-learn's digits (``asyncopt.deep.ato.digits_train_test``: stratified 80/20
split, random_state=0, standardised). Model: PlainNet MLP 64 -> 128 x K (``plain_net``),
module k = Linear + ReLU with a Linear(128, 10) local head (local BP); the last head is the
classifier. ``--etf``: the BP-free variant, fixed ETF heads, is run too (K = the first of
``--modules``).

Methods, same init, same batch order (seeded), same SGD (lr 0.02, momentum 0.9, cosine
decay, batch 64), lam = 1:
- global_bp: CE of the last head through every block (``train_global_bp``);
- layerwise: non-greedy local learning, lam = 0 (L^SGR measured, not optimised);
- reforward: layer-wise, each module's output recomputed after its update;
- sgr: L_k + lam L_k^SGR for every module k >= 2, the stored gradient of every module.
lr 0.02 and the cosine decay, not the card's CIFAR setting (lr 0.1 constant): at lr 0.1
global BP diverged on one seed of three and SGR's last module diverged on all three (test
accuracy 0.10); at lr 0.02 constant for 40 epochs SGR fell 3-4 points below layer-wise
(L^SGR is scale-free in the gradients, so it dominates once the CE is near zero), the
cosine decay avoids that. The blocks use He init (``plain_net``): with PyTorch's default,
global BP through 6 blocks reached 0.39 after 20 epochs.

Observed (2 shared cores): --quick meets the three targets; the full run meets the L^SGR
and memory targets but not the accuracy one (SGR - layer-wise = -0.7, -1.9, -2.0 points at
K = 6, 8, 10; within 0.5 point in the 20-epoch quick run). With lam = 0.1 instead of the
card's 1 (``--modules 8 --lam 0.1``), SGR 0.9565 against layer-wise 0.9546 at K = 8.

Reported per method and K, mean +/- std over seeds: test accuracy; mean L^SGR (over modules
2..K and epochs; per epoch the mean over its batches) and its last-epoch value; the peak
saved-activation bytes of one training step on a batch of 64 (``peak_saved_bytes``: tensors
saved for backward, parameters excluded), also for K = 2, 3, 4 to show where SGR's
constant peak meets global BP's linear one. Full mode: K = 6, 8, 10, 40 epochs, seeds 0, 1,
2, plus the ETF variant at K = 6; --quick: K = 6, 20 epochs, seeds 0, 1, 2 (under 3 minutes
on 2 cores).

Targets (K = the first of --modules): SGR's mean L^SGR below layer-wise's; SGR's accuracy at
least layer-wise's minus 0.5 point; SGR's peak saved bytes below global BP's for every
measured K >= 4. The last printed line is one JSON object; it is also written, with the
machine info and every run, to benchmarks/results/bench_sgr_quick.json (--quick) or
bench_sgr.json.
"""
import argparse
import json
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402

METHODS = ("global_bp", "layerwise", "reforward", "sgr")
LOCAL_MODES = ("layerwise", "reforward", "sgr")
BATCH = 64


def run_seed(seed, data, n_modules, head, train_kwargs, lam, verbose):
    """Every method on one seed: test accuracy, L^SGR history, seconds."""
    from asyncopt.deep.ato import accuracy
    from asyncopt.deep.sgr import plain_net, train_global_bp, train_local
    Xtr, ytr, Xte, yte = data
    out = {"seed": seed}
    t0 = time.perf_counter()
    net = plain_net(n_modules, head=head, seed=seed)
    train_global_bp(net, Xtr, ytr, seed=seed, **train_kwargs)
    out["global_bp"] = {"acc": accuracy(net, Xte, yte), "seconds": time.perf_counter() - t0}
    for mode in LOCAL_MODES:
        net = plain_net(n_modules, head=head, seed=seed)
        res = train_local(net, Xtr, ytr, mode=mode, lam=lam, seed=seed, verbose=verbose,
                          **train_kwargs)
        last = [v for v in res.history[-1]["sgr_loss"] if v is not None]
        out[mode] = {"acc": accuracy(net, Xte, yte), "mean_sgr_loss": res.mean_sgr_loss,
                     "final_sgr_loss": float(np.mean(last)), "seconds": res.seconds,
                     "sgr_loss_per_epoch": [float(np.mean([v for v in r["sgr_loss"]
                                                           if v is not None]))
                                            for r in res.history]}
    return out


def saved_bytes(data, n_modules, head, lam):
    """Peak saved-activation bytes of one step per method on the first BATCH examples."""
    from asyncopt.deep.sgr import peak_saved_bytes, plain_net
    Xtr, ytr = data[0][:BATCH], data[1][:BATCH]
    net = plain_net(n_modules, head=head, seed=0)
    return {m: int(peak_saved_bytes(net, Xtr, ytr, m, lam=lam)) for m in METHODS}


def summarise(runs, memory):
    def stat(method, key):
        v = np.array([r[method][key] for r in runs], dtype=float)
        return float(v.mean()), float(v.std())
    summary = {}
    for m in METHODS:
        summary[m] = {"acc": stat(m, "acc"), "peak_saved_bytes": memory[m],
                      "seconds": stat(m, "seconds")[0]}
        if m in LOCAL_MODES:
            summary[m]["mean_sgr_loss"] = stat(m, "mean_sgr_loss")
            summary[m]["final_sgr_loss"] = stat(m, "final_sgr_loss")
    return summary


def print_config(label, summary):
    rows = []
    for m in METHODS:
        s = summary[m]
        sgr = (f"{s['mean_sgr_loss'][0]:.3e} +/- {s['mean_sgr_loss'][1]:.1e}"
               if "mean_sgr_loss" in s else "-")
        final = f"{s['final_sgr_loss'][0]:.3e}" if "final_sgr_loss" in s else "-"
        rows.append([m, f"{s['acc'][0]:.4f} +/- {s['acc'][1]:.4f}", sgr, final,
                     f"{s['peak_saved_bytes']:,}",
                     f"{s['peak_saved_bytes'] / summary['global_bp']['peak_saved_bytes']:.3f}",
                     f"{s['seconds']:.1f}"])
    print(f"\n{label}")
    print(format_table(["method", "test acc", "mean L_SGR", "last-epoch L_SGR",
                        "peak saved B", "vs BP", "s / run"], rows), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--modules", type=int, nargs="+", default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--lr-schedule", default="cosine")
    ap.add_argument("--etf", action="store_true", help="also the BP-free ETF variant")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    from asyncopt.deep.ato import digits_train_test
    torch.set_num_threads(args.threads)
    modules = args.modules or ([6] if args.quick else [6, 8, 10])
    epochs = args.epochs or (20 if args.quick else 40)
    seeds = args.seeds if args.seeds is not None else [0, 1, 2]
    with_etf = args.etf or not args.quick
    train_kwargs = dict(epochs=epochs, batch_size=BATCH, lr=args.lr, momentum=args.momentum,
                        lr_schedule=args.lr_schedule)
    data = digits_train_test()
    t0 = time.perf_counter()
    configs = [("linear", K) for K in modules] + ([("etf", modules[0])] if with_etf else [])
    results = {}
    for head, K in configs:
        runs = []
        for seed in seeds:
            runs.append(run_seed(seed, data, K, head, train_kwargs, args.lam, args.verbose))
            print(f"{head} K={K} seed {seed} | "
                  + " | ".join(f"{m} {runs[-1][m]['acc']:.4f}" for m in METHODS)
                  + f" | {sum(runs[-1][m]['seconds'] for m in METHODS):.1f} s", flush=True)
        summary = summarise(runs, saved_bytes(data, K, head, args.lam))
        results[f"{head}_K{K}"] = {"head": head, "K": K, "summary": summary, "runs": runs}
        print_config(f"digits, PlainNet 64 -> 128 x {K}, {head} heads, {epochs} epochs, "
                     f"lam {args.lam}, seeds {seeds} (mean +/- std)", summary)

    memory_K = sorted(set([2, 3, 4] + modules))
    memory = {K: saved_bytes(data, K, "linear", args.lam) for K in memory_K}
    print("\npeak saved-activation bytes of one step (batch 64, linear heads)")
    print(format_table(["K"] + list(METHODS) + ["sgr / bp"],
                       [[K] + [f"{memory[K][m]:,}" for m in METHODS]
                        + [f"{memory[K]['sgr'] / memory[K]['global_bp']:.3f}"]
                        for K in memory_K]))

    main_summary = results[f"linear_K{modules[0]}"]["summary"]
    sgr, layerwise = main_summary["sgr"], main_summary["layerwise"]
    targets = {
        "sgr_mean_loss_below_layerwise": bool(sgr["mean_sgr_loss"][0]
                                              < layerwise["mean_sgr_loss"][0]),
        "sgr_acc_ge_layerwise_minus_0.5pt": bool(sgr["acc"][0] >= layerwise["acc"][0] - 0.005),
        "sgr_peak_bytes_below_bp_for_K_ge_4": bool(all(
            memory[K]["sgr"] < memory[K]["global_bp"] for K in memory_K if K >= 4)),
    }
    print("targets (K = %d): " % modules[0]
          + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in targets.items()))

    def line(summary, K):
        return {"acc": {m: round(summary[m]["acc"][0], 4) for m in METHODS},
                "mean_sgr_loss": {m: float(f"{summary[m]['mean_sgr_loss'][0]:.4e}")
                                  for m in ("layerwise", "sgr")},
                "peak_saved_bytes_ratio_vs_bp": round(memory[K]["sgr"]
                                                      / memory[K]["global_bp"], 4)}
    final = {"method": "sgr", "K": modules[0], **line(main_summary, modules[0])}
    if len(modules) > 1:
        final["by_K"] = {str(K): line(results[f"linear_K{K}"]["summary"], K)
                         for K in modules[1:]}
    path = args.out or os.path.join(RESULTS_DIR, "bench_sgr_quick.json" if args.quick
                                    else "bench_sgr.json")
    write_json(path, {"summary": final, "targets": targets, "results": results,
                      "peak_saved_bytes": {str(K): v for K, v in memory.items()},
                      "config": {"epochs": epochs, "seeds": seeds, "modules": modules,
                                 "lam": args.lam, "lr": args.lr, "momentum": args.momentum,
                                 "lr_schedule": args.lr_schedule, "batch_size": BATCH,
                                 "quick": args.quick, "threads": args.threads,
                                 "etf": with_etf, "model": "PlainNet MLP 64 -> 128 x K",
                                 "data": "sklearn digits, stratified 80/20 split "
                                         "(random_state=0), standardised"},
                      "seconds": time.perf_counter() - t0,
                      "machine": machine_info(extra_packages=("torch", "sklearn"))})
    print(json.dumps(final))


if __name__ == "__main__":
    main()
