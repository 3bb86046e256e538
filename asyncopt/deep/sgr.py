"""SGR, successive gradient reconciliation for local learning (paper 001, Yang et al., ICML
2024; docs/deep_methods.md, "SGR").

A network is split into K gradient-isolated modules x_k = f_k(x_{k-1}; theta_k), each with
a local head h_k and its own optimizer (:class:`LocalNet`, :class:`SGRTrainer`). Module k
is trained on its local error L_k = CE(h_k(x_k), Y); its input x_{k-1} arrives detached, so
no gradient ever crosses a module boundary. The SGR objective of module k >= 2 (paper
eq. 5 and 6, Algorithm 1) is

    min_{theta_k}  L_k + lam * L_k^SGR,
    L_k^SGR = MSE(rownorm(dL_k/dx_{k-1}), rownorm(dL_{k-1}/dx_{k-1})),

rownorm(g)_i = g_i / ||g_i||_2 (each example's gradient, flattened, to unit length) and
MSE the mean over all B x D entries (``nn.MSELoss``), so
L^SGR = (1/(B D)) sum_i ||a_i - b_i||^2 = (2/(B D)) sum_i (1 - cos(a_i, b_i)), in
[0, 4/D] (:func:`sgr_loss`). dL_{k-1}/dx_{k-1} is computed by module k-1 from its own
CE loss before its update and stored detached; dL_k/dx_{k-1} is taken with
``create_graph=True``, so the gradient of L^SGR with respect to theta_k is a double
backward. Prop. 3.4 (sec. 3.2): if dL_k/dx_{k-1} = dL_{k-1}/dx_{k-1} for every k >= 2
(equal gradients, not only equal directions), the local gradients in theta_k are the
global BP gradients of the last module's loss.

Variants (sec. 3.3, sec. 4.1, Tables 3 and 4):

- local BP: each module is a block with a learnable head (here a Linear head; the paper
  uses conv + linear heads on CIFAR);
- BP-free: each module is one linear-nonlinear block with a fixed equiangular tight frame
  (ETF) classifier (eq. 7), :class:`ETFClassifier`: the d x C matrix

      M = sqrt(C/(C-1)) U (I_C - 1 1^T / C),   U^T U = I_C (d >= C),

  so M^T M = C/(C-1) (I - 1 1^T/C): unit columns with pairwise inner product -1/(C-1),
  M 1 = 0 (C the number of classes; the specification's K);
- baselines (:class:`SGRTrainer` ``mode``): ``"layerwise"``, non-greedy layer-wise
  training (lam = 0; L^SGR is still computed and recorded, not optimised);
  ``"reforward"``, Table 3's "forward again for each local update to use the updated
  output as the input of the next layer": module k takes its step on (x_{k-1}, Y), then
  recomputes x_k = f_k(x_{k-1}; theta_k^new) without gradient and passes that on
  (layer-wise and SGR pass the x_k of the forward made before the update, as
  Algorithm 1 does); global BP,
  :func:`train_global_bp` (CE of the last head, every block trained end to end).

Choices made:

- the stored gradient dL_k/dx_k is computed and passed on by every module k < K (the
  specification's fix: Algorithm 1 stores ``delta_pre`` only in its ``k == 1`` branch,
  so for k >= 3 it would reuse module 1's gradient, which is not even the gradient
  w.r.t. the right tensor);
- it is the gradient of the module's CE loss alone, taken before its optimizer step;
- rownorm divides by max(||g_i||, 1e-12), as ``F.normalize`` (a zero row stays 0);
- the gradient of L^SGR in dL_k/dx_{k-1} is computed in closed form in the forward and
  saved alone (:func:`sgr_loss`); ``F.normalize`` + ``F.mse_loss`` would save both
  normalised gradients besides dL_k/dx_{k-1}. A module step of the PlainNet then saves
  4 tensors of B x width (its input, the ReLU output, dL_k/dz for the double backward,
  dL^SGR/d(dL_k/dx_{k-1})) where global BP saves 1 per block, so SGR's peak is below
  global BP's from K = 4 on (benchmarks/notes/bench_sgr.md);
- ``loss.backward(inputs=...)`` only fills the module's own trainable parameters;
- defaults: lam = 1, SGD lr 0.1, momentum 0.9 (the specification's CIFAR setting).

Pipeline over MPI (:func:`train_pipeline`): rank k runs module k (K ranks for K modules).
For every batch, rank k-1 sends rank k one int64 header [ndim, n, shape[1:]...] (padded
to 8 with -1) and one float32 payload [labels (n, exact below 2^24), x_{k-1} (flattened),
dL_{k-1}/dx_{k-1} (flattened)], with buffer-based ``Isend`` / ``Irecv`` on Dis-DDSS's wire
(``asyncopt.comm.wire``: the waits sleep); nothing travels backward. Rank 0 draws the
batches with the same generator as :func:`train_local`
(``torch.Generator().manual_seed(seed)``, one permutation per epoch), every rank builds
the same net from the same seed, and module k sees exactly the float32 tensors it would
see in process, so the trained parameters are those of :func:`train_local`. Rank k can
work on batch t while rank k+1 works on batch t-1 (one send in flight per rank). At the
end every rank sends its module's parameters and history to rank 0. An error on any rank
prints one message (rank, traceback) and ends all ranks with ``MPI_Abort``.

Activation memory (:class:`SavedTensorMeter`, :func:`peak_saved_bytes`): the bytes of the
distinct tensor storages saved for backward (``torch.autograd.graph.saved_tensors_hooks``),
parameters excluded, live at once; the peak over a training step. Global BP keeps every
block's activations until its backward; a local module frees its graph before the next
module runs, so its peak does not grow with K.
"""
import copy
import math
import sys
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ..comm.wire import abort_all_ranks
from .ato import _batches, _cosine, _labels, _tensor, train_dense
from .federated import ParameterVector

