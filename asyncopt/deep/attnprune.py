"""Attention-matrix pruning by gradient descent on a mask (paper 004, "Beyond Linear
Approximations: A Novel Pruning Approach for Attention Matrix", Liang et al. 2024;
docs/deep_methods.md, "Attention-matrix pruning").

The fused query-key matrix W = W_Q W_K^T (d x d, queries Q = X W_Q, keys K = X W_K) is
pruned so that the softmax attention matrix stays close to the dense one, not the linear
outputs X W_Q and X W_K as Wanda and SparseGPT do. With X (N x d) the calibration input,
M the real-valued pruning mask and Mc the causal mask (Mc_ij = 1 for j <= i, Definition
3.1):

    f(M) = D(M)^-1 (Mc o exp(s X (M o W) X^T)),   D(M) = diag((Mc o exp(...)) 1)
                                                               (Definitions 1.1, 3.2, B.3)
    L(M) = 0.5 ||f(M) - f(1)||_F^2 + 0.5 lam ||M||_F^2                 (Definition 3.2)
    grad L(M) = s W o (X^T P X) + lam M,   C = f(M) - f(1),
                P = f o C - diag((f o C) 1) f                      (Theorem 5.3 / C.5)

Scaling convention: the paper's attention has no 1/sqrt(d) (Definition 1.1 applies the
softmax to X W X^T; a scaled dot product is absorbed into W). Every function here takes
``scale`` s, default 1.0 (the paper); :func:`fused_head_matrices` folds the module's
1/sqrt(d_h) into W, so the per-head matrices of a torch module are used with s = 1.

Algorithm 1: gradient descent with heavy-ball momentum (0.9, Section 6.1) from M = 1
(:func:`optimize_mask`), then binarisation (Section 4): the fraction rho of entries with the
smallest |M o W| is zeroed (:func:`binarize_mask`; exactly round(rho d^2) zeros). The GD does
not depend on rho, so one run serves every sparsity and the kept sets are nested.

Baselines, all in ``nn.Linear`` convention (weight (out, in), y = x weight^T, so the paper's
W_Q is ``weight.T``):

- :func:`wanda_prune` (Sun et al. 2023): score |W_ij| ||X_:,j||_2, the lowest fraction rho
  of every output row zeroed;
- :func:`sparsegpt_prune` (Frantar & Alistarh 2023, Algorithm 1 and its reference code):
  H = X^T X + damp I (damp = percdamp mean diag), U the upper Cholesky factor of H^-1
  (:func:`sparsegpt_hessian_inverse`: inputs only, so computed once for W_Q, W_K and
  every rho);
  columns in blocks of ``blocksize``, the mask of a block chosen over the whole block by
  the smallest w^2 / U_jj^2, then column by column the OBS update of the later columns
  W[:, j:] -= ((w - q) / U_jj) U[j, j:];
- :func:`magnitude_prune`: the fraction rho of smallest |W_ij| of the fused W zeroed (not
  in the paper).

Wanda and SparseGPT prune W_Q and W_K separately at sparsity rho each (the paper's setting,
its Figure 1); the attention is then evaluated with their product (:func:`fused_from_factors`),
whose entry (i, j) is zero only when no k has both W_Q[i, k] and W_K[j, k] kept, so it is
denser than rho. They store 2 (1 - rho) d^2 numbers against (1 - rho) d^2 for the pruned
fused matrix.

Torch modules (:class:`~asyncopt.deep.transformer.MultiHeadAttention`, bidirectional: use
``causal=False`` unless the model is a decoder): per head h the scores are
(x W_Q,h^T + b_Q,h)(x W_K,h^T + b_K,h)^T / sqrt(d_h) with W_Q,h rows h d_h .. (h+1) d_h of
``q.weight``, i.e.

    x W_h x^T + 1 (x u_h)^T + (terms constant along each row),
    W_h = W_Q,h^T W_K,h / sqrt(d_h),   u_h = W_K,h^T b_Q,h / sqrt(d_h).

The row-constant terms (x W_Q,h^T b_K,h and b_Q,h . b_K,h) cancel in the softmax and are
dropped; u_h (the ``key_bias``) is kept dense, as the baselines keep biases. The q/k
factorisation cannot hold a sparse W_h, so :class:`FusedScoreAttention` runs the module with
scores from the pruned per-head W_h (and v, o unchanged); with the dense W_h it reproduces
the module's output exactly (tested). :func:`prune_attention_module` returns the pruned
W_h and masks of every head for any of the four methods.
"""
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

