"""Fed-LPFM vs FedAvg, FedProx and FML on scikit-learn's digits, every partition of
thesis 002 chapter 5 (METHODS card "Fed-LPFM", asyncopt.deep.fedlpfm).

Setup: digits (1797 x 64, shipped with scikit-learn) cut into a public pool (700, the
teacher's data), a test set (450) and a client pool (647); a frozen teacher fitted on the
public pool only (default: MLP 64-128-10, weight decay 1e-3, 300 Adam steps, test accuracy
0.982: imperfect, but it knows more than the clients together, as the thesis' foundation
model does; ``--public 200`` gives the first setting's teacher, 0.936, below what FedAvg
reaches; ``--teacher linear``: the first version's linear teacher, 30 SGD steps), the same
frozen copy held by every client and never communicated; the student MLP 64-32-10 with
GroupNorm; K = 10 clients, all participating every round, 5 local epochs of SGD (lr 0.1,
batch 32) for every method; partitions iid, dir1.0, dir0.5, dir0.1, dir0.05, dir0.01,
class_split (2 classes per client). Same seed = same partition, student initialisation
and minibatch orders for every method. Fed-LPFM: lam = 0.5, T = 3, forward KL; FedProx:
mu = 0.1; FML: alpha = beta = 0.5. Reported: the global student's test accuracy after the
last round, mean over seeds, and the teacher's test accuracy.

Hyperparameters were chosen without the test set: ``--validation`` trains on 80% of the
client pool and reports accuracy on the other 20% (``fedlpfm.validation_split``); the
choices and the validation figures are in the docstrings of asyncopt.deep.fedlpfm.

    python benchmarks/bench_fedlpfm.py --quick   # 12 rounds, 5 local epochs, 3 seeds (~2 min)
    python benchmarks/bench_fedlpfm.py           # 100 rounds, 5 local epochs, 3 seeds

Prints a partition x method table with Fed-LPFM - FedAvg, then as its last line the JSON
{"method": "fedlpfm", "partitions": {name: {method: accuracy}}, "teacher_accuracy": ...};
writes it with per-seed figures and the machine info to
benchmarks/results/bench_fedlpfm_quick.json (full mode: bench_fedlpfm.json; with
``--validation``: bench_fedlpfm_validation[_quick].json). ``--partitions`` and
``--methods`` restrict the run (exploration only). Per-round progress goes to stderr
(``--quiet`` turns it off).
"""
import argparse
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from asyncopt.deep.fedlpfm import (DEFAULT_DIRECTION, DEFAULT_LAM,  # noqa: E402
                                   DEFAULT_N_PUBLIC, DEFAULT_TEMPERATURE, KL_DIRECTIONS,
                                   METHODS, PARTITION_NAMES, TEACHER_KINDS, accuracy,
                                   digits_pools, make_partition, run_method, train_teacher,
                                   validation_split)
from benchmarks.common import finish_deep_benchmark, format_table  # noqa: E402

