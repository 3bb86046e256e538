"""Attention-matrix pruning (paper 004, METHODS card "Attention-matrix pruning"): the
closed-form gradient against finite differences, exact sparsity after binarising, error
monotone in rho, the loss decreasing under the GD, Wanda and SparseGPT against independent
NumPy references, and the torch-module wrapper reproducing the module."""
import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from asyncopt.deep.attnprune import (FusedScoreAttention, attention_matrix,  # noqa: E402
                                     attention_pruning_gradient, attention_pruning_loss,
                                     binarize_mask, fused_from_factors, fused_head_matrices,
                                     low_rank_factor, magnitude_prune, optimize_mask,
                                     prune_attention_module, prune_fused, prune_fused_gd,
                                     relative_attention_error, sparsegpt_hessian_inverse,
                                     sparsegpt_prune, wanda_prune)
from asyncopt.deep.transformer import MultiHeadAttention  # noqa: E402

torch.set_num_threads(1)


def instance(d=16, n=12, rank=4, seed=0, std=None, batch=None):
    """The benchmark's kind of instance: rank-r W_Q, W_K, Gaussian X."""
    g = torch.Generator().manual_seed(seed)
    std = 1.0 / math.sqrt(d) if std is None else std
    w_q, w_k = low_rank_factor(d, rank, g, std), low_rank_factor(d, rank, g, std)
    shape = (n, d) if batch is None else (batch, n, d)
    return w_q, w_k, torch.randn(shape, generator=g, dtype=torch.float64)


# --------------------------------------------------------------------------- the loss

def reference_attention(x, w, causal=True):
    """NumPy f = D^-1 (Mc o exp(X W X^T)) (Definition 3.2), with the max subtracted."""
    s = x @ w @ x.T
    mc = np.tril(np.ones_like(s)) if causal else np.ones_like(s)
    e = mc * np.exp(s - np.where(mc > 0, s, -np.inf).max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_attention_matrix_is_the_causal_softmax():
    w_q, w_k, x = instance()
    w = fused_from_factors(w_q, w_k)
    for causal in (True, False):
        got = attention_matrix(x, w, causal=causal).numpy()
        np.testing.assert_allclose(got, reference_attention(x.numpy(), w.numpy(), causal),
                                   rtol=1e-12, atol=1e-14)
    assert np.allclose(np.triu(attention_matrix(x, w).numpy(), 1), 0)


@pytest.mark.parametrize("case", ["paper", "scaled_batch_padding_bias"])
def test_closed_form_gradient_matches_finite_differences(case):
    w_q, w_k, x = instance(d=8, n=7, seed=1, batch=None if case == "paper" else 3)
    w = fused_from_factors(w_q, w_k) * 3.0
    g = torch.Generator().manual_seed(2)
    mask = 1.0 + 0.3 * torch.randn(w.shape, generator=g, dtype=torch.float64)
    kw = dict(lam=0.07)
    if case != "paper":
        valid = torch.ones(3, 7, dtype=torch.bool)
        valid[1, 5:] = False
        kw.update(scale=0.6, valid=valid, causal=False,
                  key_bias=torch.randn(8, generator=g, dtype=torch.float64))
    loss, grad = attention_pruning_gradient(mask, x, w, **kw)
    assert float(loss) == pytest.approx(float(attention_pruning_loss(mask, x, w, **kw)),
                                        rel=1e-13)
    numeric = torch.zeros_like(mask)
    eps = 1e-6
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            e = torch.zeros_like(mask)
            e[i, j] = eps
            numeric[i, j] = (attention_pruning_loss(mask + e, x, w, **kw)
                             - attention_pruning_loss(mask - e, x, w, **kw)) / (2 * eps)
    np.testing.assert_allclose(grad.numpy(), numeric.numpy(), rtol=1e-6, atol=1e-9)
    assert float(grad.abs().max()) > 1e-2                 # not a trivially zero gradient


def test_loss_and_gradient_vanish_at_the_dense_mask_without_penalty():
    w_q, w_k, x = instance()
    w = fused_from_factors(w_q, w_k)
    loss, grad = attention_pruning_gradient(torch.ones_like(w), x, w)
    assert float(loss) == 0.0 and float(grad.abs().max()) == 0.0


def test_gradient_descent_decreases_the_loss():
    w_q, w_k, x = instance(d=16, n=16, seed=3)
    w = fused_from_factors(w_q, w_k)
    result = optimize_mask(x, w, steps=200, lam_rel=0.3, record_every=1)
    losses = np.array([loss for _, loss in result.losses])
    assert losses[-1] < 0.5 * losses[0]
    assert losses[-1] <= losses.min() + 1e-3 * losses[0]    # ends near its best
    # without momentum and with a step below 1 / Lipschitz every step descends
    plain = optimize_mask(x, w, steps=50, lam_rel=0.3, momentum=0.0, lr_rel=0.5,
                          record_every=1)
    assert np.all(np.diff([loss for _, loss in plain.losses]) < 0)


# --------------------------------------------------------------------------- binarising

@pytest.mark.parametrize("shape", [(16, 16), (7, 9)])
def test_binarize_gives_exact_sparsity_and_nested_masks(shape):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    m = torch.rand(shape, generator=g, dtype=torch.float64)
    previous = torch.ones_like(w)
    for rho in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0):
        binary = binarize_mask(m, w, rho)
        assert int((binary == 0).sum()) == round(rho * w.numel())
        assert set(binary.unique().tolist()) <= {0.0, 1.0}
        kept = (m * w).abs()[binary > 0]
        dropped = (m * w).abs()[binary == 0]
        if kept.numel() and dropped.numel():
            assert float(dropped.max()) <= float(kept.min())
        assert bool((binary <= previous).all())             # nested: prune a superset
        previous = binary
    pruned, _ = magnitude_prune(w, 0.5)
    assert int((pruned == 0).sum()) == round(0.5 * w.numel())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gd_pruning_exact_sparsity_and_error_monotone_in_rho(seed):
    # d = N = 32: monotone on all of seeds 0..29 (at d = N = 16 a few seeds are not: a
    # pruned entry can also undo another's error)
    w_q, w_k, x = instance(d=32, n=32, seed=seed)
    w = fused_from_factors(w_q, w_k)
    rhos = (0.3, 0.5, 0.7, 0.9)
    pruned, _ = prune_fused_gd(x, w, rhos)
    errors = []
    for rho in rhos:
        pw, binary = pruned[rho]
        assert int((binary == 0).sum()) == round(rho * w.numel())
        assert torch.equal(pw, w * binary)
        errors.append(relative_attention_error(x, w, pw))
    assert all(a < b for a, b in zip(errors, errors[1:])), errors
    assert relative_attention_error(x, w, w) == 0.0