__all__ = [
    "attention_matrix", "attention_pruning_loss", "attention_pruning_gradient",
    "optimize_mask", "MaskOptimization", "binarize_mask", "prune_fused_gd",
    "relative_attention_error", "fused_from_factors", "wanda_prune", "sparsegpt_prune",
    "sparsegpt_hessian_inverse", "magnitude_prune", "prune_fused", "low_rank_factor",
    "fused_head_matrices", "prune_attention_module", "PrunedAttention", "FusedScoreAttention",
    "METHODS",
]

METHODS = ("ours", "wanda", "sparsegpt", "magnitude")


# ------------------------------------------------------------------------ the attention

def _valid_mask(x, causal, valid):
    """Boolean (..., N, N): key j visible from query i (causal: j <= i; ``valid`` (..., N)
    drops padded keys)."""
    n = x.shape[-2]
    visible = torch.ones(n, n, dtype=torch.bool, device=x.device)
    if causal:
        visible = torch.tril(visible)
    if valid is not None:
        visible = visible & valid.to(torch.bool)[..., None, :]
    return visible


def attention_matrix(x, weight, scale=1.0, causal=True, valid=None, key_bias=None):
    """f = row-softmax over the visible keys of s x W x^T (+ 1 (x u)^T with u the
    ``key_bias``), Definition 3.2. ``x`` (N, d) or (B, N, d); a row with no visible key is
    all zeros. Returns (N, N) or (B, N, N)."""
    scores = scale * (x @ weight @ x.transpose(-1, -2))
    if key_bias is not None:
        scores = scores + (x * key_bias[..., None, :]).sum(-1)[..., None, :]
    visible = _valid_mask(x, causal, valid)
    scores = scores.masked_fill(~visible, -math.inf)
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)


def _attention_difference(mask, x, weight, target=None, **kw):
    """(f(M), C = f(M) - f(1)) with the padded query rows (``valid`` 0) of C zeroed."""
    if target is None:
        target = attention_matrix(x, weight, **kw)
    f = attention_matrix(x, mask * weight, **kw)
    c = f - target
    if kw.get("valid") is not None:
        c = c * kw["valid"].to(x.dtype)[..., :, None]
    return f, c


def attention_pruning_loss(mask, x, weight, lam=0.0, scale=1.0, causal=True, valid=None,
                           key_bias=None, target=None):
    """L(M) = 0.5 ||f(M) - f(1)||_F^2 + 0.5 lam ||M||_F^2 (Definition 3.2), summed over the
    sequences of a batch; padded query rows (``valid`` 0) do not count. ``target``: f(1)
    when already computed."""
    _, c = _attention_difference(mask, x, weight, target, scale=scale, causal=causal,
                                 valid=valid, key_bias=key_bias)
    return 0.5 * (c ** 2).sum() + 0.5 * lam * (mask ** 2).sum()


def attention_pruning_gradient(mask, x, weight, lam=0.0, scale=1.0, causal=True, valid=None,
                               key_bias=None, target=None):
    """(L(M), grad L(M)) in closed form (Theorem 5.3 / C.5):

        grad L(M) = s W o (X^T P X) + lam M,   C = f(M) - f(1),
        P = f o C - diag((f o C) 1) f,

    P the gradient of 0.5 ||f - f(1)||^2 with respect to the scores (rows of a softmax
    Jacobian applied to C); X^T P X summed over the sequences of a batch."""
    f, c = _attention_difference(mask, x, weight, target, scale=scale, causal=causal,
                                 valid=valid, key_bias=key_bias)
    fc = f * c
    p = fc - fc.sum(-1, keepdim=True) * f
    xtpx = (x.transpose(-1, -2) @ p @ x).reshape(-1, *weight.shape).sum(0)
    loss = 0.5 * (c ** 2).sum() + 0.5 * lam * (mask ** 2).sum()
    return loss, scale * weight * xtpx + lam * mask


