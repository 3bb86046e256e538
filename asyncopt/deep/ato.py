"""ATO, Auto-Train-Once: train once and prune structurally, guided by a controller network.

Thesis 002, chapter 4 (Xidong Wu, PhD thesis, 2024); docs/deep_methods.md, "ATO". No
fine-tuning.

Pieces (the specification's notation):

- zero-invariant groups (ZIGs), :class:`GatedNet`: a Linear row with its bias, or a conv
  output channel with its BatchNorm gamma and beta. Zeroing a group zeroes that output
  exactly, so the unit can be cut (:meth:`GatedNet.compact`). Every hidden layer is one
  block of gated groups; the classifier's outputs are not gated.
- the controller, :class:`ATOController`: one fixed orthogonal 64-d token per block ->
  bidirectional GRU(64 -> 128 each way) -> LayerNorm(256) + ReLU -> one bias-free
  Linear(256 -> |block|) per block -> logits o, and the mask

      w = round(sigmoid((o + s + 3.0) / 0.4)),   s ~ Gumbel(0, 1),

  with a straight-through gradient (the gradient of the sigmoid). w is all ones at init.
- the FLOPs regulariser of the controller loss, :func:`flops_regularizer`:

      CE(f(x; M, w)) + gamma * log(max(P(w), p P_total) / (p P_total)),

  P(w) the multiply-accumulates of the gated layers under the mask (:meth:`GatedNet.flops`).
- the target loss CE(f(x; M)) + sum_g lam_g ||M_g||_2, lam_g = lam (1 - w_g): after each
  optimizer step, once epoch >= T_w, the engine's group prox (``asyncopt.deep.prox``:
  :class:`~asyncopt.deep.prox.ProxOptimizer`, :func:`~asyncopt.deep.prox.group_soft_threshold_`)

      M_g <- M_g * max(0, 1 - eta lam_g / ||M_g||_2)

  (eta the optimizer's lr; the thesis' alpha is a typo for eta), or the HSPG half-space
  projection M_g <- 0 if <M_g, M^_g> < eps ||M^_g||^2 (``operator="half_space"``).
- the schedule (:func:`ato_schedule`): the controller is trained with Adam (lr 1e-3) on a
  fixed random 5% of the training data only in epochs [T_start, T_end) with the target net
  in eval mode; the prox runs from T_w on; the mask is frozen at T_end. Defaults T_start =
  10%, T_w = 20%, T_end = 50% of the epochs, lam = 10, gamma = 4.

Implementation choices the specification leaves open (stated here, all switchable):

- the mask that steers the prox and is frozen is the most probable value of the sampled
  mask, w_g = [P(w_g = 1) > 1/2] = [o + 3 - ln ln 2 > 0] (s at the Gumbel median); the
  Gumbel noise itself is used only to train the controller;
- the specification fixes the controller's data (5%) and optimizer (Adam, lr 1e-3), not
  its steps: each controller epoch runs ``controller_passes`` = 4 passes over that subset
  in batches of ``controller_batch_size`` = 8, because one pass in large batches moves the
  logits too little to reach the budget by T_end (benchmarks/notes/bench_ato.md);
- at T_end, when the frozen mask's FLOPs ratio lies outside [p - margin, p]
  (``budget_margin``, default 0.03; None turns this off), it is moved greedily along the
  logits (switch off the kept group of smallest logit / on the pruned group of largest
  logit) into that band, keeping at least one group per block so the compact model is
  valid. ``ATOResult.history`` records how many groups this moved.
"""
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .prox import ParamGroupSpec, ProxOptimizer

__all__ = [
    "GatedNet", "TinyResNet", "ATOController", "ATOResult", "flops_regularizer", "ato_schedule",
    "train_ato", "train_dense", "train_static_group_lasso", "accuracy", "magnitude_masks",
    "random_masks", "uniform_widths", "uniform_masks", "masks_from_counts",
    "digits_train_test",
]


# ------------------------------------------------------------------------------ the model

class _GatedBlocks:
    """What every ATO target net shares, given ``widths`` (kept groups per gated block),
    ``config`` (the constructor's other arguments) and ``zig_tensors(block)`` (the tensors
    whose rows / channels form the block's zero-invariant groups)."""

    def like(self, widths):
        """Build a fresh (re-initialised) net of the same kind with other block widths.

        Parameters
        ----------
        widths : sequence of int
            Kept groups per gated block.

        Returns
        -------
        torch.nn.Module
            The new net, same configuration otherwise.
        """
        return type(self)(widths=widths, **self.config)

    @property
    def block_sizes(self):
        """The number of groups of every gated block (a list of int).
        """
        return list(self.widths)

    def zig_spec(self, block, groups=None):
        """Return the :class:`ParamGroupSpec` of a block's zero-invariant groups.

        Parameters
        ----------
        block : int
            The gated block.
        groups : sequence of int, default=None
            Only these group indices, in this order; None: all of them.

        Returns
        -------
        ParamGroupSpec
            The block's ZIGs.
        """
        if groups is None:
            return ParamGroupSpec.aligned([(t, 0) for t in self.zig_tensors(block)])
        return ParamGroupSpec([[(t, 0, int(g)) for t in self.zig_tensors(block)]
                               for g in groups])

    @torch.no_grad()
    def group_norms(self):
        """Return ||M_g||_2 of every ZIG.

        Returns
        -------
        list of torch.Tensor
            One (|block|,) tensor per block.
        """
        return [self.zig_spec(b).sq_norms().sqrt() for b in range(len(self.widths))]

    def full_masks(self):
        """Return all-ones masks, one per block (the unpruned net).

        Returns
        -------
        list of torch.Tensor
            One (|block|,) tensor of ones per block.
        """
        return [torch.ones(w) for w in self.widths]