def test_prune_fused_methods_on_one_instance():
    w_q, w_k, x = instance(d=16, n=16, seed=6)
    w = fused_from_factors(w_q, w_k)
    for method in ("ours", "wanda", "sparsegpt", "magnitude"):
        out = prune_fused(method, x, w_q, w_k, [0.5, 0.9])
        assert set(out) == {0.5, 0.9}
        assert relative_attention_error(x, w, out[0.5]) < relative_attention_error(
            x, w, out[0.9]), method
    # Wanda prunes the factors, so the fused product of the pruned factors is far denser
    # than rho (zeros only where a whole input feature was dropped from every row)
    out = prune_fused("wanda", x, w_q, w_k, [0.5])[0.5]
    assert float((out == 0).double().mean()) < 0.25
    with pytest.raises(ValueError):
        prune_fused("random", x, w_q, w_k, [0.5])


# --------------------------------------------------------------------------- baselines

def test_wanda_is_the_per_row_top_k_of_the_score():
    g = np.random.default_rng(7)
    w, x = g.standard_normal((6, 10)), g.standard_normal((3, 5, 10)) * g.uniform(0.1, 3, 10)
    for rho in (0.3, 0.5, 0.8):
        pruned, mask = wanda_prune(torch.from_numpy(w), torch.from_numpy(x), rho)
        score = np.abs(w) * np.sqrt((x.reshape(-1, 10) ** 2).sum(0))
        k = round(rho * 10)
        expected = np.ones_like(w)
        for i in range(6):
            expected[i, np.argsort(score[i], kind="stable")[:k]] = 0
        np.testing.assert_array_equal(mask.numpy(), expected)
        np.testing.assert_array_equal(pruned.numpy(), w * expected)