# ------------------------------------------------------------------------ Algorithm 1

@dataclass
class MaskOptimization:
    """The real-valued mask M after ``steps`` of GD and the loss every ``record_every``
    steps (``losses``: (step, L(M))); ``lam`` and ``lr`` as used (absolute)."""

    mask: torch.Tensor
    lam: float
    lr: float
    steps: int
    losses: list = field(default_factory=list)


def optimize_mask(x, weight, lam=None, lr=None, steps=300, momentum=0.9, scale=1.0,
                  causal=True, valid=None, key_bias=None, lam_rel=0.03, lr_rel=1.0,
                  record_every=10, dtype=torch.float64):
    """Run Algorithm 1: heavy-ball gradient descent on L(M) from M = 1.

        V <- momentum V - lr grad L(M),   M <- M + V,
        L(M) = 0.5 ||f(M) - f(1)||_F^2 + 0.5 lam ||M||_F^2           (Definition 3.2)

    with grad L in closed form (Theorem 5.3). ``lam`` / ``lr`` are absolute, or (when None)
    relative to the problem's own scale, so that one setting serves every N, d and weight
    scale (our choice; the paper tunes lam by a sweep, its Figure 2a, and takes lr inversely
    proportional to the gradient's Lipschitz constant, Theorem 4.1):

        lam = lam_rel ||f(0) - f(1)||_F^2 / d^2,   lr = lr_rel / (lam + h),

    i.e. the penalty of the dense mask, 0.5 lam ||1||^2, is lam_rel times the loss of the
    empty mask (uniform attention), and h is the largest eigenvalue of the loss part's
    Hessian at M = 1 (power iteration on finite differences of the closed-form gradient).
    The defaults lam_rel = 0.03 and 300 steps balance the sparsities: larger lam or more
    steps fit the calibration inputs better at high sparsity and worse at low sparsity and
    on held-out inputs (benchmarks/notes/bench_attnprune.md).

    Parameters
    ----------
    x : torch.Tensor
        Calibration inputs X, (N, d) or (B, N, d).
    weight : torch.Tensor
        The fused matrix W = W_Q W_K^T, (d, d).
    lam : float, default=None
        Absolute lam; None: from ``lam_rel``.
    lr : float, default=None
        Absolute learning rate; None: from ``lr_rel``.
    steps : int, default=300
        GD steps.
    momentum : float, default=0.9
        Heavy-ball momentum (Section 6.1).
    scale : float, default=1.0
        s, the scores' scale (the paper's attention has none).
    causal : bool, default=True
        Apply the causal mask Mc (key j visible from query i for j <= i).
    valid : torch.Tensor, default=None
        (..., N) bool, False for padded positions (never attended to, their query rows not
        counted).
    key_bias : torch.Tensor, default=None
        u, (d,): adds 1 (x u)^T to the scores (a query bias folded into the fused matrix).
    lam_rel : float, default=0.03
        lam relative to the empty mask's loss.
    lr_rel : float, default=1.0
        lr relative to 1 / (lam + h).
    record_every : int, default=10
        Record L(M) every this many steps (0: only at the end).
    dtype : torch.dtype, default=torch.float64
        The computation's dtype.

    Returns
    -------
    MaskOptimization
        The real-valued mask (in ``weight``'s dtype), lam and lr as used, the steps and the
        recorded losses.
    """
    out_dtype = weight.dtype
    x, weight = x.to(dtype), weight.to(dtype)
    key_bias = None if key_bias is None else key_bias.to(dtype)
    kw = dict(scale=scale, causal=causal, valid=valid, key_bias=key_bias)
    target = attention_matrix(x, weight, **kw)
    if lam is None:
        _, empty = _attention_difference(torch.zeros_like(weight), x, weight, target, **kw)
        lam = lam_rel * float((empty ** 2).sum()) / weight.numel()
    if lr is None:
        lr = lr_rel / (lam + _hessian_norm(x, weight, target, **kw))
    mask = torch.ones_like(weight)
    velocity = torch.zeros_like(weight)
    losses = []
    for step in range(steps):
        loss, grad = attention_pruning_gradient(mask, x, weight, lam, target=target, **kw)
        if record_every and step % record_every == 0:
            losses.append((step, float(loss)))
        velocity = momentum * velocity - lr * grad
        mask = mask + velocity
    loss = attention_pruning_loss(mask, x, weight, lam, target=target, **kw)
    losses.append((steps, float(loss)))
    return MaskOptimization(mask.to(out_dtype), float(lam), float(lr), steps, losses)


