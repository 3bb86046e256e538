"""The torch bridge's foundation: torch stays optional, and asyncopt.deep.prox applies the
engine's block prox (asyncopt.penalties, on numpy) and the HSPG half-space projection to
structured groups of torch parameters."""
import copy
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from asyncopt.penalties import L1, GroupL1

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
if torch is not None:
    from asyncopt.deep.prox import (ParamGroupSpec, ProxOptimizer, group_soft_threshold_,
                                    half_space_project_)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESSAGE = ("asyncopt.deep needs PyTorch: pip install 'asyncopt[deep]' "
           "(or torch==2.13.0, the CPU wheel)")


def run_python(code):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


# -- torch is optional -------------------------------------------------------------------

def test_engine_works_and_deep_explains_itself_without_torch():
    proc = run_python("""
        import importlib.abc, sys

        # as if torch were not installed (sys.modules["torch"] = None blocks it too, but
        # scipy's array-API helpers then fail on the None entry)
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torch":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoTorch())
        import numpy as np
        import asyncopt
        import asyncopt.cli.lasso, asyncopt.cli.logreg
        from sklearn.linear_model import Lasso as SkLasso
        rng = np.random.default_rng(0)
        X = rng.standard_normal((60, 12))
        y = X[:, :3] @ np.array([1.5, -2.0, 1.0]) + 0.1 * rng.standard_normal(60)
        ours = asyncopt.Lasso(alpha=0.05, tol=1e-10, max_epochs=2000).fit(X, y)
        ref = SkLasso(alpha=0.05, tol=1e-12, max_iter=100000).fit(X, y)
        print("COEF_ERR", np.max(np.abs(ours.coef_ - ref.coef_)))
        print("TORCH_LOADED", "torch" in sys.modules)
        try:
            import asyncopt.deep
        except ImportError as exc:
            print("DEEP_ERROR", exc)
        try:
            from asyncopt.deep import prox
        except ImportError as exc:
            print("PROX_ERROR", exc)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    err = [float(line.split()[1]) for line in lines if line.startswith("COEF_ERR")]
    assert err and err[0] < 1e-6
    assert f"DEEP_ERROR {MESSAGE}" in lines
    assert f"PROX_ERROR {MESSAGE}" in lines
    assert "TORCH_LOADED False" in lines


def test_nothing_outside_asyncopt_deep_imports_torch():
    package = os.path.join(ROOT, "asyncopt")
    importing = re.compile(r"^\s*(import\s+torch\b|from\s+torch\b)", re.MULTILINE)
    offenders = []
    for folder, _, files in os.walk(package):
        if os.path.relpath(folder, package).split(os.sep)[0] == "deep":
            continue
        offenders += [os.path.join(folder, f) for f in files if f.endswith(".py")
                      and importing.search(open(os.path.join(folder, f)).read())]
    assert offenders == []
    proc = run_python("""
        import sys
        import asyncopt, asyncopt.estimators, asyncopt.cli.lasso, asyncopt.cli.logreg
        import asyncopt.solvers.mpi, asyncopt.data
        print("TORCH_LOADED", "torch" in sys.modules)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TORCH_LOADED False" in proc.stdout


# -- the prox on torch tensors equals the engine's prox ------------------------------------

def flat_engine_layout(spec_groups):
    """Independent layout: every slice of every group as a run of features of one flat
    vector, in group order; returns (flat values, groups as feature-index arrays, slice
    records (tensor, dim, index, features))."""
    values, groups, records, offset = [], [], [], 0
    for group in spec_groups:
        ids = []
        for tensor, dim, index in group:
            piece = tensor.detach().reshape(-1)[index:index + 1] if dim is None \
                else tensor.detach().select(dim, index).reshape(-1)
            values.append(piece.numpy().copy())
            features = np.arange(offset, offset + piece.numel())
            records.append((tensor, dim, index, features))
            ids.append(features)
            offset += piece.numel()
        groups.append(np.concatenate(ids))
    return np.concatenate(values), groups, records


def slice_values(tensor, dim, index):
    data = tensor.detach()
    return (data.reshape(-1)[index:index + 1] if dim is None
            else data.select(dim, index).reshape(-1)).numpy()


@needs_torch
def test_elementwise_soft_threshold_equals_engine_l1():
    rng = np.random.default_rng(0)
    a = torch.tensor(rng.standard_normal((5, 7)), dtype=torch.float64)
    b = torch.tensor(rng.standard_normal(11), dtype=torch.float64)
    spec = ParamGroupSpec.elementwise([a, b])
    x = np.concatenate([a.numpy().ravel(), b.numpy().ravel()])
    weights = rng.uniform(0.5, 2.0, x.size)
    step, lam = 0.3, 1.7
    expected = L1(x.size, weights).prox(x, step * lam)
    group_soft_threshold_(spec, step * lam * torch.tensor(weights))
    got = np.concatenate([a.numpy().ravel(), b.numpy().ravel()])
    assert np.max(np.abs(got - expected)) <= 1e-12
    assert 0 < np.count_nonzero(expected == 0) < x.size        # both branches exercised


@needs_torch
def test_prox_optimizer_threshold_is_step_times_lam_times_weight():
    """Zero gradients: the SGD step moves nothing, and what is left is the prox of
    lr * lam * Omega, which must equal the engine's L1 and GroupL1 prox."""
    rng = np.random.default_rng(1)
    w = torch.nn.Parameter(torch.tensor(rng.standard_normal((6, 4)), dtype=torch.float64))
    v = torch.nn.Parameter(torch.tensor(rng.standard_normal(9), dtype=torch.float64))
    w0, v0 = w.detach().numpy().copy(), v.detach().numpy().copy()
    rows = ParamGroupSpec.aligned([(w, 0)])
    entries = ParamGroupSpec.elementwise([v])
    lr, lam_rows, lam_entries = 0.5, 1.1, 0.9
    opt = ProxOptimizer(torch.optim.SGD([w, v], lr=lr), [
        {"spec": rows, "lam": lam_rows, "weights": rows.sizes ** 0.5},
        {"spec": entries, "lam": lam_entries}])
    w.grad, v.grad = torch.zeros_like(w), torch.zeros_like(v)
    opt.step()
    expected_w = GroupL1(24, 4).prox(w0.ravel(), lr * lam_rows).reshape(6, 4)
    expected_v = L1(9).prox(v0, lr * lam_entries)
    assert np.max(np.abs(w.detach().numpy() - expected_w)) <= 1e-12
    assert np.max(np.abs(v.detach().numpy() - expected_v)) <= 1e-12
    assert 0 < np.count_nonzero(np.all(expected_w == 0, axis=1)) < 6


@needs_torch
@pytest.mark.parametrize("layout", ["zig", "scattered"])
def test_group_soft_threshold_equals_engine_group_prox(layout):
    rng = np.random.default_rng(2)
    f64 = dict(dtype=torch.float64)
    if layout == "zig":       # conv out-channels with their BN weight and bias
        conv = torch.tensor(rng.standard_normal((6, 3, 2, 2)), **f64)
        gamma, beta = (torch.tensor(rng.standard_normal(6), **f64) for _ in range(2))
        tensors = [conv, gamma, beta]
        spec_groups = [[(conv, 0, c), (gamma, 0, c), (beta, 0, c)] for c in range(6)]
        spec = ParamGroupSpec.aligned([(conv, 0), (gamma, 0), (beta, 0)])
    else:                     # groups mixing rows, columns and single entries
        A = torch.tensor(rng.standard_normal((8, 4)), **f64)
        B = torch.tensor(rng.standard_normal((3, 10)), **f64)
        c = torch.tensor(rng.standard_normal(5), **f64)
        tensors = [A, B, c]
        spec_groups = [[(A, 0, 6), (B, 1, 2)], [(A, 0, 1)], [(B, 1, 9), (c, None, 4),
                                                            (A, 0, 3)],
                       [(c, None, 0), (c, None, 2)], [(B, 1, 0), (B, 1, 5), (A, 0, 0)],
                       [(A, 0, 7)]]
        spec = ParamGroupSpec(spec_groups)
    before = [t.clone() for t in tensors]
    x, groups, records = flat_engine_layout(spec_groups)
    sizes = np.array([g.size for g in groups])
    assert np.array_equal(spec.sizes, sizes)
    penalty = GroupL1(x.size, groups)                       # default w_g = sqrt(|g|)
    norms = np.array([np.linalg.norm(x[g]) for g in groups]) / np.sqrt(sizes)
    step = float(np.median(norms))                         # about half the groups vanish
    expected = penalty.prox(x, step)
    group_soft_threshold_(spec, step * np.sqrt(sizes))
    for tensor, dim, index, features in records:
        assert np.max(np.abs(slice_values(tensor, dim, index) - expected[features])) <= 1e-12
    zero_groups = [np.all(expected[g] == 0) for g in groups]
    assert 0 < sum(zero_groups) < len(groups)
    # entries in no group are untouched, bit for bit
    touched = [torch.zeros_like(t, dtype=torch.bool) for t in tensors]
    for tensor, dim, index, _ in records:
        mask = touched[[t is tensor for t in tensors].index(True)]
        if dim is None:
            mask.view(-1)[index] = True
        else:
            mask.select(dim, index).fill_(True)
    for t, t0, mask in zip(tensors, before, touched):
        assert torch.equal(t[~mask], t0[~mask])


# -- half-space projection -------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("lam", [0.0, 0.4])
def test_half_space_projection_zeroes_exactly_the_expected_groups(lam):
    """Linear rows with their bias (ZIGs). The gradient of row j is c_j x^_j / lr plus a
    part orthogonal to x^_j, so after SGD <x_j, x^_j> = (1 - c_j) ||x^_j||^2 and HSPG must
    zero exactly the rows with 1 - c_j (- lr lam / ||x^_j||) < eps."""
    rng = np.random.default_rng(3)
    n_rows, n_in, lr, eps = 12, 5, 0.1, 0.3
    linear = torch.nn.Linear(n_in, n_rows).double()
    spec = ParamGroupSpec.output_channels(linear)
    ref = np.column_stack([linear.weight.detach().numpy(), linear.bias.detach().numpy()])
    ref[4] = 0.0                                           # a group that is zero before
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(ref[:, :-1]))
        linear.bias.copy_(torch.tensor(ref[:, -1]))
    c = np.linspace(-0.5, 1.5, n_rows)
    noise = rng.standard_normal(ref.shape)
    noise -= (np.sum(noise * ref, axis=1) / np.maximum(np.sum(ref * ref, axis=1),
                                                       1e-300))[:, None] * ref
    grad = c[:, None] * ref / lr + noise
    linear.weight.grad = torch.tensor(grad[:, :-1])
    linear.bias.grad = torch.tensor(grad[:, -1])
    opt = ProxOptimizer(torch.optim.SGD(linear.parameters(), lr=lr), spec,
                        operator="half_space", lam=lam, eps=eps)
    opt.step()
    trial = ref - lr * grad
    ref_norm = np.linalg.norm(ref, axis=1)
    nonzero = ref_norm > 0
    trial[nonzero] -= lr * lam * ref[nonzero] / ref_norm[nonzero, None]
    expect_zero = np.sum(trial * ref, axis=1) < eps * ref_norm ** 2
    expected = np.where(expect_zero[:, None], 0.0, trial)
    got = np.column_stack([linear.weight.detach().numpy(), linear.bias.detach().numpy()])
    got_zero = np.all(got == 0, axis=1)
    assert np.array_equal(got_zero & nonzero, expect_zero)
    assert 2 <= expect_zero.sum() <= n_rows - 3
    assert not expect_zero[4] and not got_zero[4]          # zero before: left as stepped
    assert np.max(np.abs(got - expected)) <= 1e-12