class GatedNet(_GatedBlocks, nn.Module):
    """A chain of gated blocks and a linear classifier, the target network of ATO.

    ``kind="linear"``: block i is ``Linear(widths[i-1], widths[i])`` (optionally
    BatchNorm1d) + ReLU; its ZIG g is row g of the weight and entry g of the bias (and of
    the BatchNorm weight and bias). ``kind="conv"``: block i is ``Conv2d(., widths[i], k,
    padding=k//2, bias=False)`` + BatchNorm2d + ReLU on ``hw`` = (H, W) maps, then global
    average pooling; its ZIG g is output channel g with BN gamma_g and beta_g.
    ``forward(x, masks)`` multiplies block i's output (after its norm, before the ReLU) by
    ``masks[i]`` (one value per group): the masked model f(x; M, w).

    Parameters
    ----------
    in_dim : int
        Input features (linear) or channels (conv).
    widths : sequence of int
        Groups (units or channels) of every gated block, each >= 1.
    n_out : int
        Classifier outputs.
    kind : {"linear", "conv"}, default="linear"
        Block type.
    hw : tuple of int, default=None
        (H, W) of the conv maps; required for ``kind="conv"``.
    kernel_size : int, default=3
        Conv kernel size.
    batch_norm : bool, default=None
        BatchNorm after every gated layer; None: for conv only.

    Attributes
    ----------
    widths : list of int
        The block widths.
    config : dict
        The constructor's other arguments (for :meth:`like`).
    layers : torch.nn.ModuleList
        The gated layers.
    norms : torch.nn.ModuleList
        Their norms (Identity without BatchNorm).
    head : torch.nn.Linear
        The classifier.
    """

    def __init__(self, in_dim, widths, n_out, *, kind="linear", hw=None, kernel_size=3,
                 batch_norm=None):
        super().__init__()
        if kind not in ("linear", "conv"):
            raise ValueError(f"kind must be 'linear' or 'conv', got {kind!r}")
        if kind == "conv" and hw is None:
            raise ValueError("kind='conv' needs hw=(H, W)")
        if any(int(w) < 1 for w in widths):
            raise ValueError(f"every block needs at least one unit, got widths {list(widths)}")
        batch_norm = (kind == "conv") if batch_norm is None else bool(batch_norm)
        self.config = dict(in_dim=int(in_dim), n_out=int(n_out), kind=kind,
                           hw=None if hw is None else tuple(hw), kernel_size=int(kernel_size),
                           batch_norm=batch_norm)
        self.widths = [int(w) for w in widths]
        self.layers, self.norms = nn.ModuleList(), nn.ModuleList()
        prev = int(in_dim)
        for width in self.widths:
            if kind == "linear":
                self.layers.append(nn.Linear(prev, width))
                self.norms.append(nn.BatchNorm1d(width) if batch_norm else nn.Identity())
            else:
                self.layers.append(nn.Conv2d(prev, width, kernel_size, padding=kernel_size // 2,
                                             bias=not batch_norm))
                self.norms.append(nn.BatchNorm2d(width) if batch_norm else nn.Identity())
            prev = width
        self.head = nn.Linear(prev, int(n_out))

    @classmethod
    def mlp(cls, sizes, batch_norm=False):
        """Build a linear GatedNet from its layer sizes.

        ``GatedNet.mlp((64, 128, 128, 10))`` is the specification's MLP 64-128-128-10.

        Parameters
        ----------
        sizes : sequence of int
            Input size, the gated blocks' widths, output size.
        batch_norm : bool, default=False
            BatchNorm1d after every gated layer.

        Returns
        -------
        GatedNet
            The net.
        """
        sizes = list(sizes)
        return cls(sizes[0], sizes[1:-1], sizes[-1], kind="linear", batch_norm=batch_norm)

    def forward(self, x, masks=None):
        """Compute the logits f(x; M, w) of the (masked) net.

        Parameters
        ----------
        x : torch.Tensor
            Inputs, (batch, in_dim) or (batch, in_dim, H, W).
        masks : list of torch.Tensor, default=None
            One mask per gated block (one value per group); None: unmasked.

        Returns
        -------
        torch.Tensor
            Logits, (batch, n_out).
        """
        kind = self.config["kind"]
        h = x
        for i, (layer, norm) in enumerate(zip(self.layers, self.norms)):
            h = norm(layer(h))
            if masks is not None:
                m = masks[i].to(h.dtype)
                h = h * (m.view(1, -1, 1, 1) if kind == "conv" else m.view(1, -1))
            h = F.relu(h)
        if kind == "conv":
            h = h.mean(dim=(2, 3))
        return self.head(h)

    # -- zero-invariant groups ------------------------------------------------------------

    def zig_tensors(self, block):
        """Return the tensors whose slice g (dim 0) makes up group g of ``block``.

        Parameters
        ----------
        block : int
            The gated block.

        Returns
        -------
        list of torch.Tensor
            The layer's weight and bias, and its BatchNorm's weight and bias when present.
        """
        modules = [self.layers[block]]
        if isinstance(self.norms[block], nn.modules.batchnorm._BatchNorm):
            modules.append(self.norms[block])
        return [p for m in modules for name in ("weight", "bias")
                if (p := getattr(m, name, None)) is not None]

    # -- FLOPs ----------------------------------------------------------------------------

    def _coef(self):
        if self.config["kind"] == "linear":
            return 1
        h, w = self.config["hw"]
        return self.config["kernel_size"] ** 2 * h * w

    def flops(self, masks=None):
        """Return P(w), the multiply-accumulates per example of the gated layers.

            P = sum_i c_i k_{i-1} k_i + k_last n_out,

        over every block and the classifier, k_i = sum(w_i) the kept units of block i
        (k_{-1} = inputs), c_i = 1 (Linear) or K^2 H W (conv).

        Parameters
        ----------
        masks : list of torch.Tensor, default=None
            One mask per gated block (one value per group); None: unmasked.
            0/1 or relaxed masks.

        Returns
        -------
        float or torch.Tensor
            Without masks: the count of this net's own shapes (a float); with masks: a
            differentiable torch scalar.
        """
        coef = self._coef()
        if masks is None:
            ks = [float(w) for w in self.widths]
        else:
            ks = [m.sum() for m in masks]
        total, prev = 0.0, float(self.config["in_dim"])
        for k in ks:
            total = total + coef * prev * k
            prev = k
        total = total + prev * self.config["n_out"]
        return float(total) if masks is None else total

    # -- physical removal -----------------------------------------------------------------

    @torch.no_grad()
    def compact(self, masks):
        """Return a new, smaller GatedNet without the groups with w_g = 0.

        Their input columns in the next layer go too; the outputs equal ``self(x, masks)``.

        Parameters
        ----------
        masks : list of torch.Tensor
            0/1 masks, one per block, each keeping at least one group.

        Returns
        -------
        GatedNet
            The compact net (same training mode).
        """
        keeps = [torch.nonzero(torch.as_tensor(m) > 0.5).flatten() for m in masks]
        if any(k.numel() == 0 for k in keeps):
            raise ValueError("a block has no kept group; a compact model needs >= 1 per block")
        small = self.like([k.numel() for k in keeps]).to(self.head.weight.dtype)
        prev = None
        for i, keep in enumerate(keeps):
            src, dst = self.layers[i], small.layers[i]
            weight = src.weight.index_select(0, keep)
            if prev is not None:
                weight = weight.index_select(1, prev)
            dst.weight.copy_(weight)
            if src.bias is not None:
                dst.bias.copy_(src.bias.index_select(0, keep))
            if isinstance(self.norms[i], nn.modules.batchnorm._BatchNorm):
                sn, dn = self.norms[i], small.norms[i]
                for name in ("weight", "bias", "running_mean", "running_var"):
                    getattr(dn, name).copy_(getattr(sn, name).index_select(0, keep))
                dn.num_batches_tracked.copy_(sn.num_batches_tracked)
            prev = keep
        small.head.weight.copy_(self.head.weight.index_select(1, prev))
        small.head.bias.copy_(self.head.bias)
        small.train(self.training)
        return small