def _hessian_norm(x, weight, target, iterations=20, **kw):
    """Largest |eigenvalue| of the Hessian of 0.5 ||f(M) - f(1)||^2 at M = 1, by power
    iteration on central differences of the closed-form gradient."""
    ones = torch.ones_like(weight)
    v = torch.randn(weight.shape, generator=torch.Generator().manual_seed(0),
                    dtype=weight.dtype)
    v, value = v / torch.linalg.vector_norm(v), 0.0
    for _ in range(iterations):
        eps = 1e-4
        hv = (attention_pruning_gradient(ones + eps * v, x, weight, target=target, **kw)[1]
              - attention_pruning_gradient(ones - eps * v, x, weight, target=target,
                                           **kw)[1]) / (2 * eps)
        value = float(torch.linalg.vector_norm(hv))
        if value == 0.0:
            break
        v = hv / value
    return value


def binarize_mask(mask, weight, rho):
    """Binary mask zeroing exactly round(rho numel) entries, those of smallest |M o W|
    (ties by position; Section 4). Same shape and dtype as ``weight``."""
    score = (mask * weight).abs().reshape(-1)
    n_zero = int(round(rho * score.numel()))
    out = torch.ones_like(score, dtype=weight.dtype)
    if n_zero:
        order = torch.argsort(score, stable=True)
        out[order[:n_zero]] = 0
    return out.reshape(weight.shape)


def prune_fused_gd(x, weight, rhos, **gd_kwargs):
    """{rho: (pruned W, binary mask)} from one :func:`optimize_mask` run, and that run."""
    result = optimize_mask(x, weight, **gd_kwargs)
    pruned = {}
    for rho in np.atleast_1d(rhos).tolist():
        binary = binarize_mask(result.mask, weight, rho)
        pruned[rho] = (weight * binary, binary)
    return pruned, result


def relative_attention_error(x, weight, pruned, scale=1.0, causal=True, valid=None,
                             key_bias=None):
    """||f(pruned) - f(dense)||_F / ||f(dense)||_F (Section 6.1), over all sequences."""
    kw = dict(scale=scale, causal=causal, valid=valid, key_bias=key_bias)
    dense = attention_matrix(x, weight, **kw)
    return float(torch.linalg.vector_norm(attention_matrix(x, pruned, **kw) - dense)
                 / torch.linalg.vector_norm(dense))


# ------------------------------------------------------------------------ baselines

def fused_from_factors(w_q, w_k):
    """W = W_Q W_K^T in the paper's convention (Q = X W_Q, K = X W_K, both d x d_k)."""
    return w_q @ w_k.transpose(-1, -2)


def _flat_inputs(x):
    """Calibration inputs as one (n, in) matrix (the sequences of a batch stacked)."""
    return x.reshape(-1, x.shape[-1])