__all__ = [
    "ETFClassifier", "etf_matrix", "LocalModule", "LocalNet", "plain_net", "split_sequential",
    "sgr_loss", "LocalObjective", "local_objective", "SGRTrainer", "LocalTrainingResult",
    "train_local", "train_global_bp", "train_pipeline", "SavedTensorMeter", "peak_saved_bytes",
    "MODES",
]

MODES = ("sgr", "layerwise", "reforward")
MAX_NDIM = 8
TAG_HEADER, TAG_PAYLOAD, TAG_PARAMS, TAG_HISTORY = 51, 52, 53, 54


# ------------------------------------------------------------------------------ the model

def etf_matrix(n_features, n_classes, seed=0, dtype=torch.float32):
    """Return the d x C simplex ETF M = sqrt(C/(C-1)) U (I - 1 1^T/C) of eq. 7.

    U is the orthonormal Q factor of a seeded Gaussian d x C matrix, so
    M^T M = C/(C-1) (I - 1 1^T/C) and M 1 = 0.

    Parameters
    ----------
    n_features : int
        d, at least ``n_classes``.
    n_classes : int
        C >= 2.
    seed : int, default=0
        Seed of the Gaussian matrix.
    dtype : torch.dtype, default=torch.float32
        The result's dtype.

    Returns
    -------
    torch.Tensor
        M, (d, C).
    """
    if n_classes < 2 or n_features < n_classes:
        raise ValueError(f"an ETF needs 2 <= n_classes <= n_features, got {n_classes} "
                         f"classes, {n_features} features")
    gen = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n_features, n_classes, generator=gen,
                                       dtype=torch.float64))
    C = n_classes
    M = math.sqrt(C / (C - 1)) * U @ (torch.eye(C, dtype=torch.float64)
                                      - torch.ones(C, C, dtype=torch.float64) / C)
    return M.to(dtype)


class ETFClassifier(nn.Module):
    """The fixed BP-free head of sec. 3.3: logits = x M, M a simplex ETF.

    M = :func:`etf_matrix` is a buffer, never trained.

    Parameters
    ----------
    n_features : int
        d.
    n_classes : int
        C.
    seed : int, default=0
        Seed of M.
    """

    def __init__(self, n_features, n_classes, seed=0):
        super().__init__()
        self.register_buffer("weight", etf_matrix(n_features, n_classes, seed))

    def forward(self, x):
        """Return the logits x M (x flattened per example).

        Parameters
        ----------
        x : torch.Tensor
            (batch, ...) with d features per example.

        Returns
        -------
        torch.Tensor
            (batch, C).
        """
        return torch.flatten(x, 1) @ self.weight


class LocalModule(nn.Module):
    """Module k of a locally trained net: ``block`` (f_k, part of the model) and ``head``
    (h_k, the local classifier that turns x_k into logits)."""

    def __init__(self, block, head):
        super().__init__()
        self.block, self.head = block, head

    def forward(self, x):
        """(x_k, logits of the local head)."""
        out = self.block(x)
        return out, self.head(out)


