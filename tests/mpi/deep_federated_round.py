"""SPMD check run by tests/test_deep_federated.py under mpirun: every rank builds the same
experiment (``build``), run_federated runs over MPITransport (rank 0 the server, the other
ranks the clients), and rank 0 writes the final global vector, the history and its wire
byte counts as JSON to argv[1]. argv[2]: the client assignment. The test runs the same
experiment in process and compares."""
import json
import sys

import numpy as np
import torch

from asyncopt.deep import LocalTrainer, MPITransport, dirichlet_partition, run_federated

N_CLIENTS, ROUNDS, CLIENT_FRACTION, SEED = 5, 3, 0.6, 0


def build(seed=SEED):
    """(model, local trainer): 240 synthetic samples, 3 classes, a Dirichlet(0.5) split
    over the clients, an MLP with BatchNorm (so buffers travel too), FedProx mu = 0.01."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((240, 8)).astype(np.float32)
    y = np.argmax(X[:, :3] + 0.3 * rng.standard_normal((240, 3)), axis=1)
    partition = dirichlet_partition(y, N_CLIENTS, 0.5, seed=seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 3))
    trainer = LocalTrainer(X, y, partition, epochs=2, batch_size=16, lr=0.1, momentum=0.5,
                           mu=0.01, seed=seed)
    return model, trainer


def main(out, assignment):
    torch.set_num_threads(1)                 # several ranks share the cores
    model, trainer = build()
    transport = MPITransport(assignment=assignment)
    result = run_federated(model, trainer, N_CLIENTS, ROUNDS, client_fraction=CLIENT_FRACTION,
                           seed=SEED, transport=transport, verbose=False)
    if result.is_server:
        with open(out, "w") as f:
            json.dump({"vector": result.vector.tolist(), "history": result.history,
                       "n_ranks": transport.size,
                       "wire_bytes_sent": transport.wire_bytes_sent,
                       "wire_bytes_received": transport.wire_bytes_received}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