def wanda_prune(weight, x, rho):
    """Prune a linear layer by Wanda: per output row, zero the lowest |W_ij| ||X_:,j||_2.

    Sun et al. 2023: the round(rho in) entries of each output row i of ``weight`` (out, in)
    with the smallest score, X (n, in) the layer's inputs.

    Parameters
    ----------
    weight : torch.Tensor
        (out, in), ``nn.Linear`` convention.
    x : torch.Tensor
        The layer's inputs, (..., in).
    rho : float
        The sparsity of every row.

    Returns
    -------
    pruned : torch.Tensor
        W o mask.
    mask : torch.Tensor
        The binary mask.
    """
    x = _flat_inputs(x).to(weight.dtype)
    score = weight.abs() * torch.linalg.vector_norm(x, dim=0)[None, :]
    n_zero = int(round(rho * weight.shape[1]))
    mask = torch.ones_like(weight)
    if n_zero:
        order = torch.argsort(score, dim=1, stable=True)[:, :n_zero]
        mask.scatter_(1, order, 0.0)
    return weight * mask, mask


def sparsegpt_hessian_inverse(x, percdamp=0.01):
    """SparseGPT's (U, dead) for inputs X (n, in), float64: U the upper Cholesky factor of
    H^-1 (U^T U = H^-1), H = X^T X + percdamp mean(diag) I with the dead inputs' (zero
    diagonal) H_jj set to 1 first, and ``dead`` their boolean mask. Depends on the inputs
    only: one serves every weight pruned on them and every sparsity."""
    x = _flat_inputs(x).to(torch.float64)
    hessian = x.T @ x
    dead = torch.diagonal(hessian) == 0
    hessian[dead, dead] = 1.0
    damp = percdamp * torch.diagonal(hessian).mean()
    hessian = hessian + damp * torch.eye(hessian.shape[0], dtype=torch.float64)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)),
                                 upper=True)
    return hinv, dead


def sparsegpt_prune(weight, x, rho, blocksize=128, percdamp=0.01, update=True,
                    hessian_inverse=None):
    """Prune a linear layer by SparseGPT (Frantar & Alistarh 2023, Algorithm 1), in float64.

        H = X^T X + percdamp mean(diag) I,   U = chol(H^-1) upper (U^T U = H^-1);
        per block of columns: mask = the round(rho * size) smallest w^2 / U_jj^2;
        per column j: q = w o mask, e = (w - q) / U_jj, W[:, j:] -= e U[j, j:]
        (within the block; then the later blocks get the block's errors).

    Dead inputs (zero diagonal) get H_jj = 1 and their weights zeroed first, as in the
    reference code; H's scaling (the code's 2 / n) cancels in the mask and the updates.

    Parameters
    ----------
    weight : torch.Tensor
        (out, in), ``nn.Linear`` convention.
    x : torch.Tensor
        The layer's inputs X, (..., in).
    rho : float
        The sparsity.
    blocksize : int, default=128
        Columns per block.
    percdamp : float, default=0.01
        Dampening, a fraction of the mean diagonal of H.
    update : bool, default=True
        Apply the OBS weight updates; False: mask selection only.
    hessian_inverse : tuple, default=None
        :func:`sparsegpt_hessian_inverse` of ``x`` (with ``percdamp``) when already
        computed.

    Returns
    -------
    pruned : torch.Tensor
        The pruned (and updated) weight, ``weight``'s dtype.
    mask : torch.Tensor
        The binary mask.
    """
    if hessian_inverse is None:
        hessian_inverse = sparsegpt_hessian_inverse(x, percdamp)
    hinv, dead = hessian_inverse
    w = weight.detach().to(torch.float64).contiguous().clone()
    w[:, dead] = 0.0
    columns = w.shape[1]
    mask = torch.ones_like(w, dtype=torch.bool)
    for start in range(0, columns, blocksize):
        stop = min(start + blocksize, columns)
        block = w[:, start:stop].clone()
        hinv_block = hinv[start:stop, start:stop]
        saliency = block ** 2 / torch.diagonal(hinv_block)[None, :] ** 2
        n_zero = int(round(rho * saliency.numel()))
        prune_block = torch.zeros(block.shape, dtype=torch.bool)
        if n_zero:
            order = torch.argsort(saliency.reshape(-1), stable=True)[:n_zero]
            prune_block.view(-1)[order] = True
        errors = torch.zeros_like(block)
        for j in range(stop - start):
            col = block[:, j]
            kept = torch.where(prune_block[:, j], torch.zeros_like(col), col)
            err = (col - kept) / hinv_block[j, j]
            if update:
                block[:, j:] -= err[:, None] * hinv_block[j, j:][None, :]
            block[:, j] = kept
            errors[:, j] = err
        w[:, start:stop] = block
        if update:
            w[:, stop:] -= errors @ hinv[start:stop, stop:]
        mask[:, start:stop] = ~prune_block
    w = w * mask
    return w.to(weight.dtype), mask.to(weight.dtype)