class LocalNet(nn.Module):
    """K local modules in a chain; ``forward(x)`` = h_K(f_K(...f_1(x))).

    The last module's head is the model's classifier (the other heads serve training
    only).

    Parameters
    ----------
    modules : iterable of LocalModule
        The modules (block f_k and head h_k each).

    Attributes
    ----------
    stages : torch.nn.ModuleList
        The modules.
    """

    def __init__(self, modules):
        super().__init__()
        self.stages = nn.ModuleList(modules)

    @classmethod
    def from_blocks(cls, blocks, heads):
        """Build a LocalNet from K blocks and K heads.

        Parameters
        ----------
        blocks : sequence of torch.nn.Module
            The blocks f_k.
        heads : sequence of torch.nn.Module
            The local heads h_k, one per block.

        Returns
        -------
        LocalNet
            The net.
        """
        if len(blocks) != len(heads):
            raise ValueError(f"{len(blocks)} blocks but {len(heads)} heads")
        return cls([LocalModule(b, h) for b, h in zip(blocks, heads)])

    def __len__(self):
        return len(self.stages)

    def forward(self, x):
        """Return the last head's logits of the chained blocks.

        Parameters
        ----------
        x : torch.Tensor
            Inputs.

        Returns
        -------
        torch.Tensor
            h_K(f_K(...f_1(x))).
        """
        for stage in self.stages:
            x = stage.block(x)
        return self.stages[-1].head(x)


def split_sequential(model, boundaries):
    """Cut an ``nn.Sequential`` into consecutive ``nn.Sequential`` blocks.

    Parameters
    ----------
    model : torch.nn.Sequential
        The model (its layers are shared, not copied).
    boundaries : int or sequence of int
        An int K: K near-equal pieces (``numpy.array_split`` sizes); a sequence: the start
        indices of blocks 2..K.

    Returns
    -------
    list of torch.nn.Sequential
        The blocks, each with at least one layer.
    """
    layers = list(model.children())
    if isinstance(boundaries, int):
        starts = np.cumsum([len(p) for p in np.array_split(np.arange(len(layers)),
                                                           boundaries)])[:-1]
    else:
        starts = list(boundaries)
    edges = [0] + [int(s) for s in starts] + [len(layers)]
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"every block needs at least one layer, got boundaries {edges}")
    return [nn.Sequential(*layers[a:b]) for a, b in zip(edges, edges[1:])]


def plain_net(n_modules, in_dim=64, width=128, n_classes=10, head="linear", init="he",
              seed=0):
    """Build the specification's PlainNet MLP in_dim -> width x K with local heads.

    Module k is Linear + ReLU with a local head. ``init="he"`` draws the blocks' weights
    from N(0, 2 / fan_in) with biases 0 (He et al. 2015): PyTorch's default
    (U(+-1/sqrt(fan_in))) shrinks the signal's RMS by about sqrt(6) per Linear + ReLU, so
    global BP through 6 such blocks starts slowly (benchmarks/notes/bench_sgr.md). Drawn
    after ``torch.manual_seed(seed)`` (the ETFs from seed + k).

    Parameters
    ----------
    n_modules : int
        K.
    in_dim : int, default=64
        Inputs.
    width : int, default=128
        Units of every block.
    n_classes : int, default=10
        Outputs of the heads.
    head : {"linear", "etf"}, default="linear"
        Learnable Linear(width, n_classes) heads (local BP), or fixed
        :class:`ETFClassifier` heads (BP-free).
    init : {"he", "torch"}, default="he"
        The blocks' initialisation.
    seed : int, default=0
        Seed of the initialisation.

    Returns
    -------
    LocalNet
        The net.
    """
    if head not in ("linear", "etf"):
        raise ValueError(f"head must be 'linear' or 'etf', got {head!r}")
    if init not in ("he", "torch"):
        raise ValueError(f"init must be 'he' or 'torch', got {init!r}")
    torch.manual_seed(seed)
    blocks, heads = [], []
    for k in range(n_modules):
        linear = nn.Linear(in_dim if k == 0 else width, width)
        if init == "he":
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
        blocks.append(nn.Sequential(linear, nn.ReLU()))
        heads.append(nn.Linear(width, n_classes) if head == "linear"
                     else ETFClassifier(width, n_classes, seed=seed + k))
    return LocalNet.from_blocks(blocks, heads)


# ------------------------------------------------------------------------------ the loss

def sgr_loss(delta_now, delta_pre, eps=1e-12):
    """Return L^SGR = MSE(rownorm(delta_now), rownorm(delta_pre)) (eq. 6, Algorithm 1).

    Each example's gradient is flattened and scaled to unit length (rownorm(g)_i = g_i /
    max(||g_i||, eps), as ``F.normalize``), then the squared difference is averaged over
    all B x D entries: 0 when the rows are positive multiples of each other, 4/D when
    opposite. The gradient in ``delta_now`` is formed in closed form in the forward and
    saved alone.

    Parameters
    ----------
    delta_now : torch.Tensor
        dL_k/dx_{k-1}, (B, ...); differentiable.
    delta_pre : torch.Tensor
        dL_{k-1}/dx_{k-1}, same shape; a stored constant.
    eps : float, default=1e-12
        Floor of the row norms.

    Returns
    -------
    torch.Tensor
        The scalar loss.
    """
    return _ReconciliationLoss.apply(delta_now, delta_pre.detach(), eps)


