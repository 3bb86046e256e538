"""Fed-LPFM on scikit-learn's digits (thesis ch. 5; docs/deep_methods.md, "Fed-LPFM").

A frozen, imperfect teacher (an MLP fitted on a public pool of 700 digits that no client
holds, more accurate than what the client digits teach a federated student) is
held privately by every client; the GroupNorm student MLP 64-32-10 is trained federatedly
with the local loss lam CE + (1 - lam) T^2 KL(teacher || student). Only the student's
vector is exchanged. Compared with FedAvg under the class split (2 classes per
client), same seed.

    PYTHONPATH=. python examples/fedlpfm_digits.py [--partition class_split] [--rounds 30]

It prints the teacher's and each method's test accuracy; `benchmarks/bench_fedlpfm.py`
measures them over seeds and partitions.
"""
import argparse

import torch

from asyncopt.deep.fedlpfm import (PARTITION_NAMES, accuracy, digits_pools, make_partition,
                                   run_method, train_teacher)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--partition", default="class_split", choices=PARTITION_NAMES)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)

    pools = digits_pools(seed=0)
    teacher = train_teacher(pools["X_public"], pools["y_public"])   # MLP teacher, frozen
    print(f"teacher test accuracy {accuracy(teacher, pools['X_test'], pools['y_test']):.3f}")
    X, y = pools["X_clients"], pools["y_clients"]
    parts = make_partition(args.partition, y, 10, seed=args.seed)
    for method in ("fedavg", "fedlpfm"):
        student, result = run_method(method, X, y, parts, args.rounds, teachers=teacher,
                                     epochs=args.epochs, lr=0.1, lam=0.5, temperature=3.0,
                                     seed=args.seed, X_test=pools["X_test"],
                                     y_test=pools["y_test"], verbose=False)
        print(f"{method:<8} {args.partition}: test accuracy "
              f"{result.history[-1]['metric']['acc']:.3f}, "
              f"{result.bytes_sent + result.bytes_received} bytes exchanged "
              f"(student only: {result.vector.size} floats)")


if __name__ == "__main__":
    main()