class TinyResNet(_GatedBlocks, nn.Module):
    """A tiny ResNet whose gated groups are the channels inside each residual block.

    In residual nets only block-internal channels are gated (docs/deep_methods.md, "ATO");
    the channels on the skip path are kept. Stem Conv(in_channels -> channels, 3x3) + BN +
    ReLU; block i: Conv(channels -> widths[i]) + BN + ReLU [gated: ZIG = conv1 output
    channel with BN1 gamma, beta] -> Conv(widths[i] -> channels) + BN, plus the identity,
    ReLU; global average pooling; Linear(channels -> n_out). Same interface as
    :class:`GatedNet` (``forward(x, masks)``, ``zig_spec``, ``flops``, ``compact``,
    ``like``), so :func:`train_ato` takes it as is.

    Parameters
    ----------
    in_channels : int
        Input channels.
    widths : sequence of int
        Internal channels of every residual block, each >= 1.
    n_out : int
        Classifier outputs.
    channels : int, default=16
        Channels of the skip path.
    hw : tuple of int, default=(8, 8)
        (H, W) of the maps (for the FLOPs count).

    Attributes
    ----------
    widths : list of int
        The block widths.
    config : dict
        The constructor's other arguments (for :meth:`like`).
    """

    def __init__(self, in_channels, widths, n_out, *, channels=16, hw=(8, 8)):
        super().__init__()
        if any(int(w) < 1 for w in widths):
            raise ValueError(f"every block needs at least one unit, got widths {list(widths)}")
        self.config = dict(in_channels=int(in_channels), n_out=int(n_out),
                           channels=int(channels), hw=tuple(hw))
        self.widths = [int(w) for w in widths]
        c = int(channels)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, c, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(c))
        self.conv1 = nn.ModuleList(nn.Conv2d(c, w, 3, padding=1, bias=False) for w in self.widths)
        self.bn1 = nn.ModuleList(nn.BatchNorm2d(w) for w in self.widths)
        self.conv2 = nn.ModuleList(nn.Conv2d(w, c, 3, padding=1, bias=False) for w in self.widths)
        self.bn2 = nn.ModuleList(nn.BatchNorm2d(c) for _ in self.widths)
        self.head = nn.Linear(c, int(n_out))

    def forward(self, x, masks=None):
        """Compute the logits of the (masked) net.

        Parameters
        ----------
        x : torch.Tensor
            Inputs, (batch, in_channels, H, W).
        masks : list of torch.Tensor, default=None
            One mask per gated block (one value per group); None: unmasked.

        Returns
        -------
        torch.Tensor
            Logits, (batch, n_out).
        """
        h = F.relu(self.stem(x))
        for i in range(len(self.widths)):
            u = self.bn1[i](self.conv1[i](h))
            if masks is not None:
                u = u * masks[i].to(u.dtype).view(1, -1, 1, 1)
            h = F.relu(h + self.bn2[i](self.conv2[i](F.relu(u))))
        return self.head(h.mean(dim=(2, 3)))

    def zig_tensors(self, block):
        """Return the tensors whose slice g (dim 0) makes up group g of ``block``.

        Parameters
        ----------
        block : int
            The residual block.

        Returns
        -------
        list of torch.Tensor
            conv1's weight and BN1's weight and bias.
        """
        return [self.conv1[block].weight, self.bn1[block].weight, self.bn1[block].bias]

    def flops(self, masks=None):
        """Return the multiply-accumulates per example.

            stem 9 in C HW + sum_i 2 * 9 C k_i HW + C n_out,

        k_i the kept internal channels of block i.

        Parameters
        ----------
        masks : list of torch.Tensor, default=None
            One mask per gated block (one value per group); None: unmasked.

        Returns
        -------
        float or torch.Tensor
            A float without masks, a differentiable torch scalar with.
        """
        c, (h, w) = self.config["channels"], self.config["hw"]
        ks = [float(k) for k in self.widths] if masks is None else [m.sum() for m in masks]
        total = 9.0 * self.config["in_channels"] * c * h * w + c * self.config["n_out"]
        for k in ks:
            total = total + 2 * 9 * c * h * w * k
        return float(total) if masks is None else total

    @torch.no_grad()
    def compact(self, masks):
        """Return a new, smaller TinyResNet without the internal channels with w_g = 0.

        Parameters
        ----------
        masks : list of torch.Tensor
            0/1 masks, one per block, each keeping at least one channel.

        Returns
        -------
        TinyResNet
            The compact net; its outputs equal ``self(x, masks)``.
        """
        keeps = [torch.nonzero(torch.as_tensor(m) > 0.5).flatten() for m in masks]
        if any(k.numel() == 0 for k in keeps):
            raise ValueError("a block has no kept group; a compact model needs >= 1 per block")
        small = self.like([k.numel() for k in keeps]).to(self.head.weight.dtype)
        small.stem.load_state_dict(self.stem.state_dict())
        small.bn2.load_state_dict(self.bn2.state_dict())
        small.head.load_state_dict(self.head.state_dict())
        for i, keep in enumerate(keeps):
            small.conv1[i].weight.copy_(self.conv1[i].weight.index_select(0, keep))
            for name in ("weight", "bias", "running_mean", "running_var"):
                getattr(small.bn1[i], name).copy_(getattr(self.bn1[i], name).index_select(0, keep))
            small.bn1[i].num_batches_tracked.copy_(self.bn1[i].num_batches_tracked)
            small.conv2[i].weight.copy_(self.conv2[i].weight.index_select(1, keep))
        small.train(self.training)
        return small


