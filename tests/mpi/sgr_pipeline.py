"""SPMD check run by tests/test_deep_sgr.py under ``mpirun -n 3``: every rank builds the
same 3-module PlainNet from the same seed (``build``), ``train_pipeline`` trains it for
one epoch of SGR with rank k running module k, and rank 0 writes the trained parameters,
the history and its wire byte count as JSON to argv[1]. argv[2] = "fail": rank 1's block
gets the wrong input width, so its first step raises and every rank must be aborted. The
test trains the same net in process (``train_local``, ``KWARGS``) and compares."""
import json
import sys

import torch

from asyncopt.deep.ato import digits_train_test
from asyncopt.deep.federated import ParameterVector
from asyncopt.deep.sgr import plain_net, train_pipeline

N_MODULES, WIDTH, SEED = 3, 32, 0
KWARGS = dict(mode="sgr", lam=1.0, epochs=1, batch_size=64, lr=0.05, momentum=0.9,
              seed=SEED)


def build(seed=SEED):
    """(net, X_train, y_train): the digits training half, a PlainNet 64 -> 32 x 3."""
    X, y, _, _ = digits_train_test()
    return plain_net(N_MODULES, width=WIDTH, seed=seed), X, y


def main(out, scenario):
    from mpi4py import MPI
    torch.set_num_threads(1)                 # several ranks share the cores
    rank = MPI.COMM_WORLD.Get_rank()
    net, X, y = build()
    if scenario == "fail" and rank == 1:
        net.stages[1].block[0] = torch.nn.Linear(WIDTH + 1, WIDTH)
    result = train_pipeline(net, X if rank == 0 else None, y if rank == 0 else None,
                            **KWARGS)
    if result.is_root:
        with open(out, "w") as f:
            json.dump({"vector": ParameterVector(net).get().tolist(),
                       "history": result.history,
                       "wire_bytes_sent": result.wire_bytes_sent}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
