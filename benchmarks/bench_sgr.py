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
decay, batch 64), lam chosen on validation (below):
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

lam: chosen per configuration from --lam-grid (0.1, 0.3, 1) by validation accuracy of
SGR on a 20% split of the training data (``choose_lam``), not on the test set; ``--lam``
fixes it. With the card's lam = 1 (CIFAR setting) the full run met the L^SGR and memory
targets but not the accuracy one (SGR - layer-wise = -0.7, -1.9, -2.0 points at K = 6, 8,
10): on digits the scale-free term outweighs a CE that is near zero late in training.

Observed (2 shared cores, 2026-11-22), lam chosen 0.1 for the linear heads (validation
0.962 / 0.955 / 0.944 for 0.1 / 0.3 / 1 at K = 6), 0.3 for ETF: full mode, test accuracy
SGR vs layer-wise 0.9593 vs 0.9593 (K = 6), 0.9565 vs 0.9546 (K = 8), 0.9546 vs 0.9556
(K = 10); mean L^SGR 6.238e-3 vs 6.280e-3 (K = 6); quick: 0.9500 vs 0.9509, L^SGR
6.507e-3 vs 6.526e-3. All three targets met in both modes.

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
targets, every run, the chosen lam, the arguments and the machine info, to
benchmarks/results/bench_sgr_quick.json (--quick) or bench_sgr.json (``--out``: elsewhere).
"""
import argparse
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.common import finish_deep_benchmark, format_table  # noqa: E402

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


def choose_lam(data, n_modules, head, grid, train_kwargs):
    """lam for SGR chosen on validation data, not the test set: the training split cut
    80/20 (stratified, random_state=1), SGR trained on the 80% with seed 0 for every lam
    of ``grid``, the lam of best validation accuracy kept (ties: the first in the grid).
    Returns (lam, {lam: validation accuracy})."""
    from sklearn.model_selection import train_test_split

    from asyncopt.deep.ato import accuracy
    from asyncopt.deep.sgr import plain_net, train_local
    Xtr, ytr = data[0], data[1]
    Xfit, Xval, yfit, yval = train_test_split(Xtr, ytr, test_size=0.2, stratify=ytr,
                                              random_state=1)
    scores = {}
    for lam in grid:
        net = plain_net(n_modules, head=head, seed=0)
        train_local(net, Xfit, yfit, mode="sgr", lam=lam, seed=0, **train_kwargs)
        scores[lam] = accuracy(net, Xval, yval)
    best = max(grid, key=lambda lam: (scores[lam], -grid.index(lam)))
    return best, scores


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
    ap.add_argument("--lam", type=float, default=None,
                    help="fixed lam for SGR (default: chosen from --lam-grid on validation)")
    ap.add_argument("--lam-grid", type=float, nargs="+", default=[0.1, 0.3, 1.0])
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
    args.modules = modules = args.modules or ([6] if args.quick else [6, 8, 10])
    args.epochs = epochs = args.epochs or (20 if args.quick else 40)
    args.seeds = seeds = args.seeds if args.seeds is not None else [0, 1, 2]
    args.etf = with_etf = args.etf or not args.quick
    train_kwargs = dict(epochs=epochs, batch_size=BATCH, lr=args.lr, momentum=args.momentum,
                        lr_schedule=args.lr_schedule)
    data = digits_train_test()
    t0 = time.perf_counter()
    configs = [("linear", K) for K in modules] + ([("etf", modules[0])] if with_etf else [])
    results = {}
    chosen = {}
    for head, K in configs:
        lam = args.lam
        if lam is None:
            lam, scores = choose_lam(data, K, head, list(args.lam_grid), train_kwargs)
            print(f"{head} K={K}: lam {lam} chosen on validation (" + ", ".join(
                f"{k:g}: {v:.4f}" for k, v in scores.items()) + ")", flush=True)
            chosen[f"{head}_K{K}"] = {"lam": lam, "validation_acc": scores}
        runs = []
        for seed in seeds:
            runs.append(run_seed(seed, data, K, head, train_kwargs, lam, args.verbose))
            print(f"{head} K={K} seed {seed} | "
                  + " | ".join(f"{m} {runs[-1][m]['acc']:.4f}" for m in METHODS)
                  + f" | {sum(runs[-1][m]['seconds'] for m in METHODS):.1f} s", flush=True)
        summary = summarise(runs, saved_bytes(data, K, head, lam))
        results[f"{head}_K{K}"] = {"head": head, "K": K, "lam": lam, "summary": summary,
                                   "runs": runs}
        print_config(f"digits, PlainNet 64 -> 128 x {K}, {head} heads, {epochs} epochs, "
                     f"lam {lam}, seeds {seeds} (mean +/- std)", summary)

    memory_K = sorted(set([2, 3, 4] + modules))
    memory = {K: saved_bytes(data, K, "linear", 1.0 if args.lam is None else args.lam)
              for K in memory_K}
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
    final = {"method": "sgr", "K": modules[0], "lam": results[f"linear_K{modules[0]}"]["lam"],
             **line(main_summary, modules[0])}
    if len(modules) > 1:
        final["by_K"] = {str(K): line(results[f"linear_K{K}"]["summary"], K)
                         for K in modules[1:]}
    finish_deep_benchmark(
        args, "bench_sgr" + ("_quick" if args.quick else ""), final,
        time.perf_counter() - t0, targets=targets, results=results,
        peak_saved_bytes={str(K): v for K, v in memory.items()}, lam_chosen=chosen,
        setup={"batch_size": BATCH, "model": "PlainNet MLP 64 -> 128 x K",
               "data": "sklearn digits, stratified 80/20 split (random_state=0), "
                       "standardised"})


if __name__ == "__main__":
    main()