def _layer_pruner(method, x):
    """``prune(weight, rho) -> (pruned, mask)`` by Wanda or SparseGPT (``method``) on the
    inputs ``x``; SparseGPT's Hessian inverse is computed here, once for all weights and
    sparsities."""
    if method == "wanda":
        return lambda weight, rho: wanda_prune(weight, x, rho)
    hessian_inverse = sparsegpt_hessian_inverse(x)
    return lambda weight, rho: sparsegpt_prune(weight, x, rho,
                                               hessian_inverse=hessian_inverse)


def magnitude_prune(weight, rho):
    """Zero the round(rho numel) entries of smallest |W_ij| (fused-matrix magnitude).

    Parameters
    ----------
    weight : torch.Tensor
        The matrix.
    rho : float
        The sparsity, in [0, 1].

    Returns
    -------
    pruned : torch.Tensor
        W o mask.
    mask : torch.Tensor
        The binary mask, ``weight``'s dtype.
    """
    binary = binarize_mask(torch.ones_like(weight), weight, rho)
    return weight * binary, binary


def prune_fused(method, x, w_q, w_k, rhos, scale=1.0, causal=True, **gd_kwargs):
    """Prune one head's fused matrix W = W_Q W_K^T by one method, at several sparsities.

    The paper's convention (W_Q, W_K d x d_k, inputs x). "ours": GD on the mask and
    binarisation; "magnitude": |W| of the fused matrix; Wanda / SparseGPT prune the layers
    ``W_Q.T`` and ``W_K.T`` (nn.Linear convention) at rho each and fuse the results.

    Parameters
    ----------
    method : {"ours", "wanda", "sparsegpt", "magnitude"}
        The method.
    x : torch.Tensor
        Calibration inputs.
    w_q : torch.Tensor
        W_Q, (d, d_k).
    w_k : torch.Tensor
        W_K, (d, d_k).
    rhos : float or sequence of float
        The sparsities.
    scale : float, default=1.0
        The scores' scale s (for "ours").
    causal : bool, default=True
        Causal mask (for "ours").
    **gd_kwargs
        Further keywords of :func:`optimize_mask` (for "ours").

    Returns
    -------
    dict of float to torch.Tensor
        rho -> the pruned fused W.
    """
    weight = fused_from_factors(w_q, w_k)
    rhos = np.atleast_1d(rhos).tolist()
    if method == "ours":
        pruned, _ = prune_fused_gd(x, weight, rhos, scale=scale, causal=causal, **gd_kwargs)
        return {rho: w for rho, (w, _) in pruned.items()}
    if method == "magnitude":
        return {rho: magnitude_prune(weight, rho)[0] for rho in rhos}
    if method in ("wanda", "sparsegpt"):
        prune = _layer_pruner(method, x)
        return {rho: fused_from_factors(prune(w_q.T, rho)[0].T, prune(w_k.T, rho)[0].T)
                for rho in rhos}
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def low_rank_factor(d, rank, generator=None, std=1.0, dtype=torch.float64):
    """A d x d matrix of rank ``rank``: a Gaussian (entries N(0, std^2)) matrix with all
    but its ``rank`` largest singular values set to zero (Section 6.1's W_Q, W_K)."""
    g = std * torch.randn(d, d, generator=generator, dtype=dtype)
    u, s, vh = torch.linalg.svd(g)
    return (u[:, :rank] * s[:rank]) @ vh[:rank]


