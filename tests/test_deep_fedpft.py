"""LoRA layers, the transformer encoder and FedPFT (asyncopt.deep.lora / transformer /
fedpft; METHODS card "FedPFT", paper 000)."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
from torch import nn  # noqa: E402

from asyncopt.deep import fedpft as F  # noqa: E402
from asyncopt.deep.federated import ParameterVector  # noqa: E402
from asyncopt.deep.lora import (LoRALinear, adapter_vector, attach_lora,  # noqa: E402
                                trainable_parameter_count)
from asyncopt.deep.partition import dirichlet_partition  # noqa: E402
from asyncopt.deep.transformer import bert_encoder, tiny_encoder  # noqa: E402


def small_fm(seed=0, activation="relu", n_layers=4):
    return tiny_encoder(d_model=16, n_heads=4, d_ff=32, n_layers=n_layers,
                        activation=activation, seed=seed).eval()


def inputs(n=20, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).random((n, 64)).astype(np.float32))


def ffn_state(model):
    return {k: v.clone() for k, v in model.state_dict().items() if ".ffn." in k}


# --------------------------------------------------------------------------- LoRA

def test_lora_linear_starts_at_base_and_equals_merged_weight():
    torch.manual_seed(0)
    base = nn.Linear(7, 5)
    x = torch.randn(3, 7)
    before = base(x)
    lora = LoRALinear(copy.deepcopy(base), r=2, alpha=6.0)
    assert torch.equal(lora(x), before)                    # B = 0: exactly W0
    with torch.no_grad():
        lora.lora_B.normal_()
    W = base.weight + 3.0 * lora.lora_B @ lora.lora_A    # alpha / r = 3
    torch.testing.assert_close(lora(x), x @ W.T + base.bias)
    torch.testing.assert_close(lora.merged_weight(), W)
    assert not lora.base.weight.requires_grad and lora.lora_A.requires_grad


def test_attach_lora_wraps_qkvo_and_freezes_the_rest():
    model = small_fm()
    names = attach_lora(model, r=4, alpha=16)
    assert len(names) == 4 * 4 and all(n.split(".")[-1] in "qkvo" for n in names)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or n.startswith("head.") for n in trainable)
    # per layer and module: r (d + d) = 4 * 32; head: 16 * 10 + 10
    assert trainable_parameter_count(model) == 16 * 4 * 32 + 170
    assert adapter_vector(model).size == trainable_parameter_count(model)
    with pytest.raises(ValueError, match="no nn.Linear named"):
        attach_lora(small_fm(), targets=("query",))


def test_roberta_base_lora_parameter_count_from_the_model():
    with torch.device("meta"):
        model = bert_encoder(vocab_size=50265, max_positions=514, type_vocab_size=1,
                             d_model=768, n_heads=12, d_ff=3072, n_layers=12)
    attach_lora(model, targets=("q", "v"), r=8, trainable=())
    assert 8 * trainable_parameter_count(model) == 2_359_296


# --------------------------------------------------------------------------- encoder

def test_encoder_attention_matches_a_direct_computation():
    model = small_fm()
    layer = model.layers[0]
    h = torch.randn(2, 8, 16)
    mask = torch.ones(2, 8)
    mask[1, 5:] = 0
    a = layer.attn
    q, k, v = a.q(h), a.k(h), a.v(h)
    outs = []
    for head in range(4):
        cols = slice(4 * head, 4 * head + 4)
        scores = q[..., cols] @ k[..., cols].transpose(1, 2) / 2.0
        scores = scores.masked_fill(mask[:, None, :] == 0, float("-inf"))
        outs.append(torch.softmax(scores, -1) @ v[..., cols])
    expected = a.o(torch.cat(outs, -1))
    torch.testing.assert_close(a(h, mask), expected, rtol=1e-5, atol=1e-6)
    # a padded token changes nothing for the others
    h2 = h.clone()
    h2[1, 6] += 10.0
    torch.testing.assert_close(a(h2, mask)[1, :5], a(h, mask)[1, :5])


# --------------------------------------------------------------------------- sub-FM

def test_kept_neurons_are_the_top_k_by_saliency():
    fm = small_fm()
    sub, kept = F.build_sub_fm(fm, drop_ratio=0.75)
    assert sorted(kept) == [1, 2]                          # first and last layers whole
    for layer, neurons in kept.items():
        U = fm.layers[layer].ffn.fc1.weight.detach().numpy().astype(np.float64)
        W = fm.layers[layer].ffn.fc2.weight.detach().numpy().astype(np.float64)
        saliency = np.sqrt((U ** 2).sum(1) + (W ** 2).sum(0))
        top = np.sort(np.argsort(-saliency)[:8])
        assert np.array_equal(neurons.numpy(), top)
        assert sub.layers[layer].ffn.d_ff == 8
    for layer in (0, 3):
        assert sub.layers[layer].ffn.d_ff == 32


def test_ffn_difference_is_the_dropped_neurons_sum():
    fm = small_fm().double()
    sub, kept = F.build_sub_fm(fm, drop_ratio=0.6)
    a = torch.randn(5, 8, 16, dtype=torch.float64)
    for layer, neurons in kept.items():
        full, compressed = fm.layers[layer].ffn, sub.layers[layer].ffn
        dropped = sorted(set(range(32)) - set(neurons.tolist()))
        u, b, w = full.fc1.weight, full.fc1.bias, full.fc2.weight
        expected = sum(torch.relu(a @ u[i] + b[i])[..., None] * w[:, i] for i in dropped)
        torch.testing.assert_close(full(a) - compressed(a), expected, rtol=0, atol=1e-12)


def test_drop_ratio_zero_gives_identical_outputs():
    fm = small_fm()
    sub, _ = F.build_sub_fm(fm, drop_ratio=0.0)
    x = inputs()
    assert torch.equal(sub(x), fm(x))
    states = [s.detach() for s in fm.hidden_states(x)]
    loss = F.distillation_loss(states, sub.hidden_states(x), fm, sub)
    assert float(loss.detach()) == 0.0


def test_distillation_loss_is_eq13_and_differentiable():
    fm = small_fm(seed=1)
    sub, kept = F.build_sub_fm(fm, drop_ratio=0.75)
    x = inputs(seed=2)
    teacher = [s.detach() for s in fm.hidden_states(x)]
    student = sub.hidden_states(x)
    loss = F.distillation_loss(teacher, student, fm, sub, mu=0.7)
    expected = 0.0
    for i in range(4):
        t, s = teacher[i + 1].double(), student[i + 1].detach().double()
        expected += float(((s - t) ** 2).mean() / (t ** 2).mean())
        if i in kept:
            full, comp = fm.layers[i].ffn, sub.layers[i].ffn
            WU = (full.fc2.weight @ full.fc1.weight).double()
            WU_sub = (comp.fc2.weight @ comp.fc1.weight).double()
            expected += 0.7 * float(((WU - WU_sub) ** 2).sum().detach())
    assert float(loss.detach()) == pytest.approx(expected / 4, rel=1e-5)
    # the W U term carries a gradient to the compressed fan-in weights
    sub.zero_grad()
    only_term = F.distillation_loss(teacher, [s.detach() for s in student], fm, sub, mu=1.0)
    only_term.backward()
    g = sub.layers[1].ffn.fc1.weight.grad
    assert g is not None and float(g.abs().sum()) > 0


def test_layer_distillation_lowers_the_loss_and_touches_only_compressed_ffns():
    fm = small_fm(seed=3)
    sub, _ = F.build_sub_fm(fm, drop_ratio=0.75)
    before = copy.deepcopy(sub)
    X = inputs(200, seed=4)
    losses = F.distill(fm, sub, X, layers=F.compressed_layers(4), epochs=15, lr=1e-2)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    changed = {n for (n, p), q in zip(sub.named_parameters(), before.parameters())
               if not torch.equal(p, q)}
    assert changed and all(n.split(".")[1] in ("1", "2") and (".ffn." in n or ".ffn_norm." in n)
                           for n in changed)


def test_distill_takes_the_frozen_fm_products_once(monkeypatch):
    fm = small_fm(seed=3)
    sub, kept = F.build_sub_fm(fm, drop_ratio=0.75)
    assert sorted(F.teacher_ffn_products(fm, sub)) == sorted(kept)
    x = inputs(seed=2)
    teacher = [s.detach() for s in fm.hidden_states(x)]
    student = sub.hidden_states(x)
    assert torch.equal(F.distillation_loss(teacher, student, fm, sub),
                       F.distillation_loss(teacher, student, fm, sub,
                                           fm_products=F.teacher_ffn_products(fm, sub)))
    fm_ffns = {id(layer.ffn) for layer in fm.layers}
    calls = []
    product = F.ffn_product
    monkeypatch.setattr(F, "ffn_product",
                        lambda ffn: calls.append(id(ffn) in fm_ffns) or product(ffn))
    losses = F.distill(fm, sub, inputs(40, seed=4), layers=F.compressed_layers(4),
                       epochs=1, batch_size=8)
    assert len(losses) == 5
    assert calls.count(True) == len(kept)                 # once per layer, not per step
    assert calls.count(False) == len(kept) * len(losses)


# --------------------------------------------------------------------------- adapters

def test_adapters_trained_on_the_sub_fm_load_into_the_fm():
    fm = small_fm()
    sub, _ = F.build_sub_fm(fm, 0.75)
    proxy = F.with_adapters(sub, n_classes=3, seed=5)
    target = F.with_adapters(fm, n_classes=3, seed=5)
    ffn_before = ffn_state(target)
    proxy_layout = ParameterVector(proxy, buffers=False, trainable_only=True)
    target_layout = ParameterVector(target, buffers=False, trainable_only=True)
    assert proxy_layout.names == target_layout.names
    assert proxy_layout.shapes == target_layout.shapes   # no shape change
    with torch.no_grad():
        for p in proxy.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    assert F.plug_adapters(proxy, target) == proxy_layout.size
    np.testing.assert_array_equal(target_layout.get(), proxy_layout.get())
    after = ffn_state(target)
    assert all(torch.equal(after[k], v) for k, v in ffn_before.items())


# --------------------------------------------------------------------------- alignment

def test_zero_activation_counts_match_a_direct_count():
    fm = small_fm(seed=6)
    X = inputs(30, seed=7)
    counts = F.zero_activation_counts(fm, X, [1, 2])
    h = fm.hidden_states(X)
    for j in (1, 2):
        layer = fm.layers[j]
        a = layer.attn_norm(h[j] + layer.attn(h[j]))
        pre = layer.ffn.fc1(a).reshape(-1, 32)
        zeros, tokens = counts[j]
        assert tokens == 30 * 8
        np.testing.assert_array_equal(zeros, (torch.relu(pre) == 0).sum(0).numpy())


def test_select_by_apoz_picks_the_highest_summed_apoz():
    reports = [{1: (np.array([0., 5, 1, 7]), 10)}, {1: (np.array([4., 0, 1, 2]), 10)}]
    mask = F.select_by_apoz(reports, p=0.5)[1]
    assert mask.tolist() == [False, True, False, True]     # summed zeros 4, 5, 2, 9


def test_alignment_changes_exactly_the_selected_neurons():
    fm = small_fm(seed=8)
    sub, _ = F.build_sub_fm(fm, 0.5)                      # 16 neurons kept
    before = copy.deepcopy(sub)
    rng = np.random.default_rng(9)
    masks = {j: torch.from_numpy(rng.random(16) < 0.5) for j in (1, 2)}
    F.align_neurons(fm, sub, inputs(100, seed=10), masks, epochs=1.0, lr=1e-2)
    for (name, p), q in zip(sub.named_parameters(), before.parameters()):
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        if layer in masks and name.endswith(("ffn.fc1.weight", "ffn.fc1.bias")):
            moved = (p != q).reshape(16, -1).any(1)
            assert torch.equal(moved, masks[layer]), name
        elif layer in masks and name.endswith("ffn.fc2.weight"):
            assert torch.equal((p != q).any(0), masks[layer]), name
        else:
            assert torch.equal(p, q), name


# --------------------------------------------------------------------------- federated runs

@pytest.fixture(scope="module")
def task():
    data = F.fedpft_digits(n_public=300, n_test=200, seed=0)
    fm = tiny_encoder(d_model=16, n_heads=4, d_ff=32, n_layers=4, seed=0)
    F.pretrain(fm, data["X_pretrain"], data["y_pretrain"], epochs=3)
    X, y = data["X_clients"][:240], data["y_clients"][:240]
    partition = dirichlet_partition(y, 6, 1.0, seed=0)
    return fm, data, X, y, partition


def run(task, method, rounds=4, **kw):
    fm, data, X, y, partition = task
    return F.run_fedpft(fm, X, y, partition, data["X_test"], data["y_test"],
                        data["X_pretrain"], method=method, rounds=rounds, distill_epochs=0.5,
                        align_every=2, **kw)


def test_bytes_per_round_are_adapters_and_head_plus_aligned_neurons(task):
    res = run(task, "fedpft", client_fraction=0.5)
    P = res["trainable"]
    d, m = 16, 3                                           # participants: round(0.5 * 6)
    assert P == 4 * 4 * 4 * 2 * d + (d * 10 + 10)
    assert res["lora_params"] == 4 * 4 * 4 * 2 * d
    for record in res["history"]:
        aligned = record.get("aligned_bytes", 0)
        assert record["bytes_sent"] == 4 * P * m + aligned
        if record["round"] == 2:                           # align_every = 2
            n_aligned = 2 * 4                              # half of 8 neurons, 2 layers
            assert aligned == 4 * (2 * d + 1) * n_aligned * m
            assert record["bytes_received"] == 4 * P * m + 4 * 16 * m
        else:
            assert aligned == 0 and record["bytes_received"] == 4 * P * m
    plain = run(task, "fedpft_b", client_fraction=0.5)
    assert all(r["bytes_sent"] == 4 * P * m for r in plain["history"])


def test_the_fm_keeps_its_ffn_and_gets_the_proxys_adapters(task):
    fm = task[0]
    res = run(task, "fedpft")
    target, proxy = res["model"], res["proxy"]
    original = {k: v for k, v in fm.state_dict().items() if ".ffn." in k}
    assert all(torch.equal(target.state_dict()[k], v) for k, v in original.items())
    a = ParameterVector(proxy, buffers=False, trainable_only=True).get()
    b = ParameterVector(target, buffers=False, trainable_only=True).get()
    np.testing.assert_array_equal(a, b)
    assert res["fm_params"] == F.parameter_count(target)
    dropped = 2 * 24 * (2 * 16 + 1)                        # 2 layers x 24 neurons x (2d+1)
    assert res["fm_params"] - res["client_params"] == dropped


def test_fedot_trains_as_many_adapter_scalars_on_fewer_layers(task):
    pft = run(task, "fedpft", rounds=1)
    ot = run(task, "fedot", rounds=1, emulator_layers=1)
    assert ot["trainable"] == pft["trainable"]
    layer = sum(p.numel() for p in task[0].layers[1].parameters())
    assert len(ot["proxy"].layers) == 3
    assert ot["client_params"] == ot["fm_params"] - layer


def test_unknown_method_is_refused(task):
    with pytest.raises(ValueError, match="method must be one of"):
        run(task, "fedsomething")
