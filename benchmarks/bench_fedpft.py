"""FedPFT vs FedPETuning, FedOT and the three ablations on the card's small experiment
(METHODS card "FedPFT", paper 000, asyncopt.deep.fedpft).

Setup: the FM is the card's tiny transformer (L = 6, d = 32, 4 heads, d_ff = 128, ReLU)
pretrained here on upright digits rows as tokens (the public pool of 700 of scikit-learn's
digits, ``fedpft.fedpft_digits``), which is also the distillation data. The downstream
task is the shifted one: the same digits read column by column (transposed), the client
pool (647) split over K = 20 clients by a Dirichlet(1.0) label partition, half of them
per round, 1 local epoch of AdamW (lr 2e-3, batch 16) on LoRA (Q, K, V, O; r = 4, alpha =
16) and a fresh head; test on the transposed test set (450). FedPFT: drop 75% of the FFN
neurons of layers 2..5 by saliency, 5 epochs of layer-level distillation (mu = 1) before
FL, neuron-level alignment of 50% of the compressed neurons by APoZ every 10 rounds.
FedOT: layers 1 and 6 kept as the adapter (LoRA rank 12, the same trainable count), the
middle four dropped to two and distilled the same way.

Reported (mean over seeds): the FM's test accuracy with the averaged adapters plugged in
for every method; the relative gradient error ||g_proxy - g_FM|| / ||g_FM|| of the
distilled sub-FM, the undistilled sub-FM and the layer-drop emulator on the clients' data,
over the LoRA factors, at the adapters fine-tuning starts from (B = 0, the seed's fresh
head): ``grad_rel_err``; the file's ``grad_rel_err_all`` also has it over LoRA + head and
at FedPETuning's tuned adapters (there ||g_FM|| is small, the FM being near its
optimum, and the ratio is noisy); scalars a client holds (FM vs sub-FM, with
adapters); bytes per round (both directions, FedPFT's, alignment rounds included).
Targets (issue 6): gradient error distilled < undistilled and < layer-drop; FedPFT's
accuracy above FedOT's.

    python benchmarks/bench_fedpft.py --quick   # 30 rounds, 2 seeds (~2 min, 2 cores)
    python benchmarks/bench_fedpft.py           # 100 rounds, 3 seeds

Prints a table, then as its last line the JSON {"method": "fedpft", "acc": {...},
"grad_rel_err": {...}, "client_params": {"fm": ..., "sub_fm": ...}, "bytes_per_round":
...}; writes it with per-seed figures and the machine to
benchmarks/results/bench_fedpft[_quick].json.
"""
import argparse
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from asyncopt.deep import fedpft  # noqa: E402
from asyncopt.deep.ato import accuracy  # noqa: E402
from asyncopt.deep.partition import dirichlet_partition  # noqa: E402
from asyncopt.deep.pretrained import MiniLMTokenizer, load_minilm  # noqa: E402
from asyncopt.deep.transformer import tiny_encoder  # noqa: E402
from benchmarks.common import finish_deep_benchmark, format_table  # noqa: E402


TOPIC_WORDS = {
    "sports": ["team", "match", "goal", "coach", "player", "league", "stadium", "score",
               "tournament", "referee", "season", "championship", "striker", "fans"],
    "food": ["bread", "soup", "recipe", "chef", "kitchen", "dinner", "cheese", "pasta",
             "restaurant", "flavour", "oven", "breakfast", "spices", "dessert"],
    "weather": ["rain", "storm", "forecast", "wind", "snow", "cloud", "temperature",
                "thunder", "sunshine", "fog", "humidity", "drizzle", "frost", "heatwave"],
    "computers": ["software", "laptop", "server", "keyboard", "network", "code", "processor",
                  "database", "browser", "memory", "compiler", "screen", "update", "disk"],
}
GENERIC = ["the", "a", "this", "that", "our", "every", "old", "new", "long", "small",
           "people", "friend", "city", "morning", "week", "story", "house", "day", "time",
           "was", "is", "seemed", "became", "looked", "said", "saw", "talked", "about",
           "after", "before", "during", "with", "near", "again", "really", "quite"]