class _ReconciliationLoss(torch.autograd.Function):
    """L^SGR with its gradient in ``delta_now`` computed in the forward, where both
    gradients are at hand, and saved alone (one B x D tensor instead of the normalised rows
    of both): with a = delta_now_i, n = max(||a||, eps), a^ = a / n, r = a^ - b^,

        dL/da = 2/(B D) (r - [||a|| > eps] (r . a^) a^) / n."""

    @staticmethod
    def forward(ctx, delta_now, delta_pre, eps):
        a, b = torch.flatten(delta_now, 1), torch.flatten(delta_pre, 1)
        norm = torch.linalg.vector_norm(a, dim=1, keepdim=True)
        scale = norm.clamp_min(eps)
        a_hat = a / scale
        residual = a_hat - F.normalize(b, dim=1, eps=eps)
        radial = torch.where(norm > eps, (residual * a_hat).sum(1, keepdim=True), 0.0)
        grad = (2.0 / a.numel()) * (residual - radial * a_hat) / scale
        ctx.save_for_backward(grad.reshape(delta_now.shape))
        return residual.square().mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        grad, = ctx.saved_tensors
        return grad_output * grad, None, None


# ------------------------------------------------------------------------------ training

@dataclass
class LocalObjective:
    """What module k computes on one batch: its input x_{k-1} (detached), output x_k,
    local CE loss L_k, L_k^SGR (None without a stored gradient) and the gradient
    dL_k/dx_k it stores for module k+1 (detached; None when not asked for)."""
    x_in: torch.Tensor
    out: torch.Tensor
    loss: torch.Tensor
    sgr: torch.Tensor = None
    stored_gradient: torch.Tensor = None


def local_objective(stage, x_in, y, delta_pre=None, *, store_gradient=True,
                    create_graph=False, params=None):
    """Forward module ``stage`` (a :class:`LocalModule`) on the detached x_{k-1}: L_k =
    CE(h_k(f_k(x_{k-1})), y), dL_k/dx_k (``store_gradient``) and, given ``delta_pre`` =
    dL_{k-1}/dx_{k-1}, L_k^SGR = :func:`sgr_loss` (dL_k/dx_{k-1}, delta_pre).
    ``create_graph``: dL_k/dx_{k-1} keeps its graph, so L^SGR can be differentiated in the
    parameters (double backward); otherwise L^SGR is only computed. ``params``: a
    {name: tensor} dict to run the module with (``torch.func.functional_call``)."""
    x_in = x_in.detach()
    if delta_pre is not None:
        x_in.requires_grad_(True)
    if params is None:
        out, logits = stage(x_in)
    else:
        out, logits = torch.func.functional_call(stage, params, (x_in,))
    loss = F.cross_entropy(logits, y)
    wrt = ([out] if store_gradient else []) + ([x_in] if delta_pre is not None else [])
    grads = torch.autograd.grad(loss, wrt, retain_graph=True,
                                create_graph=create_graph) if wrt else ()
    return LocalObjective(
        x_in=x_in, out=out, loss=loss,
        sgr=None if delta_pre is None else sgr_loss(grads[-1], delta_pre),
        stored_gradient=grads[0].detach() if store_gradient else None)


