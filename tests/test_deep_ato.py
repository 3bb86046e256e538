"""ATO (thesis 002 ch. 4, METHODS card "ATO"): zero-invariant groups, compact == masked,
the group prox's closed form, the FLOPs counter, the schedule, and a short training run
that meets the FLOPs budget with every switched-off group exactly zero."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from asyncopt.deep.ato import (ATOController, GatedNet, TinyResNet,  # noqa: E402
                               _project_to_budget,
                               ato_schedule, flops_regularizer, magnitude_masks,
                               random_masks, train_ato, uniform_masks, uniform_widths)

torch.set_num_threads(1)


def tiny_mlp(seed=0):
    torch.manual_seed(seed)
    return GatedNet.mlp((12, 16, 8, 3))


def tiny_conv(seed=0):
    torch.manual_seed(seed)
    net = GatedNet(2, [6, 5], 3, kind="conv", hw=(4, 4))
    with torch.no_grad():                      # non-trivial BN statistics and affine
        for bn in net.norms:
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return net.eval()


def tiny_resnet(seed=0):
    torch.manual_seed(seed)
    net = TinyResNet(2, [6, 5], 3, channels=4, hw=(4, 4))
    with torch.no_grad():
        for bn in list(net.bn1) + list(net.bn2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return net.eval()


def inputs(net, n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    if isinstance(net, TinyResNet) or net.config["kind"] == "conv":
        return torch.randn(n, 2, 4, 4, generator=g)
    return torch.randn(n, net.config["in_dim"], generator=g)


def some_masks(net, seed=3):
    g = torch.Generator().manual_seed(seed)
    masks = [(torch.rand(w, generator=g) < 0.6).float() for w in net.widths]
    for m in masks:
        m[0] = 1
    return masks


@pytest.mark.parametrize("make", [tiny_mlp, tiny_conv, tiny_resnet])
def test_zero_invariance(make):
    net = make()
    x = inputs(net)
    masks = some_masks(net)
    masked = net(x, masks)
    with torch.no_grad():
        for b, m in enumerate(masks):
            spec = net.zig_spec(b)
            spec.scale_(m.to(spec.dtype))              # zero the switched-off groups
    assert torch.allclose(net(x), masked, atol=1e-6)
    # and the group really is the whole ZIG: every tensor slice zero
    for b, m in enumerate(masks):
        for t in net.zig_tensors(b):
            assert torch.all(t[m == 0] == 0)


@pytest.mark.parametrize("make", [tiny_mlp, tiny_conv, tiny_resnet])
def test_compact_equals_masked(make):
    net = make()
    x = inputs(net)
    masks = some_masks(net)
    small = net.compact(masks)
    assert small.widths == [int(m.sum()) for m in masks]
    assert torch.allclose(small(x), net(x, masks), atol=1e-5)
    assert small.flops() == pytest.approx(float(net.flops(masks)))


def test_prox_closed_form():
    net = tiny_mlp()
    spec = net.zig_spec(0)
    before = [t.detach().clone() for t in net.zig_tensors(0)]
    rows = torch.cat([before[0], before[1][:, None]], dim=1)         # weight row + bias
    norms = rows.norm(dim=1)
    lam, lr = 2.0, 0.1
    w = torch.zeros(16)
    w[:8] = 1
    lam_g = lam * (1 - w)
    threshold = lr * lam_g
    from asyncopt.deep.prox import ProxOptimizer
    inner = torch.optim.SGD(net.parameters(), lr=lr)
    opt = ProxOptimizer(inner, [{"spec": spec, "lam": lam_g}])
    opt.zero_grad()
    opt.step()                                  # no gradients: only the prox acts
    scale = torch.clamp(1 - threshold / norms, min=0)
    expected = rows * scale[:, None]
    after = torch.cat([net.layers[0].weight, net.layers[0].bias[:, None]], dim=1)
    assert torch.allclose(after, expected, atol=1e-6)
    assert torch.equal(after[:8], rows[:8])     # w_g = 1: lam_g = 0, untouched
    # a large lam zeroes the switched-off groups exactly
    opt.prox_groups[0]["lam"] = 1e3 * (1 - w)
    opt.step()
    assert torch.all(net.layers[0].weight[8:] == 0) and torch.all(net.layers[0].bias[8:] == 0)


def test_flops_counter():
    net = GatedNet.mlp((64, 128, 128, 10))
    total = 64 * 128 + 128 * 128 + 128 * 10
    assert net.flops() == total
    assert float(net.flops(net.full_masks())) == total
    g = torch.Generator().manual_seed(0)
    masks = net.full_masks()
    prev = total
    for _ in range(40):                         # switching groups off never adds FLOPs
        b = int(torch.randint(2, (1,), generator=g))
        on = torch.nonzero(masks[b]).flatten()
        if len(on) <= 1:
            continue
        masks[b][on[int(torch.randint(len(on), (1,), generator=g))]] = 0
        cur = float(net.flops(masks))
        assert cur < prev
        prev = cur
    assert net.compact(masks).flops() == pytest.approx(prev)
    conv = tiny_conv()
    assert conv.flops() == 9 * 16 * (2 * 6 + 6 * 5) + 5 * 3
    m = some_masks(conv)
    assert conv.compact(m).flops() == pytest.approx(float(conv.flops(m)))
    res = tiny_resnet()
    assert res.flops() == 9 * 16 * (2 * 4 + 2 * 4 * 6 + 2 * 4 * 5) + 4 * 3
    m = some_masks(res)
    assert res.compact(m).flops() == pytest.approx(float(res.flops(m)))
    assert float(res.flops(m)) < res.flops()


def test_tiny_resnet_short_run():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(120, 2, 4, 4, generator=g)
    y = (X[:, 0].mean((1, 2)) > 0).long() + (X[:, 1].mean((1, 2)) > 0).long()
    torch.manual_seed(0)
    net = TinyResNet(2, [8, 8], 3, channels=4, hw=(4, 4))
    res = train_ato(net, X, y, epochs=6, p=0.75, controller_fraction=0.2, batch_size=32)
    assert abs(res.flops_kept - 0.75) <= 0.05
    for b, m in enumerate(res.masks):
        for t in net.zig_tensors(b):
            assert torch.all(t[m == 0] == 0)
    with torch.no_grad():
        assert torch.allclose(res.compact(X[:20]), net(X[:20], res.masks), atol=1e-5)


def test_controller_init_and_regularizer():
    ctrl = ATOController([16, 8])
    assert all(torch.all(m == 1) for m in ctrl.mask())
    w = ctrl(noise=True, generator=torch.Generator().manual_seed(0))
    assert all(torch.all(m == 1) for m in w)
    # straight-through: a gradient reaches the controller through the rounded mask
    net = tiny_mlp()
    loss = flops_regularizer(net.flops(w), net.flops(), p=0.1) + net(inputs(net), w).sum()
    loss.backward()
    assert any(p.grad is not None and torch.any(p.grad != 0) for p in ctrl.heads.parameters())
    total = net.flops()
    assert float(flops_regularizer(torch.tensor(0.4 * total), total, 0.5)) == 0
    assert float(flops_regularizer(torch.tensor(total), total, 0.5, gamma=4)) == \
        pytest.approx(4 * np.log(2))


def test_uniform_widths_and_budget_projection():
    net = GatedNet.mlp((64, 128, 128, 10))
    widths = uniform_widths(net, 0.5 * net.flops())
    assert abs(net.like(widths).flops() / net.flops() - 0.5) < 0.02
    logits = [torch.randn(128), torch.randn(128)]
    masks, moved = _project_to_budget(net, net.full_masks(), logits, 0.47, 0.5)
    assert 0.47 <= float(net.flops(masks)) / net.flops() <= 0.5 and moved > 0
    counts = [int(m.sum()) for m in masks]
    assert [int(m.sum()) for m in random_masks(net.widths, counts)] == counts
    assert [int(m.sum()) for m in magnitude_masks(net, counts)] == counts


@pytest.mark.parametrize("make", [tiny_mlp, tiny_conv, tiny_resnet])
def test_uniform_pruning_baseline(make):
    net = make()
    net.eval()
    with torch.no_grad():                       # distinct group norms, not all alike
        for b in range(len(net.widths)):
            spec = net.zig_spec(b)
            spec.scale_(torch.linspace(0.2, 3.0, net.widths[b])[
                torch.randperm(net.widths[b], generator=torch.Generator().manual_seed(b))]
                .to(spec.dtype))
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    total = net.flops()
    for frac in (0.3, 0.5, 0.75):
        target = frac * total
        widths = uniform_widths(net, target)
        masks = uniform_masks(net, target)
        counts = [int(m.sum()) for m in masks]
        # the kept counts per block are uniform_widths' counts
        assert counts == widths
        assert all(((m == 0) | (m == 1)).all() for m in masks)
        # one kept fraction r for every block (up to rounding to whole units)
        r = [k / w for k, w in zip(counts, net.widths)]
        assert max(r) - min(r) <= max(1.0 / w for w in net.widths) + 1e-12
        # in each block the kept groups are the top-k by ||M_g||_2
        for norms, m, k in zip(net.group_norms(), masks, counts):
            top = set(torch.argsort(norms, descending=True)[:k].tolist())
            assert set(torch.nonzero(m).flatten().tolist()) == top
            if k < len(m):
                assert norms[m > 0].min() > norms[m == 0].max()
        # FLOPs: masked == compact == the narrow net of uniform widths
        small = net.compact(masks)
        assert small.widths == widths
        assert small.flops() == pytest.approx(net.like(widths).flops())
        assert float(net.flops(masks)) == pytest.approx(net.like(widths).flops())
        x = inputs(net)
        with torch.no_grad():
            assert torch.allclose(small(x), net(x, masks), atol=1e-5)
        # no fine-tuning: the dense net is unchanged and the kept groups are copied as is
        for k_, v in net.state_dict().items():
            assert torch.equal(v, before[k_]), k_
        gated_input = not isinstance(net, TinyResNet)      # GatedNet: block b reads block b-1
        for b, m in enumerate(masks):
            keep = torch.nonzero(m).flatten()
            for t_src, t_dst in zip(net.zig_tensors(b), small.zig_tensors(b)):
                src = t_src.index_select(0, keep)
                if gated_input and b > 0 and src.dim() > 1:
                    src = src.index_select(1, torch.nonzero(masks[b - 1]).flatten())
                assert torch.equal(t_dst, src), (b, tuple(t_src.shape))
        if gated_input:
            last = torch.nonzero(masks[-1]).flatten()
            assert torch.equal(small.head.weight, net.head.weight.index_select(1, last))
            assert torch.equal(small.head.bias, net.head.bias)
    # an equal-width MLP: exactly the same count, hence fraction, in every layer
    mlp = GatedNet.mlp((64, 128, 128, 10))
    ws = [int(m.sum()) for m in uniform_masks(mlp, 0.5 * mlp.flops())]
    assert ws[0] == ws[1] == uniform_widths(mlp, 0.5 * mlp.flops())[0] < 128


def digits_small(n=600):
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    X = (X - X.mean(0)) / (X.std(0) + 1e-8)
    return torch.tensor(X[:n], dtype=torch.float32), torch.tensor(y[:n])


def test_schedule_controller_and_prox_windows():
    X, y = digits_small(400)
    epochs = 10
    e_start, e_w, e_end = ato_schedule(epochs)
    assert (e_start, e_w, e_end) == (1, 2, 5)
    torch.manual_seed(0)
    net = GatedNet.mlp((64, 32, 32, 10))
    snaps, zero_before_w = [], []

    def callback(epoch, info):
        snaps.append(torch.cat([p.detach().flatten().clone()
                                for p in info["controller"].parameters()]))
        if epoch < e_w:
            zero_before_w.append(info["zero_groups"])
    res = train_ato(net, X, y, epochs=epochs, p=0.5, controller_fraction=0.2,
                    callback=callback)
    changed = [not torch.equal(snaps[e], snaps[e - 1]) for e in range(1, epochs)]
    for e in range(1, epochs):                   # epoch e changed it iff e in [e_start, e_end)
        assert changed[e - 1] == (e_start <= e < e_end), e
    for row in res.history:
        e = row["epoch"] - 1
        assert (row["controller_steps"] > 0) == (e_start <= e < e_end)
        assert (row["prox_steps"] > 0) == (e >= e_w)
        assert row["mask_frozen"] == (e >= e_end)
    assert (res.history[0]["controller_steps"] == 0)
    assert all(z == 0 for z in zero_before_w)
    # the mask stays frozen after e_end
    assert all(r["kept"] == res.history[e_end]["kept"] for r in res.history[e_end:])


@pytest.mark.parametrize("operator", ["soft_threshold", "half_space"])
def test_short_run_budget_and_exact_zeros(operator):
    X, y = digits_small(600)
    torch.manual_seed(0)
    net = GatedNet.mlp((64, 32, 32, 10))
    p = 0.5
    res = train_ato(net, X, y, epochs=10, p=p, operator=operator, eps=0.0, seed=0)
    assert abs(res.flops_kept - p) <= 0.05
    for b, m in enumerate(res.masks):
        for t in net.zig_tensors(b):
            assert torch.all(t[m == 0] == 0), (b, operator)
    x = X[:50]
    with torch.no_grad():
        assert torch.allclose(res.compact(x), net(x, res.masks), atol=1e-5)
        assert torch.allclose(net(x), net(x, res.masks), atol=1e-5)   # zero-invariance
    assert res.compact.flops() / net.flops() == pytest.approx(res.flops_kept)
