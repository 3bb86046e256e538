"""Fed-LPFM vs FedAvg, FedProx and FML on scikit-learn's digits, every partition of
thesis 002 chapter 5 (METHODS card "Fed-LPFM", asyncopt.deep.fedlpfm).

Setup: digits (1797 x 64, shipped with scikit-learn) cut into a public pool (200, the
teacher's data), a test set (450) and a client pool (1147); a deliberately imperfect
frozen teacher (a linear softmax classifier trained briefly on the public pool), the same
frozen copy held by every client and never communicated; the student MLP 64-32-10 with
GroupNorm; K = 10 clients, all participating every round; partitions iid, dir1.0, dir0.5,
dir0.1, dir0.05, dir0.01, class_split (2 classes per client). Same seed = same partition,
student initialisation and minibatch orders for every method. Fed-LPFM: lam = 0.5, T = 3,
forward KL; FedProx: mu = 0.1; FML: alpha = beta = 0.5. Reported: the global student's
test accuracy after the last round, mean over seeds.

    python benchmarks/bench_fedlpfm.py --quick   # 20 rounds, 2 local epochs, 3 seeds (~2.5 min, 2 cores)
    python benchmarks/bench_fedlpfm.py           # 100 rounds, 5 local epochs, 3 seeds

Prints a partition x method table with Fed-LPFM - FedAvg, then as its last line the JSON
{"method": "fedlpfm", "partitions": {name: {method: accuracy}}}; writes it with the machine
info to benchmarks/results/bench_fedlpfm_quick.json (full mode: bench_fedlpfm.json).
Per-round progress goes to stderr (``--quiet`` turns it off).
"""
import argparse
import json
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from asyncopt.deep.fedlpfm import (METHODS, PARTITION_NAMES, accuracy,  # noqa: E402
                                   digits_pools, make_partition, run_method,
                                   train_teacher)
from benchmarks.common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="20 rounds, 2 local epochs, 3 seeds (about 2.5 minutes on 2 cores)")
    p.add_argument("--rounds", type=int, help="rounds (quick 20, full 100)")
    p.add_argument("--epochs", type=int, help="local epochs (quick 2, full 5)")
    p.add_argument("--seeds", type=int, help="number of seeds 0..S-1 (quick 3, full 3)")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--mu", type=float, default=0.1, help="FedProx coefficient")
    p.add_argument("--lam", type=float, default=0.5, help="Fed-LPFM CE weight")
    p.add_argument("--temperature", type=float, default=3.0)
    p.add_argument("--direction", default="forward", choices=("forward", "reverse"))
    p.add_argument("--teacher-steps", type=int, default=30)
    p.add_argument("--quiet", action="store_true", help="no per-round lines on stderr")
    p.add_argument("--out", help="JSON path (default results/bench_fedlpfm[_quick].json)")
    args = p.parse_args(argv)
    quick = dict(rounds=20, epochs=2, seeds=3) if args.quick else dict(rounds=100, epochs=5,
                                                                        seeds=3)
    for key, value in quick.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    pools = digits_pools(seed=0)
    teacher = train_teacher(pools["X_public"], pools["y_public"], steps=args.teacher_steps)
    teacher_acc = accuracy(teacher, pools["X_test"], pools["y_test"])
    X, y = pools["X_clients"], pools["y_clients"]
    print(f"digits: public {len(pools['y_public'])}, clients {len(y)}, test "
          f"{len(pools['y_test'])}; teacher (linear, {args.teacher_steps} steps) test "
          f"accuracy {teacher_acc:.4f}; K={args.clients}, rounds={args.rounds}, "
          f"epochs={args.epochs}, seeds={args.seeds}", flush=True)
    per_seed = {name: {m: [] for m in METHODS} for name in PARTITION_NAMES}
    start = time.perf_counter()
    for seed in range(args.seeds):
        for name in PARTITION_NAMES:
            parts = make_partition(name, y, args.clients, seed=seed)
            for method in METHODS:
                t0 = time.perf_counter()
                _, result = run_method(
                    method, X, y, parts, args.rounds, teachers=teacher, epochs=args.epochs,
                    batch_size=args.batch_size, lr=args.lr, mu=args.mu, lam=args.lam,
                    temperature=args.temperature, direction=args.direction, seed=seed,
                    X_test=pools["X_test"], y_test=pools["y_test"], verbose=not args.quiet)
                acc = result.history[-1]["metric"]["acc"]
                per_seed[name][method].append(acc)
                print(f"seed {seed} {name:<11} {method:<8} acc {acc:.4f} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
    elapsed = time.perf_counter() - start
    mean = {name: {m: float(np.mean(per_seed[name][m])) for m in METHODS}
            for name in PARTITION_NAMES}
    rows = [[name] + [f"{mean[name][m]:.4f}" for m in METHODS]
            + [f"{mean[name]['fedlpfm'] - mean[name]['fedavg']:+.4f}"]
            for name in PARTITION_NAMES]
    print()
    print(f"test accuracy after {args.rounds} rounds, mean over {args.seeds} seed(s) "
          f"({elapsed:.0f} s)")
    print(format_table(["partition"] + list(METHODS) + ["fedlpfm-fedavg"], rows))
    summary = {"method": "fedlpfm", "partitions": mean}
    out = args.out or os.path.join(RESULTS_DIR, "bench_fedlpfm_quick.json" if args.quick
                                   else "bench_fedlpfm.json")
    write_json(out, dict(summary, per_seed=per_seed, teacher_accuracy=teacher_acc,
                         seconds=elapsed, config={k: v for k, v in vars(args).items()
                                                  if k != "out"},
                         machine=machine_info(("torch", "sklearn"))))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
