"""The torch bridge: the engine's block prox and parameter server for deep models.

docs/design.md §6; the methods are specified in docs/deep_methods.md.

- ``prox``: :class:`ProxOptimizer`, a torch optimizer wrapper that applies the group
  soft-threshold of ``asyncopt.penalties`` (or a half-space projection) to structured
  parameter groups (:class:`ParamGroupSpec`) after every inner step;
- ``partition``: seeded IID / Dirichlet / k-classes / class-split client partitions;
- ``federated``: synchronous federated rounds (FedAvg, FedProx) over flat float32 vectors,
  in process or under mpirun, with byte accounting;
- ``fedlpfm``: Fed-LPFM (frozen per-client teachers distilled into the federated
  student) and its baselines FedAvg, FedProx and FML, the seven partitions by name;
- ``ato``: Auto-Train-Once structured pruning (controller-guided group prox on
  zero-invariant groups, physical removal) and its equal-FLOPs baselines;
- ``transformer``: a transformer encoder with separate attention (q, k, v, o) and FFN
  modules, the specification's tiny model and a BERT-layout model;
- ``lora``: LoRA layers attachable to named modules, adapters as flat vectors;
- ``pretrained``: the packaged all-MiniLM-L6-v2 read offline (safetensors reader, BERT
  WordPiece tokenizer, sentence embeddings);
- ``fedpft``: FedPFT (sub-FM by FFN saliency, layer- and neuron-level distillation,
  adapters plugged into the FM) and its baselines FedPETuning and FedOT;
- ``attnprune``: attention-matrix pruning (gradient descent on a mask of the fused
  W_Q W_K^T, binarised to a sparsity) and its baselines Wanda, SparseGPT and fused
  magnitude; a wrapper running a MultiHeadAttention with pruned per-head fused matrices;
- ``sgr``: SGR local learning (K gradient-isolated modules with local or fixed ETF heads,
  the gradient-reconciliation term by double backward, layer-wise / reforward / global-BP
  baselines, an MPI pipeline with one module per rank, a saved-activation meter);
- ``multilora``: Multi-LoRA, k tasks sharing one low-rank factor (frozen, the paper's
  algorithm, or trained on the server from the sum of the task gradients).

PyTorch is optional for the rest of asyncopt; only this package imports it.
"""
try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("asyncopt.deep needs PyTorch: pip install 'asyncopt[deep]' "
                      "(or torch==2.13.0, the CPU wheel)") from None

from .ato import (ATOController, ATOResult, GatedNet, TinyResNet, ato_schedule,
                  flops_regularizer, magnitude_masks, random_masks, train_ato, train_dense,
                  train_static_group_lasso, uniform_widths)
from .attnprune import (FusedScoreAttention, PrunedAttention, magnitude_prune, optimize_mask,
                        prune_attention_module, prune_fused, sparsegpt_prune, wanda_prune)
from .federated import (FederatedResult, InProcessTransport, LocalTrainer, MPITransport,
                        ParameterVector, aggregation_weights, client_ranks, fedprox_term,
                        run_federated, sample_clients)
from .fedlpfm import (PARTITION_NAMES, DistillationLoss, MutualLearningLoss,
                      distillation_loss, kd_term, make_partition, student_mlp)
from .fedpft import build_sub_fm, run_fedpft
from .lora import LoRALinear, adapter_vector, attach_lora
from .multilora import (MultiLoRALinear, MultiTaskHead, attach_multilora,
                        roberta_base_adapter_counts, set_active_task, task_context,
                        train_multilora)
from .partition import (class_split_partition, dirichlet_partition, iid_partition,
                        k_classes_partition)
from .pretrained import (MiniLMTokenizer, load_minilm, minilm_available, read_safetensors,
                         sentence_embeddings)
from .prox import (ParamGroupSpec, ProxOptimizer, group_soft_threshold_,
                   half_space_project_)
from .sgr import (ETFClassifier, LocalNet, SavedTensorMeter, SGRTrainer, etf_matrix,
                  peak_saved_bytes, plain_net, sgr_loss, split_sequential, train_global_bp,
                  train_local, train_pipeline)
from .transformer import TransformerEncoder, bert_encoder, tiny_encoder

__all__ = [
    "ParamGroupSpec", "ProxOptimizer", "group_soft_threshold_", "half_space_project_",
    "iid_partition", "dirichlet_partition", "k_classes_partition", "class_split_partition",
    "ParameterVector", "fedprox_term", "LocalTrainer", "sample_clients",
    "InProcessTransport", "MPITransport", "client_ranks", "run_federated", "FederatedResult",
    "aggregation_weights", "PARTITION_NAMES", "make_partition", "student_mlp", "kd_term",
    "distillation_loss", "DistillationLoss", "MutualLearningLoss",
    "GatedNet", "TinyResNet", "ATOController", "ATOResult", "train_ato", "train_dense",
    "train_static_group_lasso", "flops_regularizer", "ato_schedule", "magnitude_masks",
    "random_masks", "uniform_widths",
    "TransformerEncoder", "tiny_encoder", "bert_encoder", "LoRALinear", "attach_lora",
    "adapter_vector", "build_sub_fm", "run_fedpft", "MiniLMTokenizer", "load_minilm",
    "minilm_available", "read_safetensors", "sentence_embeddings",
    "FusedScoreAttention", "PrunedAttention", "magnitude_prune", "optimize_mask",
    "prune_attention_module", "prune_fused", "sparsegpt_prune", "wanda_prune",
    "MultiLoRALinear", "MultiTaskHead", "attach_multilora", "roberta_base_adapter_counts",
    "set_active_task", "task_context", "train_multilora",
    "ETFClassifier", "LocalNet", "SavedTensorMeter", "SGRTrainer", "etf_matrix",
    "peak_saved_bytes", "plain_net", "sgr_loss", "split_sequential", "train_global_bp",
    "train_local", "train_pipeline",
]