@needs_torch
def test_half_space_project_function_returns_the_zeroed_mask():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    spec = ParamGroupSpec.aligned([(x, 0)])
    reference = spec.snapshot()
    with torch.no_grad():
        x.copy_(torch.tensor([[0.5, 3.0], [-0.1, 0.2], [-1.0, 2.0]]))
    # <x_g, x^_g> = 0.5, 0.2, 1.0 against eps ||x^_g||^2 = 0.25, 0.25, 0.5
    zeroed = half_space_project_(spec, reference, eps=0.25)
    assert zeroed.tolist() == [False, True, False]
    assert x.tolist() == [[0.5, 3.0], [0.0, 0.0], [-1.0, 2.0]]


# -- the wrapper in torch.optim's style ----------------------------------------------------

def small_net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 3))


def train_steps(net, optimizer, batches, closure=False):
    for x, y in batches:
        def loss_closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            return loss
        if closure:
            optimizer.step(loss_closure)
        else:
            loss_closure()
            optimizer.step()


def make_batches(seed, n_batches=6):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
            for _ in range(n_batches)]


def bits(net):
    return [p.detach().view(torch.int32).clone() for p in net.parameters()]


@needs_torch
@pytest.mark.parametrize("closure", [False, True])
def test_zero_strength_is_bit_identical_to_the_inner_optimizer(closure):
    batches = make_batches(0)
    plain, wrapped = small_net(0), small_net(0)
    train_steps(plain, torch.optim.Adam(plain.parameters(), lr=0.05), batches, closure)
    opt = ProxOptimizer(torch.optim.Adam(wrapped.parameters(), lr=0.05), [
        ParamGroupSpec.output_channels(wrapped[0], wrapped[1]),
        ParamGroupSpec.elementwise([wrapped[3].weight])], lam=0.0)
    train_steps(wrapped, opt, batches, closure)
    assert all(torch.equal(a, b) for a, b in zip(bits(plain), bits(wrapped)))
    # and a positive strength does change them (the comparison above can fail)
    pruned = small_net(0)
    opt = ProxOptimizer(torch.optim.Adam(pruned.parameters(), lr=0.05),
                        ParamGroupSpec.output_channels(pruned[0], pruned[1]), lam=5.0)
    train_steps(pruned, opt, batches, closure)
    zero_channels = (pruned[0].weight.abs().sum(1) + pruned[1].weight.abs()
                     + pruned[1].bias.abs() + pruned[0].bias.abs()) == 0
    assert zero_channels.any()


