"""SPMD check run by tests/test_deep_multilora.py under mpirun: every rank builds the same
Multi-LoRA transformer (``build``: 4 tasks with their own heads on a tiny encoder, q and v
adapted), ``train_multilora(..., comm=COMM_WORLD)`` runs the parameter-server protocol over
MPI (rank 0 the server with the shared factors, tasks on ranks 1 + i mod W), and rank 0
writes the trained vector of every trainable parameter and the history as JSON to
argv[1]. argv[2]: "trained" or "frozen" shared factor; argv[3] "fail" makes rank 1's task
loss raise. The test runs the same experiment in process and compares."""
import json
import sys

import torch
import torch.nn.functional as F

from asyncopt.deep import ParameterVector, attach_multilora, train_multilora
from asyncopt.deep.transformer import tiny_encoder

N_TASKS, STEPS = 4, 6


def build(train_shared, fail_on_task=None):
    """(model, task_loss): per task 12 random digits-shaped inputs and 3-class labels."""
    model = tiny_encoder(d_model=16, n_heads=2, d_ff=32, n_layers=2, n_classes=3, seed=0)
    attach_multilora(model, N_TASKS, r=2, train_shared=train_shared)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(N_TASKS, STEPS, 12, 64, generator=g)
    y = torch.randint(0, 3, (N_TASKS, STEPS, 12), generator=g)

    def task_loss(model, task, step):
        if task == fail_on_task:
            raise RuntimeError(f"task {task} failed on purpose")
        return F.cross_entropy(model(X[task, step]), y[task, step])
    return model, task_loss


def optimizer(params):
    return torch.optim.Adam(params, lr=0.01)


def main(out, mode, fail=""):
    from mpi4py import MPI
    torch.set_num_threads(1)                 # several ranks share the cores
    model, task_loss = build(mode == "trained", fail_on_task=1 if fail == "fail" else None)
    result = train_multilora(model, task_loss, N_TASKS, STEPS, make_optimizer=optimizer,
                             comm=MPI.COMM_WORLD)
    if result.is_server:
        vector = ParameterVector(model, buffers=False, trainable_only=True).get()
        with open(out, "w") as f:
            json.dump({"vector": vector.tolist(), "shared": result.vector.tolist(),
                       "history": result.history}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