def topic_sentences(n, seed, topical=True):
    """Sentences we make: 7 words from GENERIC with two of them replaced by words of one
    topic (the label; with probability 0.25 one of the two comes from another topic), or
    with ``topical=False`` generic sentences only (the distillation corpus)."""
    rng = np.random.default_rng(seed)
    topics = list(TOPIC_WORDS)
    texts, labels = [], []
    for _ in range(n):
        words = list(rng.choice(GENERIC, size=7))
        label = int(rng.integers(len(topics)))
        if topical:
            slots = rng.choice(7, size=2, replace=False)
            words[slots[0]] = str(rng.choice(TOPIC_WORDS[topics[label]]))
            other = topics[int(rng.integers(len(topics)))] if rng.random() < 0.25 \
                else topics[label]
            words[slots[1]] = str(rng.choice(TOPIC_WORDS[other]))
        texts.append(" ".join(words))
        labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64)


def minilm_setup(n_clients_pool=600, n_test=400, n_distill=400):
    """all-MiniLM-L6-v2 as the FM (GELU FFN; APoZ counts the inactive side) on the topic
    task: padded id tensors for clients and test, generic sentences for distillation."""
    tokenizer = MiniLMTokenizer()
    texts, labels = topic_sentences(n_clients_pool + n_test, seed=0)
    distill_texts, _ = topic_sentences(n_distill, seed=1, topical=False)
    ids, _ = tokenizer(texts + distill_texts, max_length=32)
    n = n_clients_pool
    return load_minilm(), {
        "X_clients": ids[:n], "y_clients": labels[:n],
        "X_test": ids[n:n + n_test], "y_test": labels[n:n + n_test],
        "X_pretrain": ids[n + n_test:], "n_classes": len(TOPIC_WORDS)}