@needs_torch
def test_lr_scheduler_on_the_wrapper_drives_the_threshold():
    w = torch.nn.Parameter(torch.ones(4, 3, dtype=torch.float64))
    opt = ProxOptimizer(torch.optim.SGD([w], lr=1.0), ParamGroupSpec.aligned([(w, 0)]),
                        lam=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    norms = [np.sqrt(3.0)]
    for _ in range(3):
        w.grad = torch.zeros_like(w)
        opt.step()
        scheduler.step()
        norms.append(float(w[0].detach().norm()))
    # lr 1, 0.5, 0.25: each prox removes lr * lam from the row norm
    assert np.allclose(np.diff(norms), [-0.1, -0.05, -0.025], atol=1e-12)
    assert opt.param_groups is opt.optimizer.param_groups


@needs_torch
def test_state_dict_round_trip():
    batches = make_batches(1, n_batches=8)
    net = small_net(1)
    spec = ParamGroupSpec.output_channels(net[0], net[1])
    lam = torch.linspace(0.0, 0.2, 8, dtype=torch.float32)
    opt = ProxOptimizer(torch.optim.Adam(net.parameters(), lr=0.02),
                        {"spec": spec, "lam": lam, "step": 0.03})
    train_steps(net, opt, batches[:4])
    saved_net = copy.deepcopy(net.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    train_steps(net, opt, batches[4:])

    other = small_net(99)
    other.load_state_dict(saved_net)
    restored = ProxOptimizer(torch.optim.Adam(other.parameters(), lr=0.5),
                             ParamGroupSpec.output_channels(other[0], other[1]), lam=3.0)
    restored.load_state_dict(saved_opt)
    assert torch.equal(restored.prox_groups[0]["lam"], lam)
    assert restored.prox_groups[0]["step"] == 0.03
    assert restored.param_groups[0]["lr"] == 0.02
    train_steps(other, restored, batches[4:])
    assert all(torch.equal(a, b) for a, b in zip(bits(net), bits(other)))

    mismatched = ProxOptimizer(torch.optim.Adam(other.parameters(), lr=0.02),
                               ParamGroupSpec.elementwise([other[3].bias]))
    with pytest.raises(ValueError, match="groups"):
        mismatched.load_state_dict(saved_opt)


@needs_torch
def test_spec_rejects_overlapping_or_foreign_slices():
    w = torch.nn.Parameter(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="disjoint"):
        ParamGroupSpec([[(w, 0, 1)], [(w, 0, 1)]])
    with pytest.raises(ValueError, match="two different dims"):
        ParamGroupSpec([[(w, 0, 1)], [(w, 1, 2)]])
    with pytest.raises(ValueError, match="out of range"):
        ParamGroupSpec([[(w, 0, 4)]])
    other = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="does not optimize"):
        ProxOptimizer(torch.optim.SGD([w], lr=0.1), ParamGroupSpec.elementwise([other]))