# ------------------------------------------------------------------------- the controller

GUMBEL_LOG_LOG_2 = math.log(math.log(2.0))      # -(median of Gumbel(0, 1)), about -0.3665

class ATOController(nn.Module):
    """The ATO controller: a GRU over fixed block tokens, one mask logit per group.

    Thesis ch. 4; docs/deep_methods.md, "ATO". Fixed orthogonal tokens (one
    ``token_dim``-d token per block, not trained) -> bidirectional GRU(token_dim -> hidden
    each way) -> LayerNorm(2 hidden) + ReLU -> one bias-free Linear(2 hidden -> |block|)
    per block -> logits o_b. Mask w = round(sigmoid((o + s + shift) / tau)), s ~
    Gumbel(0, 1) (s = 0 with ``noise=False``), straight-through gradient.

    Parameters
    ----------
    block_sizes : sequence of int
        Groups per gated block.
    token_dim : int, default=64
        Token size.
    hidden : int, default=128
        GRU hidden size per direction.
    shift : float, default=3.0
        Added to the logits, so that w is all ones at init.
    tau : float, default=0.4
        Temperature of the sigmoid.
    """

    def __init__(self, block_sizes, token_dim=64, hidden=128, shift=3.0, tau=0.4):
        super().__init__()
        self.block_sizes = [int(b) for b in block_sizes]
        self.shift, self.tau = float(shift), float(tau)
        tokens = torch.empty(len(self.block_sizes), token_dim)
        nn.init.orthogonal_(tokens)
        self.register_buffer("tokens", tokens)
        self.gru = nn.GRU(token_dim, hidden, batch_first=True, bidirectional=True)
        self.norm = nn.LayerNorm(2 * hidden)
        self.heads = nn.ModuleList(nn.Linear(2 * hidden, b, bias=False)
                                   for b in self.block_sizes)

    def logits(self):
        """Return the logits o.

        Returns
        -------
        list of torch.Tensor
            One (|block|,) tensor per block.
        """
        out, _ = self.gru(self.tokens.unsqueeze(0))
        z = F.relu(self.norm(out[0]))
        return [head(z[b]) for b, head in enumerate(self.heads)]

    def forward(self, noise=True, generator=None):
        """Return straight-through masks: value round(sigmoid(.)), gradient of sigmoid(.).

        Parameters
        ----------
        noise : bool, default=True
            Add Gumbel(0, 1) noise s to the logits.
        generator : torch.Generator, default=None
            The noise's generator.

        Returns
        -------
        list of torch.Tensor
            One (|block|,) mask per block.
        """
        masks = []
        for o in self.logits():
            z = o + self.shift
            if noise:
                u = torch.rand(o.shape, generator=generator, dtype=o.dtype).clamp_(1e-10, 1 - 1e-10)
                z = z - torch.log(-torch.log(u))
            soft = torch.sigmoid(z / self.tau)
            masks.append(soft + (torch.round(soft) - soft).detach())
        return masks

    @torch.no_grad()
    def mask(self):
        """Return the most probable value of the sampled mask.

        w_g = [P(w_g = 1) > 1/2] = [o + shift - ln ln 2 > 0] (the Gumbel median is
        -ln ln 2): the mask that the prox uses and that is frozen at T_end.

        Returns
        -------
        list of torch.Tensor
            One 0/1 (|block|,) mask per block.
        """
        return [(o + self.shift - GUMBEL_LOG_LOG_2 > 0).float() for o in self.logits()]