def hessian_inverse_cholesky(x, percdamp):
    h = x.T @ x
    h = h + percdamp * np.mean(np.diag(h)) * np.eye(h.shape[0])
    return h, np.linalg.cholesky(np.linalg.inv(h)).T        # upper U, U^T U = H^-1


def reference_obs(w, x, rho, percdamp=0.01):
    """Independent OBS reference (one block): the mask of the round(rho numel) smallest
    w^2 / [H_F^-1]_jj^2 with F = {j, ..., n} (= U_jj^2), then columns eliminated in order,
    each with the explicit inverse of the remaining sub-Hessian H[F, F]:
    W[:, F] -= (w_j - q_j) / [H_F^-1]_jj [H_F^-1]_{j, F}."""
    h, upper = hessian_inverse_cholesky(x, percdamp)
    n = w.shape[1]
    saliency = w ** 2 / np.diag(upper)[None, :] ** 2
    prune = np.zeros(w.size, dtype=bool)
    prune[np.argsort(saliency.ravel(), kind="stable")[:round(rho * w.size)]] = True
    prune = prune.reshape(w.shape)
    w = w.copy()
    for j in range(n):
        inv = np.linalg.inv(h[j:, j:])
        q = np.where(prune[:, j], 0.0, w[:, j])
        w[:, j:] -= np.outer((w[:, j] - q) / inv[0, 0], inv[0])
        w[:, j] = q
    return w, ~prune


def test_sparsegpt_without_updates_is_the_obs_ordering_mask():
    g = np.random.default_rng(8)
    w, x = g.standard_normal((6, 12)), g.standard_normal((40, 12))
    for rho in (0.3, 0.5, 0.75):
        pruned, mask = sparsegpt_prune(torch.from_numpy(w), torch.from_numpy(x), rho,
                                       blocksize=12, update=False)
        _, upper = hessian_inverse_cholesky(x, 0.01)
        saliency = w ** 2 / np.diag(upper)[None, :] ** 2
        expected = np.ones(w.size)
        expected[np.argsort(saliency.ravel(), kind="stable")[:round(rho * w.size)]] = 0
        np.testing.assert_array_equal(mask.numpy().ravel(), expected)
        np.testing.assert_array_equal(pruned.numpy(), w * mask.numpy())


def test_sparsegpt_matches_sequential_obs_and_beats_no_update():
    g = np.random.default_rng(9)
    w, x = g.standard_normal((6, 12)), g.standard_normal((40, 12)) @ g.standard_normal((12, 12))
    pruned, mask = sparsegpt_prune(torch.from_numpy(w), torch.from_numpy(x), 0.5,
                                   blocksize=12)
    ref_w, ref_mask = reference_obs(w, x, 0.5)
    np.testing.assert_array_equal(mask.numpy().astype(bool), ref_mask)
    np.testing.assert_allclose(pruned.numpy(), ref_w, rtol=1e-9, atol=1e-10)
    plain, _ = sparsegpt_prune(torch.from_numpy(w), torch.from_numpy(x), 0.5, blocksize=12,
                               update=False)

    def output_error(v):
        return np.linalg.norm(x @ (v - w).T)
    assert output_error(pruned.numpy()) < 0.9 * output_error(plain.numpy())


def test_sparsegpt_blocks_have_exact_sparsity():
    g = np.random.default_rng(10)
    w, x = g.standard_normal((5, 12)), g.standard_normal((30, 12))
    pruned, mask = sparsegpt_prune(torch.from_numpy(w), torch.from_numpy(x), 0.5,
                                   blocksize=4)
    for start in range(0, 12, 4):
        assert int((mask[:, start:start + 4] == 0).sum()) == 10
    assert bool((pruned[mask == 0] == 0).all())
    # dead inputs are zeroed
    x[:, 3] = 0.0
    pruned, _ = sparsegpt_prune(torch.from_numpy(w), torch.from_numpy(x), 0.25)
    assert bool((pruned[:, 3] == 0).all())