class SGRTrainer:
    """Per-module optimizers and the local step of every module k of a LocalNet.

    ``mode``: ``"sgr"`` (L_k + lam L_k^SGR, double backward), ``"layerwise"`` (L_k only;
    L^SGR computed and recorded) or ``"reforward"`` (L_k only, the output recomputed after
    the update). Optimizer: SGD(lr, momentum, weight_decay) over each module's trainable
    parameters (block and head).

    Parameters
    ----------
    net : LocalNet
        The net.
    mode : {"sgr", "layerwise", "reforward"}, default="sgr"
        The local objective.
    lam : float, default=1.0
        Weight of L^SGR (the specification's default).
    lr : float, default=0.1
        SGD learning rate.
    momentum : float, default=0.9
        SGD momentum.
    weight_decay : float, default=0.0
        SGD weight decay.
    lr_schedule : {"constant", "cosine"}, default="constant"
        Learning-rate schedule over ``epochs``.
    epochs : int, default=1
        Epochs of the cosine schedule.
    modules : sequence of int, default=None
        The modules this trainer steps; None: all (one on a pipeline rank).

    Attributes
    ----------
    history : list of dict
        One :meth:`end_epoch` record per epoch.
    """

    def __init__(self, net, *, mode="sgr", lam=1.0, lr=0.1, momentum=0.9, weight_decay=0.0,
                 lr_schedule="constant", epochs=1, modules=None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.net, self.mode, self.lam = net, mode, float(lam)
        self.modules = list(range(len(net))) if modules is None else [int(k) for k in modules]
        self.params, self.optimizers, self.schedulers = {}, {}, {}
        for k in self.modules:
            self.params[k] = [p for p in net.stages[k].parameters() if p.requires_grad]
            if self.params[k]:
                self.optimizers[k] = torch.optim.SGD(self.params[k], lr=lr, momentum=momentum,
                                                     weight_decay=weight_decay)
                self.schedulers[k] = _cosine(self.optimizers[k], epochs, lr_schedule)
        self._sums = {k: np.zeros(3) for k in self.modules}    # [loss * n, sgr * n, n]
        self.history = []

    def module_step(self, k, x_in, y, delta_pre=None):
        """Take one local update of module k on (x_{k-1}, Y).

        Parameters
        ----------
        k : int
            The module (0-based).
        x_in : torch.Tensor
            x_{k-1}, the previous module's output (detached here).
        y : torch.Tensor
            The labels.
        delta_pre : torch.Tensor, default=None
            dL_{k-1}/dx_{k-1}, stored by module k-1; None for the first module.

        Returns
        -------
        out : torch.Tensor
            x_k passed on, detached.
        stored_gradient : torch.Tensor or None
            dL_k/dx_k stored for module k+1 (detached); None for the last module.
        """
        stage = self.net.stages[k]
        stage.train()
        objective = local_objective(stage, x_in, y, delta_pre,
                                    store_gradient=k < len(self.net) - 1,
                                    create_graph=self.mode == "sgr" and delta_pre is not None)
        loss = objective.loss
        if self.mode == "sgr" and objective.sgr is not None:
            loss = loss + self.lam * objective.sgr
        if k in self.optimizers:
            self.optimizers[k].zero_grad(set_to_none=True)
            loss.backward(inputs=self.params[k])
            self.optimizers[k].step()
        out = objective.out
        if self.mode == "reforward":
            with torch.no_grad():
                out = stage.block(objective.x_in)
        n = len(y)
        sgr = float("nan") if objective.sgr is None else float(objective.sgr.detach())
        self._sums[k] += [float(objective.loss.detach()) * n, sgr * n, n]
        return out.detach(), objective.stored_gradient

    def train_step(self, x, y):
        """Step modules 1..K in turn on one batch, in process.

        Each module works on the previous one's output and stored gradient.

        Parameters
        ----------
        x : torch.Tensor
            The batch's inputs.
        y : torch.Tensor
            Its labels.
        """
        delta = None
        for k in range(len(self.net)):
            x, delta = self.module_step(k, x, y, delta)

    def end_epoch(self):
        """Close the epoch: step the schedulers and append the epoch's record.

        Returns
        -------
        dict
            ``{"loss": [...], "sgr_loss": [...]}`` per module in ``modules``,
            sample-weighted means over the epoch; ``sgr_loss`` None for the first
            module.
        """
        for sched in self.schedulers.values():
            if sched is not None:
                sched.step()
        record = {"loss": [], "sgr_loss": []}
        for k in self.modules:
            loss, sgr, n = self._sums[k] / max(self._sums[k][2], 1)
            record["loss"].append(float(loss))
            record["sgr_loss"].append(None if math.isnan(sgr) else float(sgr))
            self._sums[k][:] = 0
        self.history.append(record)
        return record


@dataclass
class LocalTrainingResult:
    """``history``: one record per epoch, ``loss`` and ``sgr_loss`` per module (module 1's
    sgr_loss None); ``peak_saved_bytes``: the largest :class:`SavedTensorMeter` peak of a
    training step (None without ``measure_memory``). On pipeline ranks other than 0, ``is_root`` is
    false and ``history`` holds that rank's module only."""
    net: nn.Module
    history: list = field(default_factory=list)
    peak_saved_bytes: int = None
    seconds: float = 0.0
    is_root: bool = True
    wire_bytes_sent: int = 0

    @property
    def mean_sgr_loss(self):
        """The mean L^SGR over modules 2..K and epochs (per epoch, the sample-weighted
        mean over its batches)."""
        values = [v for r in self.history for v in r["sgr_loss"] if v is not None]
        return float(np.mean(values)) if values else float("nan")


def _log_epoch(label, epoch, epochs, record):
    sgr = [v for v in record["sgr_loss"] if v is not None]
    print(f"{label} | epoch {epoch + 1}/{epochs} | loss {np.mean(record['loss']):.4f} | "
          f"L_SGR {np.mean(sgr) if sgr else float('nan'):.3e}", file=sys.stderr, flush=True)


def train_local(net, X, y, *, mode="sgr", lam=1.0, epochs=10, batch_size=64, lr=0.1,
                momentum=0.9, weight_decay=0.0, lr_schedule="constant", seed=0,
                measure_memory=False, verbose=False):
    """Train a LocalNet in process by local learning.

    Parameters
    ----------
    net : LocalNet
        The net, trained in place.
    X : array-like or torch.Tensor
        Inputs.
    y : array-like or torch.Tensor
        Labels.
    mode : {"sgr", "layerwise", "reforward"}, default="sgr"
        The local objective (:class:`SGRTrainer`).
    lam : float, default=1.0
        Weight of L^SGR (the specification's default).
    epochs : int, default=10
        Passes over the data.
    batch_size : int, default=64
        Minibatch size.
    lr : float, default=0.1
        SGD learning rate (the specification's CIFAR setting).
    momentum : float, default=0.9
        SGD momentum.
    weight_decay : float, default=0.0
        SGD weight decay.
    lr_schedule : {"constant", "cosine"}, default="constant"
        Learning-rate schedule over the epochs.
    seed : int, default=0
        Seed of the batch order (``torch.Generator().manual_seed(seed)``, one permutation
        per epoch, as ``ato.train_dense``).
    measure_memory : bool, default=False
        Record the peak saved-activation bytes of the steps (:class:`SavedTensorMeter`).
    verbose : bool, default=False
        One line per epoch on stderr.

    Returns
    -------
    LocalTrainingResult
        The net, the per-epoch history (``loss`` and ``sgr_loss`` per module) and the peak
        saved bytes (None without ``measure_memory``).
    """
    X, y = _tensor(X), _labels(y)
    trainer = SGRTrainer(net, mode=mode, lam=lam, lr=lr, momentum=momentum,
                         weight_decay=weight_decay, lr_schedule=lr_schedule, epochs=epochs)
    gen = torch.Generator().manual_seed(seed)
    meter = SavedTensorMeter(exclude=net.parameters()) if measure_memory else None
    start = time.perf_counter()
    for epoch in range(epochs):
        for idx in _batches(len(X), batch_size, gen):
            if meter is None:
                trainer.train_step(X[idx], y[idx])
            else:
                with meter:
                    trainer.train_step(X[idx], y[idx])
        record = trainer.end_epoch()
        if verbose:
            _log_epoch(mode, epoch, epochs, record)
    return LocalTrainingResult(net=net, history=trainer.history,
                               peak_saved_bytes=None if meter is None else meter.peak,
                               seconds=time.perf_counter() - start)


def train_global_bp(net, X, y, *, epochs=10, batch_size=64, lr=0.1, momentum=0.9,
                    weight_decay=0.0, lr_schedule="constant", seed=0, verbose=False):
    """Train the global BP baseline: the last head's CE back-propagated through every block.

    One SGD over all parameters; ``ato.train_dense`` with the local trainers' defaults and
    batch order.

    Parameters
    ----------
    net : LocalNet
        The net, trained in place.
    X : array-like or torch.Tensor
        Inputs.
    y : array-like or torch.Tensor
        Labels.
    epochs : int, default=10
        Passes over the data.
    batch_size : int, default=64
        Minibatch size.
    lr : float, default=0.1
        SGD learning rate (the specification's CIFAR setting).
    momentum : float, default=0.9
        SGD momentum.
    weight_decay : float, default=0.0
        SGD weight decay.
    lr_schedule : {"constant", "cosine"}, default="constant"
        Learning-rate schedule over the epochs.
    seed : int, default=0
        Seed of the batch order (``torch.Generator().manual_seed(seed)``, one permutation
        per epoch, as ``ato.train_dense``).
    verbose : bool, default=False
        One line per epoch.

    Returns
    -------
    LocalNet
        ``net``.
    """
    return train_dense(net, X, y, epochs=epochs, lr=lr, momentum=momentum,
                       weight_decay=weight_decay, batch_size=batch_size,
                       lr_schedule=lr_schedule, seed=seed, verbose=verbose)


# ------------------------------------------------------------------------------ the pipeline

class _PipelineLink:
    """Rank k's link to rank k+1 (send) and from rank k-1 (receive) on Dis-DDSS's wire
    (:class:`asyncopt.comm.wire.Wire`, which counts the bytes), numpy buffers only."""

    def __init__(self, comm):
        from ..comm.wire import Wire, wait_all
        self.wire, self.wait_all = Wire(comm), wait_all
        self.pending = []

    def send(self, x, y, delta):
        """Header [ndim, *shape] (int64, padded with -1) and payload [y, x, delta]
        (float32) to rank + 1; waits for this rank's previous send first (one batch in flight)."""
        self.flush()
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= 2 ** 24):
            raise ValueError("labels travel as float32: they must lie in [0, 2^24)")
        shape = tuple(x.shape)
        if len(shape) > MAX_NDIM - 1:
            raise ValueError(f"activations of more than {MAX_NDIM - 1} dims cannot travel")
        header = np.full(MAX_NDIM, -1, dtype=np.int64)
        header[:len(shape) + 1] = (len(shape),) + shape
        payload = np.concatenate([y.numpy().astype(np.float32),
                                  x.numpy().astype(np.float32, copy=False).ravel(),
                                  delta.numpy().astype(np.float32, copy=False).ravel()])
        dest = self.wire.rank + 1
        self.pending = [(self.wire.isend(header, dest, TAG_HEADER), header),
                        (self.wire.isend(payload, dest, TAG_PAYLOAD), payload)]

    def receive(self):
        """(x, y, delta) of the next batch from rank - 1."""
        source = self.wire.rank - 1
        header = self.wire.recv(np.empty(MAX_NDIM, dtype=np.int64), source, TAG_HEADER)
        shape = tuple(int(s) for s in header[1:1 + header[0]])
        n, size = shape[0], int(np.prod(shape))
        payload = self.wire.recv(np.empty(n + 2 * size, dtype=np.float32), source,
                                 TAG_PAYLOAD)
        y = torch.from_numpy(payload[:n].astype(np.int64))
        x = torch.from_numpy(payload[n:n + size].reshape(shape))
        delta = torch.from_numpy(payload[n + size:].reshape(shape))
        return x, y, delta

    def flush(self):
        self.wait_all([request for request, _ in self.pending])
        self.pending = []


