"""SGR, successive gradient reconciliation (asyncopt.deep.sgr; METHODS card "SGR"):
the ETF identities, L^SGR against a NumPy reference and its zeros, gradcheck of the double
backward in float64, oracle heads reproducing global BP gradients (and L^SGR = 0),
gradient isolation, the stored gradient of every module, the three local modes,
saved-activation bytes (exact small cases; global BP grows by one activation per module,
SGR does not, and is below it from K = 4), and the mpirun pipeline equal to the in-process
run."""
import copy
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from asyncopt.deep.ato import accuracy, digits_train_test  # noqa: E402
from asyncopt.deep.federated import ParameterVector  # noqa: E402
from asyncopt.deep.sgr import (ETFClassifier, LocalNet, SavedTensorMeter,  # noqa: E402
                               SGRTrainer, etf_matrix, local_objective, peak_saved_bytes,
                               plain_net, sgr_loss, split_sequential, train_local)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
SCRIPT = os.path.join(os.path.dirname(__file__), "mpi", "sgr_pipeline.py")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: one thread is faster on a shared machine, and the pipeline's ranks use
    one (same kernels, same bits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits():
    return digits_train_test()


def batch(n=16, d=8, n_classes=4, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=gen, dtype=dtype),
            torch.randint(0, n_classes, (n,), generator=gen))