# ------------------------------------------------------------------------ torch modules

def fused_head_matrices(attn, q_weight=None, k_weight=None):
    """Per-head (W_h, u_h) of a MultiHeadAttention: W (H, d, d) with W_h = W_Q,h^T W_K,h /
    sqrt(d_h), u (H, d) with u_h = W_K,h^T b_Q,h / sqrt(d_h) (zeros without bias); the
    scores are x W_h x^T + 1 (x u_h)^T up to row constants (module docstring).
    ``q_weight`` / ``k_weight``: (d, d) in place of ``q.weight`` / ``k.weight`` (pruned
    ones, say)."""
    heads, d = attn.n_heads, attn.d_model
    d_h = d // heads
    q_weight = attn.q.weight if q_weight is None else q_weight
    k_weight = attn.k.weight if k_weight is None else k_weight
    w_q = q_weight.detach().reshape(heads, d_h, d)
    w_k = k_weight.detach().reshape(heads, d_h, d)
    fused = w_q.transpose(1, 2) @ w_k / math.sqrt(d_h)
    if attn.q.bias is None:
        return fused, torch.zeros(heads, d, dtype=fused.dtype)
    b_q = attn.q.bias.detach().reshape(heads, d_h)
    return fused, (w_k.transpose(1, 2) @ b_q[..., None])[..., 0] / math.sqrt(d_h)


@dataclass
class PrunedAttention:
    """Per-head pruned fused score matrices of a MultiHeadAttention.

    What :func:`prune_attention_module` returns.

    Parameters
    ----------
    method : str
        The method that pruned them.
    rho : float
        The sparsity.
    fused : torch.Tensor
        The pruned fused matrices W_h, (H, d, d).
    masks : torch.Tensor
        Their binary masks, (H, d, d); for Wanda / SparseGPT the nonzero pattern of the
        fused product.
    key_bias : torch.Tensor
        The dense key biases u_h, (H, d).
    gd : list of MaskOptimization, default=[]
        The GD runs, one per head ("ours" only).
    """

    method: str
    rho: float
    fused: torch.Tensor
    masks: torch.Tensor
    key_bias: torch.Tensor
    gd: list = field(default_factory=list)


def prune_attention_module(attn, x, rho, method="ours", causal=False, attention_mask=None,
                           **gd_kwargs):
    """Prune every head of a MultiHeadAttention with calibration inputs.

    Per head h the scores are x W_h x^T + 1 (x u_h)^T up to row constants,
    W_h = W_Q,h^T W_K,h / sqrt(d_h) (module docstring). ``ours``: GD + binarisation of W_h
    at rho; ``magnitude``: W_h at rho; ``wanda`` / ``sparsegpt``: ``q.weight`` and
    ``k.weight`` pruned as whole layers at rho each, then fused per head (biases
    untouched).

    Parameters
    ----------
    attn : MultiHeadAttention
        The attention module (left as is).
    x : torch.Tensor
        Its inputs (hidden states), (B, N, d) or (N, d).
    rho : float
        The sparsity.
    method : {"ours", "wanda", "sparsegpt", "magnitude"}, default="ours"
        The method.
    causal : bool, default=False
        Causal mask (bidirectional encoders: False).
    attention_mask : torch.Tensor, default=None
        (B, N), 1 for real tokens.
    **gd_kwargs
        Further keywords of :func:`optimize_mask` (for "ours").

    Returns
    -------
    PrunedAttention
        The pruned per-head matrices, masks and key biases.
    """
    fused, key_bias = fused_head_matrices(attn)
    x = x.detach().to(fused.dtype)
    if x.dim() == 2:
        x = x[None]
        attention_mask = None if attention_mask is None else attention_mask[None]
    valid = None if attention_mask is None else attention_mask.to(torch.bool)
    pruned, masks, runs = [], [], []
    if method in ("wanda", "sparsegpt"):
        prune = _layer_pruner(method, x if valid is None else x[valid])
        w_q, _ = prune(attn.q.weight.detach(), rho)
        w_k, _ = prune(attn.k.weight.detach(), rho)
        out, _ = fused_head_matrices(attn, w_q, w_k)   # u_h stays the dense key_bias
        return PrunedAttention(method, rho, out, (out != 0).to(out.dtype), key_bias)
    for h in range(attn.n_heads):
        if method == "ours":
            result = optimize_mask(x, fused[h], causal=causal, valid=valid,
                                   key_bias=key_bias[h], **gd_kwargs)
            binary = binarize_mask(result.mask, fused[h], rho)
            runs.append(result)
        elif method == "magnitude":
            binary = magnitude_prune(fused[h], rho)[1]
        else:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        pruned.append(fused[h] * binary)
        masks.append(binary)
    return PrunedAttention(method, rho, torch.stack(pruned), torch.stack(masks), key_bias,
                           runs)