def flops_regularizer(flops, total, p, gamma=4.0):
    """Return the FLOPs regulariser gamma * log(max(P(w), p P_total) / (p P_total)).

    It is zero once the mask keeps at most the fraction p of the FLOPs (thesis ch. 4).

    Parameters
    ----------
    flops : torch.Tensor
        P(w), a differentiable scalar (:meth:`GatedNet.flops` with masks).
    total : float
        P_total, the unpruned net's count.
    p : float
        The kept fraction of the budget, in (0, 1].
    gamma : float, default=4.0
        The regulariser's weight.

    Returns
    -------
    torch.Tensor
        The scalar regulariser.
    """
    budget = p * total
    return gamma * torch.log(torch.clamp(flops, min=budget) / budget)


def ato_schedule(epochs, t_start=0.1, t_w=0.2, t_end=0.5):
    """Return the (e_start, e_w, e_end) epoch indices of the ATO schedule.

    The controller trains in epochs e_start <= e < e_end, the prox runs in epochs e >= e_w,
    the mask is frozen from e_end on (clamped to epochs - 1 so that the frozen mask gets at
    least one epoch of prox).

    Parameters
    ----------
    epochs : int
        Total epochs.
    t_start : float, default=0.1
        T_start as a fraction of the epochs.
    t_w : float, default=0.2
        T_w as a fraction of the epochs.
    t_end : float, default=0.5
        T_end as a fraction of the epochs.

    Returns
    -------
    tuple of int
        (e_start, e_w, e_end).
    """
    e_start, e_w, e_end = (int(round(f * epochs)) for f in (t_start, t_w, t_end))
    e_end = max(min(e_end, epochs - 1), e_start)
    return e_start, min(e_w, e_end), e_end


# -------------------------------------------------------------------------------- helpers