def digits_setup(args):
    """The tiny FM pretrained on upright digits; the transposed task for the clients."""
    data = fedpft.fedpft_digits(seed=0)
    fm = tiny_encoder(seed=0)
    fedpft.pretrain(fm, data["X_pretrain"], data["y_pretrain"], epochs=args.pretrain_epochs)
    upright = accuracy(fm, fedpft.transposed_digits(data["X_test"]), data["y_test"])
    shifted = accuracy(fm, data["X_test"], data["y_test"])
    data["n_classes"] = 10
    data["fm_accuracy"] = {"upright": upright, "transposed": shifted}
    print(f"FM: L=6 d=32 h=4 d_ff=128 ReLU, pretrained on {len(data['y_pretrain'])} upright "
          f"digits: test accuracy {upright:.4f} upright, {shifted:.4f} on the transposed "
          f"task", flush=True)
    return fm, data


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="30 rounds, 2 seeds")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--alpha", type=float, default=1.0, help="Dirichlet concentration")
    p.add_argument("--pretrain-epochs", type=int, default=40)
    p.add_argument("--fm", choices=("tiny", "minilm"), default="tiny",
                   help="minilm: the packaged all-MiniLM-L6-v2 on a topic task we make")
    p.add_argument("--distill-lr", type=float, default=2e-3,
                   help="AdamW lr of the layer- and neuron-level distillation")
    p.add_argument("--lr", type=float, default=2e-3, help="clients' AdamW lr")
    p.add_argument("--methods", nargs="+", default=list(fedpft.METHODS),
                   choices=fedpft.METHODS)
    p.add_argument("--verbose", action="store_true", help="per-round lines on stderr")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.rounds = args.rounds or (30 if args.quick else 100)
    args.seeds = args.seeds or (2 if args.quick else 3)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.fm == "minilm":
        fm, data = minilm_setup()
        print(f"FM: all-MiniLM-L6-v2 (L=6 d=384 h=12 d_ff=1536 GELU), topic task "
              f"{len(data['y_clients'])} client / {len(data['y_test'])} test sentences, "
              f"{len(data['X_pretrain'])} generic sentences to distil on", flush=True)
    else:
        fm, data = digits_setup(args)
    print(f"K={args.clients}, Dir({args.alpha}), fraction {args.fraction}, rounds "
          f"{args.rounds}, seeds {args.seeds} ({time.perf_counter() - start:.0f} s)",
          flush=True)
    X, y = data["X_clients"], data["y_clients"]
    acc = {m: [] for m in args.methods}
    grad = {where: {scope: {} for scope in fedpft.GRADIENT_SCOPES}
            for where in ("start", "tuned")}
    client_params, bytes_per_round = {}, {}
    for seed in range(args.seeds):
        partition = dirichlet_partition(y, args.clients, args.alpha, seed=seed)
        for method in args.methods:
            t0 = time.perf_counter()
            res = fedpft.run_fedpft(fm, X, y, partition, data["X_test"], data["y_test"],
                                    data["X_pretrain"], method=method, rounds=args.rounds,
                                    n_classes=data["n_classes"], lr=args.lr,
                                    distill_lr=args.distill_lr,
                                    client_fraction=args.fraction, seed=seed,
                                    verbose=args.verbose)
            acc[method].append(res["acc"])
            client_params[method] = res["client_params"]
            bytes_per_round[method] = res["bytes_per_round"]
            print(f"seed {seed} {method:<12} FM acc {res['acc']:.4f} proxy acc "
                  f"{res['proxy_acc']:.4f} client params {res['client_params']} "
                  f"bytes/round {res['bytes_per_round']:.0f} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
            if method == "fedpetuning":
                start_point = fedpft.with_adapters(fm, n_classes=data["n_classes"],
                                                   seed=seed)
                errors_at = fedpft.proxy_gradient_errors(
                    fm, {"start": start_point, "tuned": res["model"]}, X, y,
                    data["X_pretrain"], seed=seed, distill_lr=args.distill_lr)
                for where, errors in errors_at.items():
                    for scope, by_proxy in errors.items():
                        for k, v in by_proxy.items():
                            grad[where][scope].setdefault(k, []).append(v)
                        print(f"seed {seed} gradient error at the {where} adapters, over "
                              f"{scope}: " + ", ".join(f"{k} {v:.4f}"
                                                       for k, v in by_proxy.items()),
                              flush=True)
    elapsed = time.perf_counter() - start
    mean_acc = {m: float(np.mean(v)) for m, v in acc.items()}
    grad_means = {where: {scope: {k: float(np.mean(v)) for k, v in by_proxy.items()}
                          for scope, by_proxy in scopes.items()}
                  for where, scopes in grad.items()}
    mean_grad = grad_means["start"]["adapters"]
    print()
    print(f"FM test accuracy on the {'topic' if args.fm == 'minilm' else 'transposed'} "
          f"task after {args.rounds} rounds, mean over "
          f"{args.seeds} seed(s) ({elapsed:.0f} s)")
    print(format_table(["method", "accuracy", "client params", "bytes/round"],
                       [[m, f"{mean_acc[m]:.4f}", str(client_params[m]),
                         f"{bytes_per_round[m]:.0f}"] for m in args.methods]))
    for where, scopes in grad_means.items():
        for scope, by_proxy in scopes.items():
            if by_proxy:
                print(f"relative gradient error ||g_proxy - g_FM|| / ||g_FM|| at the {where} "
                      f"adapters, over {scope}: " + ", ".join(
                          f"{k} {v:.4f}" for k, v in by_proxy.items()))
    summary = {"method": "fedpft", "acc": mean_acc, "grad_rel_err": mean_grad,
               "client_params": {"fm": client_params.get("fedpetuning"),
                                 "sub_fm": client_params.get("fedpft")},
               "bytes_per_round": bytes_per_round.get("fedpft")}
    checks = {}
    if {"distilled", "undistilled", "layer_drop"} <= set(mean_grad):
        checks["grad_distilled_below_others"] = (
            mean_grad["distilled"] < min(mean_grad["undistilled"], mean_grad["layer_drop"]))
    if "fedpft" in mean_acc and "fedot" in mean_acc:
        checks["fedpft_above_fedot"] = mean_acc["fedpft"] > mean_acc["fedot"]
    print("targets: " + ", ".join(f"{k} {'MET' if v else 'NOT MET'}"
                                  for k, v in checks.items()))
    name = "bench_fedpft" + ("_minilm" if args.fm == "minilm" else "") + (
        "_quick" if args.quick else "")
    finish_deep_benchmark(args, name, summary, elapsed,
                          per_seed={"acc": acc, "grad_rel_err": grad},
                          grad_rel_err_all=grad_means,
                          bytes_per_round_by_method=bytes_per_round,
                          client_params_by_method=client_params, targets=checks,
                          fm_accuracy=data.get("fm_accuracy"))


if __name__ == "__main__":
    main()