class FusedScoreAttention(nn.Module):
    """A MultiHeadAttention run with per-head fused score matrices.

        scores_h = x W_h x^T + 1 (x u_h)^T,   out = o(concat_h softmax(scores_h) v_h(x)),

    W_h from :func:`prune_attention_module` (or :func:`fused_head_matrices`: the dense
    module). The row-constant bias terms it drops change nothing after the softmax. Padding
    (``attention_mask`` 0) is masked as in the module; ``causal`` adds the causal mask.
    Shares ``attn.v`` and ``attn.o``; attention dropout is not applied. With the dense W_h
    it reproduces the module's output.

    Parameters
    ----------
    attn : MultiHeadAttention
        The module whose v and o projections are used.
    fused : torch.Tensor
        W_h, (H, d, d) (copied into a buffer).
    key_bias : torch.Tensor, default=None
        u_h, (H, d); None: zeros.
    causal : bool, default=False
        Apply the causal mask.
    """

    def __init__(self, attn, fused, key_bias=None, causal=False):
        super().__init__()
        self.attn = attn
        self.causal = bool(causal)
        self.register_buffer("fused", fused.detach().clone())
        if key_bias is None:
            key_bias = torch.zeros(fused.shape[:2], dtype=fused.dtype)
        self.register_buffer("key_bias", key_bias.detach().clone())

    @classmethod
    def from_pruned(cls, attn, pruned, causal=False):
        """Build the module from a :class:`PrunedAttention`.

        Parameters
        ----------
        attn : MultiHeadAttention
            The pruned module.
        pruned : PrunedAttention
            Its pruned matrices and key biases.
        causal : bool, default=False
            Apply the causal mask.

        Returns
        -------
        FusedScoreAttention
            The module.
        """
        return cls(attn, pruned.fused, pruned.key_bias, causal=causal)

    def attention_probabilities(self, x, attention_mask=None):
        """Return every head's softmax attention.

        Parameters
        ----------
        x : torch.Tensor
            Inputs, (B, N, d).
        attention_mask : torch.Tensor, default=None
            (B, N), 1 for real tokens.

        Returns
        -------
        torch.Tensor
            (B, H, N, N).
        """
        xh = x[:, None].to(self.fused.dtype)
        valid = None if attention_mask is None else attention_mask[:, None]
        return attention_matrix(xh, self.fused, causal=self.causal, valid=valid,
                                key_bias=self.key_bias).to(x.dtype)

    def forward(self, x, attention_mask=None):
        """Apply the attention with the fused score matrices.

        Parameters
        ----------
        x : torch.Tensor
            Inputs, (B, N, d).
        attention_mask : torch.Tensor, default=None
            (B, N), 1 for real tokens.

        Returns
        -------
        torch.Tensor
            (B, N, d).
        """
        probs = self.attention_probabilities(x, attention_mask)
        v = self.attn._heads(self.attn.v(x))
        return self.attn.o((probs @ v).transpose(1, 2).reshape(x.shape))