def digits_train_test(test_size=0.2, seed=0):
    """scikit-learn's digits (1797 x 64, shipped with the package) for the ATO experiment:
    a stratified train / test split (``train_test_split``, ``random_state=seed``), both
    standardised with the training mean and standard deviation. Returns float32
    ``(X_train, y_train, X_test, y_test)``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_size, stratify=y,
                                          random_state=seed)
    mean, std = Xtr.mean(0), Xtr.std(0) + 1e-8
    return (((Xtr - mean) / std).astype(np.float32), ytr,
            ((Xte - mean) / std).astype(np.float32), yte)


def _tensor(X, dtype=torch.float32):
    return X if isinstance(X, torch.Tensor) else torch.as_tensor(np.asarray(X), dtype=dtype)


def _labels(y):
    return y.long() if isinstance(y, torch.Tensor) else torch.as_tensor(np.asarray(y)).long()


@torch.no_grad()
def accuracy(model, X, y, masks=None):
    """Fraction of correct predictions of ``model(X, masks)`` (eval mode)."""
    was = model.training
    model.eval()
    out = model(_tensor(X), masks) if masks is not None else model(_tensor(X))
    model.train(was)
    return float((out.argmax(1) == _labels(y)).float().mean())


def _batches(n, batch_size, generator):
    order = torch.randperm(n, generator=generator)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def _make_optimizer(model, lr, momentum, weight_decay):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                           weight_decay=weight_decay)


def _cosine(opt, epochs, schedule):
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1))
    if schedule in (None, "constant"):
        return None
    raise ValueError(f"lr_schedule must be 'cosine' or 'constant', got {schedule!r}")


def masks_from_counts(scores, counts):
    """0/1 masks keeping, in block b, the counts[b] groups of largest score."""
    masks = []
    for s, k in zip(scores, counts):
        m = torch.zeros(len(s))
        m[torch.argsort(torch.as_tensor(s, dtype=torch.float64), descending=True)[:int(k)]] = 1
        masks.append(m)
    return masks


def magnitude_masks(model, counts):
    """Return magnitude-pruning masks: the counts[b] largest ZIGs of every block b.

    The score of a ZIG is its norm ||M_g||_2.

    Parameters
    ----------
    model : GatedNet or TinyResNet
        The trained net.
    counts : sequence of int
        Groups to keep per block.

    Returns
    -------
    list of torch.Tensor
        0/1 masks, one per block.
    """
    return masks_from_counts(model.group_norms(), counts)


def random_masks(block_sizes, counts, seed=0):
    """Return random-pruning masks: counts[b] random groups of block b kept.

    Parameters
    ----------
    block_sizes : sequence of int
        Groups per block.
    counts : sequence of int
        Groups to keep per block.
    seed : int, default=0
        Seed of the draw.

    Returns
    -------
    list of torch.Tensor
        0/1 masks, one per block.
    """
    g = torch.Generator().manual_seed(seed)
    return masks_from_counts([torch.rand(b, generator=g) for b in block_sizes], counts)


def uniform_widths(model, target_flops):
    """Return the widths round(r * widths) whose FLOPs are closest to ``target_flops``.

    Every width is at least 1; one factor r serves every block (bisection on r, then
    the best of the two neighbours).

    Parameters
    ----------
    model : GatedNet or TinyResNet
        The net whose widths are scaled.
    target_flops : float
        The FLOPs to match.

    Returns
    -------
    list of int
        One width per block.
    """
    def widths(r):
        return [max(1, int(round(r * w))) for w in model.widths]

    def cost(r):
        return model.like(widths(r)).flops()
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cost(mid) < target_flops else (lo, mid)
    best = min((lo, hi), key=lambda r: abs(cost(r) - target_flops))
    return widths(best)


def uniform_masks(model, target_flops):
    """Uniform pruning (uniform magnitude filter pruning, Li et al., "Pruning Filters for
    Efficient ConvNets", ICLR 2017): prune a trained net, every gated block by the same
    kept fraction r, keeping in each block the groups of largest norm; no fine-tuning.

        k_b = max(1, round(r |block b|)),   r: P(k) closest to ``target_flops``
                                            (:func:`uniform_widths`),
        w_{b,g} = [g among the k_b groups of block b with largest ||M_g||_2]
                                            (:func:`magnitude_masks`).

    Li et al. rank conv filters by their L1 norm; here, as for the magnitude baseline, the
    score is the L2 norm of the whole zero-invariant group (Linear row + bias, or conv
    channel + BN gamma, beta). Returns 0/1 masks, one per block, for ``model(x, masks)``
    or ``model.compact(masks)`` (whose widths are those of :func:`uniform_widths`, so its
    FLOPs equal those of the narrow net ``model.like(uniform_widths(model, target_flops))``).
    The parameters are not touched.
    """
    return magnitude_masks(model, uniform_widths(model, target_flops))


def _project_to_budget(model, masks, logits, lo, hi):
    """Greedy move of a 0/1 mask into lo <= P(w)/P_total <= hi along the logits (switch
    off the kept group of smallest logit, or on the pruned group of largest logit),
    keeping >= 1 group per block. Returns (masks, n_moved)."""
    masks = [m.clone() for m in masks]
    total, moved = model.flops(), 0
    for b, m in enumerate(masks):                       # a valid compact model
        if m.sum() == 0:
            m[int(torch.argmax(logits[b]))] = 1
            moved += 1
    while float(model.flops(masks)) / total > hi:
        cand = [(float(o[m > 0].min()), b) for b, (o, m) in enumerate(zip(logits, masks))
                if m.sum() > 1]
        if not cand:
            break
        _, b = min(cand)
        o = logits[b].masked_fill(masks[b] == 0, float("inf"))
        masks[b][int(torch.argmin(o))] = 0
        moved += 1
    while float(model.flops(masks)) / total < lo:
        cand = [(float(o[m == 0].max()), b) for b, (o, m) in enumerate(zip(logits, masks))
                if m.sum() < len(m)]
        if not cand:
            break
        _, b = max(cand)
        o = logits[b].masked_fill(masks[b] > 0, float("-inf"))
        masks[b][int(torch.argmax(o))] = 1
        moved += 1
        if float(model.flops(masks)) / total > hi:     # overshoot: undo, stop below
            masks[b][int(torch.argmax(o))] = 0
            moved -= 1
            break
    return masks, moved


# ------------------------------------------------------------------------------- training

class _KeepZero:
    """HSPG keeps a group that is exactly zero at zero (OTO's redundant groups stay out of
    the update); ``ProxOptimizer``'s half-space operator leaves such a group as the inner
    step made it. This wrapper re-zeroes, after each step, the prox groups that were zero
    before it, so switched-off groups end exactly zero under ``operator="half_space"``."""

    def __init__(self, opt):
        self.opt = opt

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        specs = [g["spec"] for g in self.opt.prox_groups]
        with torch.no_grad():
            was_zero = [spec.sq_norms() == 0 for spec in specs]
        self.opt.step()
        with torch.no_grad():
            for spec, zero in zip(specs, was_zero):
                if zero.any():
                    spec.scale_((~zero).to(spec.dtype))


@dataclass
class ATOResult:
    """What :func:`train_ato` returns.

    Parameters
    ----------
    model : GatedNet
        The trained target net (switched-off groups exactly zero).
    masks : list of torch.Tensor
        The frozen 0/1 masks.
    compact : GatedNet
        The physically pruned net.
    flops_kept : float
        P(w) / P_total.
    controller : ATOController, default=None
        The trained controller (None for the static-mask baseline).
    history : list of dict, default=[]
        One record per epoch.
    seconds : float, default=0.0
        Wall time of the run.
    """
    model: GatedNet
    masks: list
    compact: GatedNet
    flops_kept: float
    controller: ATOController = None
    history: list = field(default_factory=list)
    seconds: float = 0.0


def _train_epoch(model, opt, X, y, batch_size, gen):
    model.train()
    total, n = 0.0, 0
    for idx in _batches(len(X), batch_size, gen):
        opt.zero_grad()
        loss = F.cross_entropy(model(X[idx]), y[idx])
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(idx)
        n += len(idx)
    return total / max(n, 1)


def train_dense(model, X, y, *, epochs=60, lr=0.05, momentum=0.9, weight_decay=5e-4,
                batch_size=64, lr_schedule="cosine", seed=0, verbose=False):
    """Train a net plainly, with the optimizer ATO uses (the dense and uniform baselines).

    SGD with momentum and weight decay on cross-entropy, minibatches from a seeded
    generator.

    Parameters
    ----------
    model : torch.nn.Module
        The net, trained in place.
    X : array-like or torch.Tensor
        Inputs.
    y : array-like or torch.Tensor
        Labels.
    epochs : int, default=60
        Passes over the data.
    lr : float, default=0.05
        Learning rate.
    momentum : float, default=0.9
        SGD momentum.
    weight_decay : float, default=5e-4
        SGD weight decay.
    batch_size : int, default=64
        Minibatch size.
    lr_schedule : {"cosine", "constant"}, default="cosine"
        Learning-rate schedule over the epochs.
    seed : int, default=0
        Seed of the batch order.
    verbose : bool, default=False
        One line per epoch.

    Returns
    -------
    torch.nn.Module
        ``model``.
    """
    X, y = _tensor(X), _labels(y)
    gen = torch.Generator().manual_seed(seed)
    opt = _make_optimizer(model, lr, momentum, weight_decay)
    sched = _cosine(opt, epochs, lr_schedule)
    for epoch in range(epochs):
        loss = _train_epoch(model, opt, X, y, batch_size, gen)
        if sched is not None:
            sched.step()
        if verbose:
            print(f"dense | epoch {epoch + 1}/{epochs} | loss {loss:.4f}", flush=True)
    return model


def train_ato(model, X, y, *, epochs=60, p=0.5, lam=10.0, gamma=4.0, t_start=0.1, t_w=0.2,
              t_end=0.5, lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=64,
              lr_schedule="cosine", operator="soft_threshold", eps=0.0, controller=None,
              controller_lr=1e-3, controller_fraction=0.05, controller_batch_size=8,
              controller_passes=4, budget_margin=0.03, static_counts=None, X_val=None,
              y_val=None, seed=0, verbose=False, callback=None):
    """Train a net once with ATO's controller-guided group prox, then prune it.

    Auto-Train-Once (thesis ch. 4; docs/deep_methods.md, "ATO") on a :class:`GatedNet` or
    :class:`TinyResNet`. Every epoch e:

    1. if e_start <= e < e_end (:func:`ato_schedule`): train the controller, target net in
       eval mode and not updated, with Adam(lr ``controller_lr``) for ``controller_passes``
       passes over a fixed random ``controller_fraction`` of the training data on
       CE(f(x; M, w)) + gamma log(max(P(w), p P_total) / (p P_total)), w the
       straight-through Gumbel-sigmoid mask;
    2. the mask w: the controller's noise-free mask; from e_end on the mask frozen at e_end
       (moved into [p - budget_margin, p] if needed, see the module docstring);
    3. one pass of SGD on CE(f(x; M)) (unmasked); from e >= e_w each step is followed by the
       group prox with lam_g = lam (1 - w_g) through :class:`ProxOptimizer`
       (``operator="soft_threshold"``: M_g <- M_g max(0, 1 - lr lam_g / ||M_g||);
       ``"half_space"``: the HSPG step and projection with ``eps`` on the groups with
       w_g = 0).

    Parameters
    ----------
    model : GatedNet or TinyResNet
        The target net, trained in place.
    X : array-like or torch.Tensor
        Training inputs.
    y : array-like or torch.Tensor
        Training labels.
    epochs : int, default=60
        Epochs E.
    p : float, default=0.5
        The FLOPs budget, a fraction of P_total.
    lam : float, default=10.0
        Group-prox strength.
    gamma : float, default=4.0
        Weight of the FLOPs regulariser.
    t_start : float, default=0.1
        T_start / E.
    t_w : float, default=0.2
        T_w / E.
    t_end : float, default=0.5
        T_end / E.
    lr : float, default=0.05
        SGD learning rate (the prox's eta).
    momentum : float, default=0.9
        SGD momentum.
    weight_decay : float, default=5e-4
        SGD weight decay.
    batch_size : int, default=64
        Minibatch size.
    lr_schedule : {"cosine", "constant"}, default="cosine"
        Learning-rate schedule.
    operator : {"soft_threshold", "half_space"}, default="soft_threshold"
        The block operator.
    eps : float, default=0.0
        Margin of the half-space projection.
    controller : ATOController, default=None
        A controller to train; None: a fresh one.
    controller_lr : float, default=1e-3
        Adam learning rate of the controller.
    controller_fraction : float, default=0.05
        Fraction of the training data the controller trains on.
    controller_batch_size : int, default=8
        Controller minibatch size.
    controller_passes : int, default=4
        Passes over the controller's data per controller epoch.
    budget_margin : float or None, default=0.03
        Width of the band [p - margin, p] the frozen mask is moved into; None: not moved.
    static_counts : sequence of int, default=None
        One count per block: replaces the controller by a static mask, the counts[b] groups
        of largest norm kept and frozen at e_w (the OTO-like static-mask group Lasso
        baseline).
    X_val : array-like, default=None
        Validation inputs; with ``y_val``, each epoch records ``val_acc``.
    y_val : array-like, default=None
        Validation labels.
    seed : int, default=0
        Seed of the batch orders, the controller's data and its initialisation.
    verbose : bool, default=False
        One line per epoch.
    callback : callable, default=None
        ``callback(epoch, info)`` at the end of every epoch (``info``: the history row plus
        ``model``, ``controller``, ``masks``).

    Returns
    -------
    ATOResult
        The trained net, the frozen masks, the compact net, the kept FLOPs ratio, the
        controller and the per-epoch history.
    """
    t0 = time.perf_counter()
    X, y = _tensor(X), _labels(y)
    gen = torch.Generator().manual_seed(seed)
    e_start, e_w, e_end = ato_schedule(epochs, t_start, t_w, t_end)
    static = static_counts is not None
    if static:
        controller = None
    elif controller is None:
        torch.manual_seed(seed)
        controller = ATOController(model.block_sizes)
    base = _make_optimizer(model, lr, momentum, weight_decay)
    sched = _cosine(base, epochs, lr_schedule)
    ctrl_opt = None if static else torch.optim.Adam(controller.parameters(), lr=controller_lr)
    n_ctrl = max(1, int(round(controller_fraction * len(X))))
    ctrl_idx = torch.randperm(len(X), generator=gen)[:n_ctrl]
    Xc, yc = X[ctrl_idx], y[ctrl_idx]
    total = model.flops()
    frozen, history = None, []
    masks = model.full_masks()
    for epoch in range(epochs):
        row = {"epoch": epoch + 1, "controller_steps": 0, "prox_steps": 0, "moved": 0}
        # 1. controller
        if not static and e_start <= epoch < e_end:
            model.eval()
            for p_ in model.parameters():
                p_.requires_grad_(False)
            closs, cflops = [], []
            for _ in range(controller_passes):
                for idx in _batches(n_ctrl, controller_batch_size, gen):
                    w = controller(noise=True, generator=gen)
                    reg = flops_regularizer(model.flops(w), total, p, gamma)
                    loss = F.cross_entropy(model(Xc[idx], w), yc[idx]) + reg
                    ctrl_opt.zero_grad()
                    loss.backward()
                    ctrl_opt.step()
                    closs.append(float(loss.detach()))
                    cflops.append(float(model.flops(w).detach()) / total)
                    row["controller_steps"] += 1
            for p_ in model.parameters():
                p_.requires_grad_(True)
            row["controller_loss"] = float(np.mean(closs))
            row["sampled_flops_kept"] = float(np.mean(cflops))
        # 2. the mask
        if frozen is None and epoch >= (e_w if static else e_end):
            if static:
                frozen = magnitude_masks(model, static_counts)
            else:
                frozen = controller.mask()
                row["controller_flops_kept"] = float(model.flops(frozen)) / total
                if budget_margin is not None:
                    logits = [o.detach() for o in controller.logits()]
                    frozen, row["moved"] = _project_to_budget(
                        model, frozen, logits, p - budget_margin, p)
        if frozen is not None:
            masks = frozen
        elif not static:
            masks = controller.mask()
        # 3. target net
        if epoch >= e_w:
            lam_g = [lam * (1.0 - m) for m in masks]
            if operator == "soft_threshold":
                groups = [{"spec": model.zig_spec(b), "lam": lam_g[b]}
                          for b in range(len(masks))]
            else:        # HSPG's projection must not touch the groups with w_g = 1
                groups = [{"spec": model.zig_spec(b, torch.nonzero(m == 0).flatten().tolist()),
                           "lam": lam} for b, m in enumerate(masks) if (m == 0).any()]
            opt = ProxOptimizer(base, groups, operator=operator, eps=eps) if groups else base
            if operator == "half_space" and groups:
                opt = _KeepZero(opt)
        else:
            opt = base
        loss = _train_epoch(model, opt, X, y, batch_size, gen)
        if opt is not base:
            row["prox_steps"] = math.ceil(len(X) / batch_size)
        if sched is not None:
            sched.step()
        kept = [int(m.sum()) for m in masks]
        row.update(loss=loss, kept=kept, flops_kept=float(model.flops(masks)) / total,
                   zero_groups=int(sum(int((n == 0).sum()) for n in model.group_norms())),
                   mask_frozen=frozen is not None)
        if X_val is not None:
            row["val_acc"] = accuracy(model, X_val, y_val)
        history.append(row)
        if verbose:
            print(f"{'static-gl' if static else 'ato'} | epoch {epoch + 1}/{epochs} | loss "
                  f"{loss:.4f} | kept {kept} | flops {row['flops_kept']:.3f} | zero groups "
                  f"{row['zero_groups']} | ctrl steps {row['controller_steps']} | prox "
                  f"{'on' if row['prox_steps'] else 'off'}"
                  + (f" | val acc {row['val_acc']:.4f}" if "val_acc" in row else ""),
                  flush=True)
        if callback is not None:
            callback(epoch, dict(row, model=model, controller=controller, masks=masks))
    masks = frozen if frozen is not None else masks
    model.eval()
    return ATOResult(model=model, masks=[m.clone() for m in masks],
                     compact=model.compact(masks).eval(),
                     flops_kept=float(model.flops(masks)) / total, controller=controller,
                     history=history, seconds=time.perf_counter() - t0)


def train_static_group_lasso(model, X, y, counts, **kwargs):
    """Train the OTO-like baseline: a static-mask group Lasso.

    Train as ATO without a controller; at e_w freeze the mask keeping the ``counts[b]``
    groups of largest norm per block, then prox the others with lam to zero.

    Parameters
    ----------
    model : GatedNet or TinyResNet
        The target net, trained in place.
    X : array-like or torch.Tensor
        Training inputs.
    y : array-like or torch.Tensor
        Training labels.
    counts : sequence of int
        Groups kept per block.
    **kwargs
        The keywords of :func:`train_ato`.

    Returns
    -------
    ATOResult
        As :func:`train_ato`'s, with ``controller=None``.
    """
    return train_ato(model, X, y, static_counts=list(counts), **kwargs)
