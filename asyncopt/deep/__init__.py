"""The torch bridge (DESIGN 6): the engine's block prox and parameter server for deep models.

- ``prox``: :class:`ProxOptimizer`, a torch optimizer wrapper that applies the group
  soft-threshold of ``asyncopt.penalties`` (or a half-space projection) to structured
  parameter groups (:class:`ParamGroupSpec`) after every inner step;
- ``partition``: seeded IID / Dirichlet / k-classes / class-split client partitions;
- ``federated``: synchronous federated rounds (FedAvg, FedProx) over flat float32 vectors,
  in process or under mpirun, with byte accounting.

PyTorch is optional for the rest of asyncopt; only this package imports it.
"""
try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("asyncopt.deep needs PyTorch: pip install torch==2.13.0") from None

from .federated import (FederatedResult, InProcessTransport, LocalTrainer, MPITransport,
                        ParameterVector, client_ranks, fedprox_term, run_federated,
                        sample_clients)
from .partition import (class_split_partition, dirichlet_partition, iid_partition,
                        k_classes_partition)
from .prox import (ParamGroupSpec, ProxOptimizer, group_soft_threshold_,
                   half_space_project_)

__all__ = [
    "ParamGroupSpec", "ProxOptimizer", "group_soft_threshold_", "half_space_project_",
    "iid_partition", "dirichlet_partition", "k_classes_partition", "class_split_partition",
    "ParameterVector", "fedprox_term", "LocalTrainer", "sample_clients",
    "InProcessTransport", "MPITransport", "client_ranks", "run_federated", "FederatedResult",
]