def test_sparsegpt_reuses_one_hessian_inverse(monkeypatch):
    import asyncopt.deep.attnprune as A
    g = np.random.default_rng(11)
    w, x = torch.from_numpy(g.standard_normal((6, 12))), torch.from_numpy(
        g.standard_normal((40, 12)))
    x[:, 5] = 0.0
    shared = sparsegpt_hessian_inverse(x)
    for rho in (0.3, 0.7):
        for got, expected in zip(sparsegpt_prune(w, x, rho, blocksize=5,
                                                 hessian_inverse=shared),
                                 sparsegpt_prune(w, x, rho, blocksize=5)):
            assert torch.equal(got, expected)
    calls = []
    monkeypatch.setattr(A, "sparsegpt_hessian_inverse",
                        lambda *a, **k: calls.append(1) or sparsegpt_hessian_inverse(*a, **k))
    w_q, w_k, x = instance(d=12, n=20)
    prune_fused("sparsegpt", x, w_q, w_k, [0.3, 0.5, 0.9])
    assert len(calls) == 1                                  # not per factor and rho
    prune_attention_module(MultiHeadAttention(12, 3).double(), x, 0.5, method="sparsegpt")
    assert len(calls) == 2


# --------------------------------------------------------------------------- torch module

@pytest.mark.parametrize("bias", [True, False])
def test_fused_score_attention_reproduces_the_module(bias):
    torch.manual_seed(11)
    attn = MultiHeadAttention(16, 4, bias=bias).double()
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    fused, key_bias = fused_head_matrices(attn)
    wrapped = FusedScoreAttention(attn, fused, key_bias)
    np.testing.assert_allclose(wrapped(x, mask).detach().numpy(),
                               attn(x, mask).detach().numpy(), rtol=1e-10, atol=1e-12)


def test_prune_attention_module_every_method():
    torch.manual_seed(12)
    attn = MultiHeadAttention(16, 2).double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    fused, key_bias = fused_head_matrices(attn)
    dense = FusedScoreAttention(attn, fused, key_bias)
    reference = dense.attention_probabilities(x)
    errors = {}
    for method in ("ours", "magnitude", "wanda", "sparsegpt"):
        pruned = prune_attention_module(attn, x, 0.5, method=method, steps=50)
        assert pruned.fused.shape == (2, 16, 16)
        if method in ("ours", "magnitude"):
            assert [int((m == 0).sum()) for m in pruned.masks] == [128, 128]
            assert torch.equal(pruned.fused, fused * pruned.masks)
        probs = FusedScoreAttention.from_pruned(attn, pruned).attention_probabilities(x)
        errors[method] = float(torch.linalg.vector_norm(probs - reference)
                               / torch.linalg.vector_norm(reference))
        out = FusedScoreAttention.from_pruned(attn, pruned)(x)
        assert out.shape == x.shape and bool(torch.isfinite(out).all())
    assert all(0 < e < 1 for e in errors.values()), errors
    padding = torch.ones(2, 10, dtype=torch.long)
    padding[0, 7:] = 0
    padded = prune_attention_module(attn, x, 0.5, attention_mask=padding, steps=20)
    assert len(padded.gd) == 2 and all(r.losses[-1][1] < r.losses[0][1] for r in padded.gd)
    out = FusedScoreAttention.from_pruned(attn, padded)(x, padding)
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_pruned_layer_methods_fuse_the_pruned_q_and_k_weights(method):
    torch.manual_seed(13)
    attn = MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    padding = torch.ones(2, 10, dtype=torch.long)
    padding[1, 6:] = 0
    pruned = prune_attention_module(attn, x, 0.5, method=method, attention_mask=padding)
    prune = wanda_prune if method == "wanda" else sparsegpt_prune
    rows = x[padding.bool()]
    layers = copy.deepcopy(attn)
    with torch.no_grad():
        layers.q.weight.copy_(prune(attn.q.weight.detach(), rows, 0.5)[0])
        layers.k.weight.copy_(prune(attn.k.weight.detach(), rows, 0.5)[0])
    fused, _ = fused_head_matrices(layers)
    torch.testing.assert_close(pruned.fused, fused, rtol=0, atol=0)
    assert torch.equal(pruned.masks, (fused != 0).double())
    assert torch.equal(pruned.key_bias, fused_head_matrices(attn)[1])   # kept dense