def reference_sgr(a, b):
    """NumPy: mean over all entries of (a_i/||a_i|| - b_i/||b_i||)^2."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    a_hat = a / np.linalg.norm(a, axis=1, keepdims=True)
    b_hat = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.mean((a_hat - b_hat) ** 2))


# ------------------------------------------------------------------------------ ETF

@pytest.mark.parametrize("d, C", [(10, 10), (128, 10), (7, 3)])
def test_etf_identities(d, C):
    M = etf_matrix(d, C, seed=3, dtype=torch.float64).numpy()
    centering = np.eye(C) - np.ones((C, C)) / C
    assert M.shape == (d, C)
    assert np.allclose(M.T @ M, C / (C - 1) * centering, atol=1e-12)
    assert np.allclose(np.linalg.norm(M, axis=0), 1.0, atol=1e-12)
    off = (M.T @ M)[~np.eye(C, dtype=bool)]
    assert np.allclose(off, -1.0 / (C - 1), atol=1e-12)
    assert np.allclose(M.sum(axis=1), 0.0, atol=1e-12)
    assert np.linalg.matrix_rank(M) == C - 1


def test_etf_head_is_fixed_and_rejects_too_few_features(digits):
    with pytest.raises(ValueError):
        etf_matrix(5, 10)
    net = plain_net(3, width=32, head="etf", seed=0)
    assert all(isinstance(s.head, ETFClassifier) and not list(s.head.parameters())
               for s in net.stages)
    before = [s.head.weight.clone() for s in net.stages]
    X, y, _, _ = digits
    train_local(net, X[:256], y[:256], mode="sgr", epochs=1, lr=0.02)
    assert all(torch.equal(b, s.head.weight) for b, s in zip(before, net.stages))


# ------------------------------------------------------------------------------ the loss

def test_sgr_loss_matches_numpy_and_its_zeros():
    a, _ = batch(n=6, d=5, seed=1)
    b, _ = batch(n=6, d=5, seed=2)
    assert float(sgr_loss(a, b)) == pytest.approx(reference_sgr(a, b), rel=1e-12)
    assert float(sgr_loss(a, a)) == 0.0
    assert float(sgr_loss(a, 3.5 * a)) == pytest.approx(0.0, abs=1e-15)
    assert float(sgr_loss(a, -a)) == pytest.approx(4.0 / 5, rel=1e-12)   # 4 / D
    images = torch.randn(4, 2, 3, 3, dtype=torch.float64)      # rows are flattened
    other = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    assert float(sgr_loss(images, other)) == pytest.approx(reference_sgr(images, other),
                                                           rel=1e-12)


def test_sgr_loss_gradient_gradcheck():
    a, _ = batch(n=5, d=7, seed=3)
    b, _ = batch(n=5, d=7, seed=4)
    a.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: sgr_loss(t, b), (a,))
    # the autograd form of Algorithm 1 (F.normalize + MSE) gives the same gradient
    ref = torch.autograd.grad(F.mse_loss(F.normalize(a, dim=1), F.normalize(b, dim=1)), a)[0]
    assert torch.allclose(torch.autograd.grad(sgr_loss(a, b), a)[0], ref, atol=1e-15)


def smooth_module(d_in=6, width=5, n_classes=4, seed=0):
    torch.manual_seed(seed)
    return LocalNet.from_blocks([nn.Sequential(nn.Linear(d_in, width), nn.Tanh())],
                                [nn.Linear(width, n_classes)]).double().stages[0]


def test_double_backward_gradcheck_and_closed_form():
    stage = smooth_module()
    x, y = batch(n=9, d=6, seed=5)
    delta_pre, _ = batch(n=9, d=6, seed=6)
    names = [n for n, _ in stage.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in stage.parameters()]

    def reconciliation(*values):
        return local_objective(stage, x, y, delta_pre, store_gradient=False,
                               create_graph=True, params=dict(zip(names, values))).sgr

    # independent closed form of dL/dx for Linear -> tanh -> Linear -> CE
    W, b, V, c = (p.detach() for p in params)
    z = x @ W.T + b
    p = torch.softmax(torch.tanh(z) @ V.T + c, dim=1)
    g_logits = (p - F.one_hot(y, 4)) / len(y)
    delta_now = ((g_logits @ V) * (1 - torch.tanh(z) ** 2)) @ W
    value = float(reconciliation(*params).detach())
    assert value == pytest.approx(reference_sgr(delta_now, delta_pre), rel=1e-10)
    assert torch.autograd.gradcheck(reconciliation, tuple(params))


# ------------------------------------------------------------------------------ oracle heads

def with_oracle_heads(net):
    """head_k = frozen copies of blocks k+1..K and the last head, so L_k = the global loss."""
    stages = []
    for k, stage in enumerate(net.stages):
        if k < len(net) - 1:
            tail = [copy.deepcopy(s.block) for s in net.stages[k + 1:]]
            head = nn.Sequential(*tail, copy.deepcopy(net.stages[-1].head)).requires_grad_(False)
        else:
            head = stage.head
        stages.append((stage.block, head))
    return LocalNet.from_blocks(*zip(*stages))


def test_oracle_heads_give_global_bp_gradients_and_zero_sgr():
    K = 4
    net = plain_net(K, in_dim=8, width=12, n_classes=4, seed=1).double()
    x, y = batch(n=20, d=8, seed=7)
    reference = copy.deepcopy(net)                      # global BP on the same values
    h, hidden = x, []
    for stage in reference.stages:
        h = stage.block(h)
        h.retain_grad()
        hidden.append(h)
    F.cross_entropy(reference.stages[-1].head(h), y).backward()

    oracle = with_oracle_heads(net)
    trainer = SGRTrainer(oracle, mode="sgr", lam=1.0, lr=0.0)
    h, delta = x, None
    for k in range(K):
        h, delta = trainer.module_step(k, h, y, delta)
        if k < K - 1:                                   # the stored gradient is dL/dx_k
            assert torch.allclose(delta, hidden[k].grad, rtol=1e-10, atol=1e-14)
    for k in range(K):
        for p, q in zip(oracle.stages[k].block.parameters(),
                        reference.stages[k].block.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-9, atol=1e-14)
    sgr = trainer.end_epoch()["sgr_loss"]
    assert sgr[0] is None and max(sgr[1:]) < 1e-20


# ------------------------------------------------------------------------------ local steps

def test_gradient_isolation():
    net = plain_net(3, in_dim=8, width=12, n_classes=4, seed=2).double()
    x, y = batch(n=16, d=8, seed=8)
    for mode in ("sgr", "layerwise", "reforward"):
        trainer = SGRTrainer(net, mode=mode, lr=0.1)
        x1 = net.stages[0].block(x)                         # attached to module 1's graph
        delta = torch.autograd.grad(F.cross_entropy(net.stages[0].head(x1), y), x1,
                                    retain_graph=True)[0]
        for p in net.parameters():
            p.grad = None
        trainer.module_step(1, x1, y, delta)
        assert all(p.grad is None for p in net.stages[0].parameters())
        assert all(p.grad is not None for p in net.stages[1].parameters())
        assert all(p.grad is None for p in net.stages[2].parameters())


def test_every_module_stores_its_own_gradient_before_its_update():
    net = plain_net(4, in_dim=8, width=12, n_classes=4, seed=3).double()
    x, y = batch(n=16, d=8, seed=9)
    trainer = SGRTrainer(net, mode="sgr", lr=0.5)
    h, delta = x, None
    for k in range(4):
        before = copy.deepcopy(net.stages[k])
        expected_out = before.block(h)
        expected = torch.autograd.grad(F.cross_entropy(before.head(expected_out), y),
                                       expected_out)[0]
        h_next, delta = trainer.module_step(k, h, y, delta)
        assert torch.allclose(h_next, expected_out)             # pre-update output
        if k < 3:
            assert torch.allclose(delta, expected, rtol=1e-12, atol=1e-15)
        else:
            assert delta is None
        h = h_next


def test_reforward_passes_the_updated_output():
    net = plain_net(2, in_dim=8, width=12, n_classes=4, seed=4).double()
    x, y = batch(n=16, d=8, seed=10)
    trainer = SGRTrainer(net, mode="reforward", lr=0.5)
    before = net.stages[0].block(x).detach()
    out, _ = trainer.module_step(0, x, y)
    assert torch.allclose(out, net.stages[0].block(x))
    assert not torch.allclose(out, before)


def test_layerwise_is_sgr_with_lam_zero(digits):
    X, y, _, _ = digits
    runs = {}
    for mode, lam in (("layerwise", 1.0), ("sgr", 0.0), ("sgr", 1.0)):
        net = plain_net(3, width=32, seed=0)
        result = train_local(net, X[:320], y[:320], mode=mode, lam=lam, epochs=1, lr=0.05)
        runs[mode, lam] = (ParameterVector(net).get(), result)
    assert np.array_equal(runs["layerwise", 1.0][0], runs["sgr", 0.0][0])
    assert not np.allclose(runs["layerwise", 1.0][0], runs["sgr", 1.0][0])
    history = runs["layerwise", 1.0][1].history           # measured, not optimised
    assert history[0]["sgr_loss"][0] is None and all(v > 0 for v in history[0]["sgr_loss"][1:])


def test_sgr_learns_digits(digits):
    X, y, Xte, yte = digits
    net = plain_net(3, seed=0)
    result = train_local(net, X, y, mode="sgr", epochs=3, lr=0.05)
    assert accuracy(net, Xte, yte) > 0.9
    assert len(result.history) == 3 and np.isfinite(result.mean_sgr_loss)


def test_split_sequential_keeps_the_function():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(5, 6)
    for boundaries in (3, [2, 4], [1]):
        blocks = split_sequential(model, boundaries)
        h = x
        for block in blocks:
            h = block(h)
        assert torch.equal(h, model(x))
    assert [len(b) for b in split_sequential(model, 3)] == [2, 2, 2]
    with pytest.raises(ValueError):
        split_sequential(model, [2, 2])


# ------------------------------------------------------------------------------ memory

def test_saved_tensor_meter_exact_counts():
    a = torch.randn(10, 3, requires_grad=True)
    b = torch.randn(10, 3, requires_grad=True)
    with SavedTensorMeter() as meter:
        loss = (a * b).sum()
    assert meter.peak == meter.current == a.nbytes + b.nbytes
    loss.backward()
    assert meter.current == 0
    with SavedTensorMeter() as meter:                       # one storage saved twice
        (a * a).sum().backward()
    assert meter.peak == a.nbytes
    linear = nn.Linear(3, 4)
    x = torch.randn(10, 3)
    with SavedTensorMeter(exclude=linear.parameters()) as meter:
        linear(x).sum().backward()
    assert meter.peak == x.nbytes                           # the weight is not counted


def test_saved_bytes_global_bp_grows_per_module_sgr_does_not(digits):
    X, y, _, _ = digits
    n, width = 64, 128
    peaks = {K: {m: peak_saved_bytes(plain_net(K, width=width, seed=0), X[:n], y[:n], m)
                 for m in ("global_bp", "layerwise", "sgr")} for K in (2, 3, 4, 6)}
    for K in (3, 4, 6):
        # global BP: one more ReLU output (n x width float32) per module; SGR: constant
        assert peaks[K]["global_bp"] - peaks[2]["global_bp"] == (K - 2) * n * width * 4
        assert peaks[K]["sgr"] == peaks[2]["sgr"]
        assert peaks[K]["layerwise"] == peaks[2]["layerwise"]
    assert peaks[2]["sgr"] > peaks[2]["global_bp"]
    for K in (4, 6):
        assert peaks[K]["layerwise"] < peaks[K]["sgr"] < peaks[K]["global_bp"]


# ------------------------------------------------------------------------------ the pipeline

def load_script():
    spec = importlib.util.spec_from_file_location("sgr_pipeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_mpi(tmp_path, scenario):
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, SCRIPT, str(out), scenario],
                          env=env, capture_output=True, text=True, timeout=180)
    return proc, out




@pytest.mark.mpi
def test_pipeline_over_mpirun_equals_the_in_process_run(tmp_path):
    proc, out = run_mpi(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr[-2000:]
    mpi = json.loads(out.read_text())
    script = load_script()
    net, X, y = script.build()
    local = train_local(net, X, y, **script.KWARGS)       # one thread, as on the ranks
    vector = ParameterVector(net).get()
    assert np.allclose(np.array(mpi["vector"], dtype=np.float32), vector, rtol=0, atol=1e-6)
    assert not np.allclose(vector, ParameterVector(script.build()[0]).get())
    assert mpi["history"] == local.history
    # rank 0 broadcasts [n, batches] (int64) to the other 2 ranks, then sends, per batch,
    # one header and [labels, activations, stored gradient]
    n, batches = len(X), -(-len(X) // script.KWARGS["batch_size"])
    assert mpi["wire_bytes_sent"] == (2 * 16 + batches * 8 * 8
                                      + 4 * (n + 2 * n * script.WIDTH))


@pytest.mark.mpi
def test_pipeline_error_on_one_rank_aborts_all_with_one_message(tmp_path):
    proc, out = run_mpi(tmp_path, "fail")
    assert proc.returncode != 0
    assert proc.stderr.count("failed, aborting all ranks") == 1
    assert "rank 1 of 3 failed" in proc.stderr and "shapes cannot be multiplied" in proc.stderr
    assert not out.exists()