QUICK = dict(rounds=12, epochs=5, seeds=3)
FULL = dict(rounds=100, epochs=5, seeds=3)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK['rounds']} rounds, {QUICK['epochs']} local epochs, "
                        f"{QUICK['seeds']} seeds (under 3 minutes on 2 cores)")
    p.add_argument("--rounds", type=int,
                   help=f"rounds (quick {QUICK['rounds']}, full {FULL['rounds']})")
    p.add_argument("--epochs", type=int,
                   help=f"local epochs (quick {QUICK['epochs']}, full {FULL['epochs']})")
    p.add_argument("--seeds", type=int, help="number of seeds 0..S-1 (quick 3, full 3)")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--mu", type=float, default=0.1, help="FedProx coefficient")
    p.add_argument("--lam", type=float, default=DEFAULT_LAM, help="Fed-LPFM CE weight")
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE)
    p.add_argument("--direction", default=DEFAULT_DIRECTION, choices=KL_DIRECTIONS)
    p.add_argument("--teacher", default="mlp", choices=TEACHER_KINDS,
                   help="teacher kind (train_teacher): mlp (default) or the first "
                        "version's briefly trained linear one")
    p.add_argument("--teacher-steps", type=int,
                   help="teacher training steps (default: train_teacher's, mlp 300, linear 30)")
    p.add_argument("--public", type=int, default=DEFAULT_N_PUBLIC,
                   help=f"size of the public pool the teacher is fitted on (digits_pools; "
                        f"default {DEFAULT_N_PUBLIC}; 200 was the first setting, see the "
                        f"README)")
    p.add_argument("--validation", action="store_true",
                   help="choose hyperparameters without the test set: train on 80%% of the "
                        "client pool and report accuracy on the other 20%% "
                        "(fedlpfm.validation_split) instead of the test set")
    p.add_argument("--partitions", default=",".join(PARTITION_NAMES),
                   help="comma-separated subset of the partitions (exploration only)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated subset of the methods (exploration only)")
    p.add_argument("--quiet", action="store_true", help="no per-round lines on stderr")
    p.add_argument("--out", help="JSON path (default results/bench_fedlpfm[_quick].json)")
    args = p.parse_args(argv)
    args.partitions = [n for n in args.partitions.split(",") if n]
    args.methods = [m for m in args.methods.split(",") if m]
    for m in args.methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}")
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    pools = digits_pools(n_public=args.public, seed=0)
    teacher = train_teacher(pools["X_public"], pools["y_public"], steps=args.teacher_steps,
                            kind=args.teacher)
    X, y = pools["X_clients"], pools["y_clients"]
    X_eval, y_eval, where = pools["X_test"], pools["y_test"], "test"
    if args.validation:
        X, y, X_eval, y_eval = validation_split(X, y)
        where = "validation"
    teacher_acc = accuracy(teacher, X_eval, y_eval)
    print(f"digits: public {len(pools['y_public'])}, clients {len(y)}, {where} "
          f"{len(y_eval)}; teacher ({args.teacher}) {where} accuracy {teacher_acc:.4f}; "
          f"K={args.clients}, rounds={args.rounds}, epochs={args.epochs}, "
          f"seeds={args.seeds}; Fed-LPFM lam={args.lam}, T={args.temperature}, "
          f"{args.direction} KL", flush=True)
    names, methods = args.partitions, args.methods
    per_seed = {name: {m: [] for m in methods} for name in names}
    start = time.perf_counter()
    for seed in range(args.seeds):
        for name in names:
            parts = make_partition(name, y, args.clients, seed=seed)
            for method in methods:
                t0 = time.perf_counter()
                _, result = run_method(
                    method, X, y, parts, args.rounds, teachers=teacher, epochs=args.epochs,
                    batch_size=args.batch_size, lr=args.lr, mu=args.mu, lam=args.lam,
                    temperature=args.temperature, direction=args.direction, seed=seed,
                    X_test=X_eval, y_test=y_eval, verbose=not args.quiet)
                acc = result.history[-1]["metric"]["acc"]
                per_seed[name][method].append(acc)
                print(f"seed {seed} {name:<11} {method:<8} acc {acc:.4f} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
    elapsed = time.perf_counter() - start
    mean = {name: {m: float(np.mean(per_seed[name][m])) for m in methods} for name in names}
    diff = "fedlpfm" in methods and "fedavg" in methods
    rows = [[name] + [f"{mean[name][m]:.4f}" for m in methods]
            + ([f"{mean[name]['fedlpfm'] - mean[name]['fedavg']:+.4f}"] if diff else [])
            for name in names]
    print()
    print(f"{where} accuracy after {args.rounds} rounds, mean over {args.seeds} seed(s) "
          f"({elapsed:.0f} s); teacher {teacher_acc:.4f}")
    print(format_table(["partition"] + list(methods) + (["fedlpfm-fedavg"] if diff else []),
                       rows))
    summary = {"method": "fedlpfm", "partitions": mean, "teacher_accuracy": teacher_acc}
    if args.validation:
        summary["evaluated_on"] = "validation"
    name = "bench_fedlpfm" + ("_validation" if args.validation else "") + (
        "_quick" if args.quick else "")
    finish_deep_benchmark(args, name, summary, elapsed, per_seed=per_seed)


if __name__ == "__main__":
    main()