def train_pipeline(net, X, y, *, comm=None, mode="sgr", lam=1.0, epochs=10, batch_size=64,
                   lr=0.1, momentum=0.9, weight_decay=0.0, lr_schedule="constant", seed=0,
                   verbose=False):
    """Run :func:`train_local` as a pipeline over MPI ranks, rank k running module k.

    Call it on every rank of ``comm`` (size = K) with the same ``net`` (build it from the
    same seed). Float32 nets only. The trained parameters are those of
    :func:`train_local`.

    Parameters
    ----------
    net : LocalNet
        The net (float32), the same on every rank.
    X : array-like or torch.Tensor or None
        Inputs, read on rank 0 only (None elsewhere).
    y : array-like or torch.Tensor or None
        Labels, read on rank 0 only (None elsewhere).
    comm : mpi4py.MPI.Comm, default=None
        The communicator, one rank per module; None: ``MPI.COMM_WORLD``.
    mode : {"sgr", "layerwise", "reforward"}, default="sgr"
        The local objective (:class:`SGRTrainer`).
    lam : float, default=1.0
        Weight of L^SGR (the specification's default).
    epochs : int, default=10
        Passes over the data.
    batch_size : int, default=64
        Minibatch size.
    lr : float, default=0.1
        SGD learning rate (the specification's CIFAR setting).
    momentum : float, default=0.9
        SGD momentum.
    weight_decay : float, default=0.0
        SGD weight decay.
    lr_schedule : {"constant", "cosine"}, default="constant"
        Learning-rate schedule over the epochs.
    seed : int, default=0
        Seed of the batch order (``torch.Generator().manual_seed(seed)``, one permutation
        per epoch, as ``ato.train_dense``).
    verbose : bool, default=False
        One line per epoch and rank.

    Returns
    -------
    LocalTrainingResult
        On rank 0: ``net`` holding every trained module and ``history`` every module's
        record, as :func:`train_local` returns them; on the other ranks ``is_root=False``
        and that rank's module's history.
    """
    from mpi4py import MPI
    comm = comm if comm is not None else MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        if size != len(net):
            raise ValueError(f"the pipeline runs one module per rank: {len(net)} modules "
                             f"need {len(net)} ranks, got {size}")
        if any(p.dtype != torch.float32 for p in net.parameters()):
            raise ValueError("the pipeline sends float32 tensors: use a float32 net")
        trainer = SGRTrainer(net, mode=mode, lam=lam, lr=lr, momentum=momentum,
                             weight_decay=weight_decay, lr_schedule=lr_schedule,
                             epochs=epochs, modules=[rank])
        link = _PipelineLink(comm)
        start = time.perf_counter()
        if rank == 0:
            X, y = _tensor(X), _labels(y)
            gen = torch.Generator().manual_seed(seed)
            counts = np.array([len(X), -(-len(X) // batch_size)], dtype=np.int64)
        else:
            counts = np.empty(2, dtype=np.int64)
        link.wire.bcast(counts)
        for epoch in range(epochs):
            batches = _batches(len(X), batch_size, gen) if rank == 0 else None
            for b in range(int(counts[1])):
                if rank == 0:
                    x_in, y_b, delta = X[batches[b]], y[batches[b]], None
                else:
                    x_in, y_b, delta = link.receive()
                out, delta_out = trainer.module_step(rank, x_in, y_b, delta)
                if rank < size - 1:
                    link.send(out, y_b, delta_out)
            record = trainer.end_epoch()
            if verbose:
                _log_epoch(f"{mode} rank {rank}", epoch, epochs, record)
        link.flush()
        history = _gather_modules(comm, net, trainer.history, link)
        return LocalTrainingResult(net=net, history=history,
                                   seconds=time.perf_counter() - start, is_root=rank == 0,
                                   wire_bytes_sent=link.wire.sent)
    except BaseException:
        abort_all_ranks(comm, "asyncopt.deep.sgr")


def _gather_modules(comm, net, own_history, link):
    """Every rank k > 0 sends module k's parameter vector and its [loss, sgr_loss] per
    epoch to rank 0, which loads them; rank 0 returns the merged history."""
    rank, size = comm.Get_rank(), comm.Get_size()
    epochs = len(own_history)
    own = np.array([[r["loss"][0], np.nan if r["sgr_loss"][0] is None else r["sgr_loss"][0]]
                    for r in own_history], dtype=np.float64).reshape(epochs, 2)
    if rank > 0:
        link.wire.send(ParameterVector(net.stages[rank]).get(), 0, TAG_PARAMS)
        link.wire.send(own, 0, TAG_HISTORY)
        return own_history
    per_module = [own]
    for k in range(1, size):
        flat = ParameterVector(net.stages[k])
        flat.set(link.wire.recv(np.empty(flat.size, dtype=np.float32), k, TAG_PARAMS))
        per_module.append(link.wire.recv(np.empty((epochs, 2), dtype=np.float64), k,
                                         TAG_HISTORY))
    return [{"loss": [float(m[e, 0]) for m in per_module],
             "sgr_loss": [None if np.isnan(m[e, 1]) else float(m[e, 1]) for m in per_module]}
            for e in range(epochs)]


# ------------------------------------------------------------------------------ memory

class SavedTensorMeter:
    """Count the bytes saved for backward, live at once, while the context is active.

    It can be entered again for each step: ``peak`` is the largest over all of them. Every
    tensor autograd saves goes through ``saved_tensors_hooks``; its storage is counted once
    however many saved tensors (views) share it, from the save until the last graph node
    holding it is freed. Storages of the tensors in ``exclude`` (the parameters) are not
    counted: they exist without training.

    Parameters
    ----------
    exclude : iterable of torch.Tensor, default=()
        Tensors whose storages are not counted.

    Attributes
    ----------
    current : int
        Bytes live now.
    peak : int
        The largest ``current`` so far.
    """

    def __init__(self, exclude=()):
        self.excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self.live = {}                  # storage pointer -> [bytes, holders]
        self.current = self.peak = 0
        self._hooks = None

    def _release(self, key):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.excluded:
            return tensor
        holder = _SavedTensor(tensor)
        if key in self.live:
            self.live[key][1] += 1
        else:
            self.live[key] = [storage.nbytes(), 1]
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        weakref.finalize(holder, self._release, key)
        return holder

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _SavedTensor) else saved

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._hooks = None
        return False


class _SavedTensor:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


def peak_saved_bytes(net, x, y, method="sgr", lam=1.0):
    """Return the peak saved-activation bytes of one training step.

    Taken on a copy of ``net`` (left as is), with :class:`SavedTensorMeter`.

    Parameters
    ----------
    net : LocalNet
        The net.
    x : array-like or torch.Tensor
        The batch's inputs.
    y : array-like or torch.Tensor
        Its labels.
    method : {"sgr", "layerwise", "reforward", "global_bp"}, default="sgr"
        The training step.
    lam : float, default=1.0
        Weight of L^SGR.

    Returns
    -------
    int
        The peak bytes.
    """
    net = copy.deepcopy(net)
    x, y = _tensor(x), _labels(y)
    meter = SavedTensorMeter(exclude=net.parameters())
    if method == "global_bp":
        with meter:
            F.cross_entropy(net(x), y).backward()
    else:
        trainer = SGRTrainer(net, mode=method, lam=lam)
        with meter:
            trainer.train_step(x, y)
    return meter.peak
