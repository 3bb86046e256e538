"""Multi-LoRA (paper 003, METHODS card "Multi-LoRA"): exact parameter counts, every task
starting at W0, task switching, the least-squares closed form reached by gradient descent
with the shared factor frozen, the server's shared gradient as the sum of the task
gradients, and the global Hessian's lambda_min >= alpha (against the paper's appendix)."""
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

from asyncopt.deep import ParameterVector  # noqa: E402
from asyncopt.deep.lora import attach_lora  # noqa: E402
from asyncopt.deep.multilora import (ROBERTA_BASE, MultiLoRALinear,  # noqa: E402
                                     adapter_parameter_count, adapter_parameter_formula,
                                     attach_multilora, global_loss, multilora_layers,
                                     multitask_regression, roberta_base_adapter_counts,
                                     set_active_task, shared_parameters, task_context,
                                     task_parameters, train_multilora)
from asyncopt.deep.transformer import bert_encoder, tiny_encoder  # noqa: E402

torch.set_num_threads(1)


def linear_layer(d, m, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return nn.Linear(d, m, dtype=dtype)


def randomise_task_factors(layer, seed=1, std=0.3):
    """Non-zero per-task factors (they start at zero), drawn from their own generator."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for task in range(layer.n_tasks):
            for p in layer.task_parameters(task):
                p.copy_(std * torch.randn(p.shape, generator=g, dtype=p.dtype))


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


# --------------------------------------------------------------------------- counts

def test_roberta_base_counts_are_the_papers():
    counts = roberta_base_adapter_counts(r=8, n_tasks=8, targets=("q", "v"))
    assert counts["lora"] == 2_359_296
    assert counts["multilora"] == 1_327_104
    assert counts["multilora_output"] == 1_327_104        # d = m: same count either side
    assert counts["ratio"] == pytest.approx((1 + 8) / (2 * 8), abs=1e-15)
    shapes = [(768, 768)] * 24                           # q and v of 12 layers
    assert adapter_parameter_formula(shapes, 8, 8, shared=None) == counts["lora"]
    assert adapter_parameter_formula(shapes, 8, 8, shared="input") == counts["multilora"]
    # k independent LoRAs built by the existing single-task LoRA code
    with torch.device("meta"):
        single = bert_encoder(**ROBERTA_BASE)
        attach_lora(single, targets=("q", "v"), r=8)
    assert 8 * adapter_parameter_count(single) == counts["lora"]


@pytest.mark.parametrize("n_tasks", [1, 2, 5, 8])
@pytest.mark.parametrize("shared", ["input", "output", None])
def test_counts_of_built_layers_match_the_formula(n_tasks, shared):
    shapes = [(12, 7), (7, 12), (9, 9)]                  # (d, m) per layer, d != m too
    model = nn.Sequential(*(nn.Linear(d, m) for d, m in shapes))
    layers = [MultiLoRALinear(layer, r=3, n_tasks=n_tasks, shared=shared) for layer in model]
    built = sum(adapter_parameter_count(layer) for layer in layers)
    assert built == adapter_parameter_formula(shapes, 3, n_tasks, shared=shared)
    by_hand = {"input": sum(d * 3 + n_tasks * 3 * m for d, m in shapes),
               "output": sum(m * 3 + n_tasks * 3 * d for d, m in shapes),
               None: sum(n_tasks * 3 * (d + m) for d, m in shapes)}[shared]
    assert built == by_hand


@pytest.mark.parametrize("n_tasks", [1, 3, 8, 50])
def test_ratio_is_one_plus_k_over_two_k_for_square_layers(n_tasks):
    layer = nn.Linear(16, 16)
    lora = adapter_parameter_count(MultiLoRALinear(layer, r=4, n_tasks=n_tasks, shared=None))
    multi = adapter_parameter_count(MultiLoRALinear(layer, r=4, n_tasks=n_tasks))
    assert multi / lora == pytest.approx((1 + n_tasks) / (2 * n_tasks), abs=1e-15)


# --------------------------------------------------------------------------- forward

@pytest.mark.parametrize("shared", ["input", "output", None])
def test_every_task_starts_at_the_base_model(shared):
    torch.manual_seed(0)
    model = tiny_encoder(d_model=16, n_heads=2, d_ff=32, n_layers=2, n_classes=3, seed=0)
    base = copy.deepcopy(model).eval()
    x = torch.randn(5, 64)
    wrapped = attach_multilora(model, 4, r=2, shared=shared, shared_init="gaussian")
    assert wrapped == ["layers.0.attn.q", "layers.0.attn.v", "layers.1.attn.q",
                       "layers.1.attn.v"]
    model.eval()
    expected = base(x)
    for task in range(4):
        set_active_task(model, task)
        assert torch.equal(model(x), expected)


@pytest.mark.parametrize("shared", ["input", "output", None])
def test_forward_is_the_task_formula_and_switching_touches_one_path(shared):
    base = linear_layer(6, 5)
    layer = MultiLoRALinear(base, r=2, n_tasks=3, alpha=3.0, shared=shared)
    randomise_task_factors(layer)
    x = torch.randn(4, 6, dtype=torch.float64)
    W0, b = base.weight.detach().clone(), base.bias.detach().clone()
    outputs = []
    for task in range(3):
        A, B = layer.factors(task)
        reference = x @ W0.T + b + 1.5 * (x @ A.detach().T) @ B.detach().T
        with task_context(layer, task):
            out = layer(x)
        torch.testing.assert_close(out, reference, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(layer.merged_weight(task), W0 + 1.5 * B @ A,
                                   rtol=1e-12, atol=1e-12)
        outputs.append(out.detach())
    assert not torch.allclose(outputs[0], outputs[1])
    with torch.no_grad():                        # change task 1's own factor(s) only
        for p in layer.task_parameters(1):
            p.add_(1.0)
    for task in range(3):
        with task_context(layer, task):
            out = layer(x).detach()
        assert torch.equal(out, outputs[task]) == (task != 1)


def test_active_task_is_required_and_restored():
    layer = MultiLoRALinear(nn.Linear(4, 3), r=2, n_tasks=2)
    with pytest.raises(RuntimeError, match="active task"):
        layer(torch.randn(1, 4))
    set_active_task(layer, 1)
    with task_context(layer, 0):
        assert layer.active_task == 0
    assert layer.active_task == 1
    with pytest.raises(IndexError):
        set_active_task(layer, 2)


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError):
        MultiLoRALinear(nn.Linear(4, 3), shared="both")
    with pytest.raises(ValueError):
        MultiLoRALinear(nn.Linear(4, 3), shared_init="uniform")
    with pytest.raises(TypeError):
        MultiLoRALinear(nn.Conv1d(4, 3, 1))
    with pytest.raises(ValueError):
        attach_multilora(nn.Sequential(nn.Linear(4, 3)), 2, targets=("q",))


def test_shared_inits():
    base = nn.Linear(16, 12)
    torch.manual_seed(0)
    A = MultiLoRALinear(base, r=4, shared_init="orthogonal").lora_A.detach()
    torch.testing.assert_close(A @ A.T, torch.eye(4), rtol=0, atol=1e-5)
    B = MultiLoRALinear(base, r=4, shared="output", shared_init="orthogonal").lora_B.detach()
    torch.testing.assert_close(B.T @ B, torch.eye(4), rtol=0, atol=1e-5)
    gaussian = MultiLoRALinear(nn.Linear(400, 3), r=50, shared_init="gaussian").lora_A
    assert abs(gaussian.std().item() - 1.0) < 0.05        # Algorithm 1: N(0, 1)
    kaiming = MultiLoRALinear(nn.Linear(400, 3), r=50).lora_A
    assert kaiming.abs().max().item() <= 400 ** -0.5      # PEFT: U(-1/sqrt(d), 1/sqrt(d))
    custom = MultiLoRALinear(base, r=4, shared_init=lambda t: t.fill_(0.5)).lora_A
    assert torch.equal(custom, torch.full((4, 16), 0.5))


# --------------------------------------------------------------------------- training

def regression_setup(shared, train_shared, d=32, m=32, r=4, k=8, n=96, seed=0, **noise):
    """A float64 Multi-LoRA layer on the multi-task regression and its task losses
    (mean squared error over the n m entries)."""
    data = multitask_regression(n_tasks=k, d=d, m=m, r=r, n_train=n, n_val=1, n_test=1,
                                seed=seed, dtype=torch.float64, **noise)
    base = nn.Linear(d, m, dtype=torch.float64)
    with torch.no_grad():
        base.weight.copy_(data["W0"])
        base.bias.copy_(data["b0"])
    torch.manual_seed(seed)
    layer = MultiLoRALinear(base, r=r, n_tasks=k, alpha=2.0 * r, shared=shared,
                            shared_init="orthogonal", train_shared=train_shared)

    def loss(model, task, step):
        return F.mse_loss(model(data["X_train"][task]), data["Y_train"][task])
    return layer, data, loss


def least_squares_reference(layer, data, task):
    """Task ``task``'s optimal own factor with the shared one fixed, by numpy lstsq:
    min_B ||R - s Z B^T|| with Z = X A^T (shared input), or, shared output, min_A
    ||R - s X A^T B^T|| through vec(X M B^T) = (B kron X) vec(M), column-major vec."""
    X = data["X_train"][task].numpy()
    R = (data["Y_train"][task] - data["X_train"][task] @ data["W0"].T - data["b0"]).numpy()
    s = layer.scale
    if layer.shared == "input":
        Z = s * X @ layer.lora_A.detach().numpy().T
        return np.linalg.lstsq(Z, R, rcond=None)[0].T
    B = layer.lora_B.detach().numpy()
    M = np.linalg.lstsq(s * np.kron(B, X), R.reshape(-1, order="F"), rcond=None)[0]
    return M.reshape(X.shape[1], B.shape[1], order="F").T


def gradient_lipschitz(layer, data, task):
    """The largest Hessian eigenvalue of task ``task``'s MSE in its own factor."""
    X = data["X_train"][task].numpy()
    n, m = X.shape[0], layer.base.out_features
    c = 2 * layer.scale ** 2 / (n * m)
    if layer.shared == "input":
        Z = X @ layer.lora_A.detach().numpy().T
        return c * np.linalg.eigvalsh(Z.T @ Z)[-1]
    B = layer.lora_B.detach().numpy()
    return c * np.linalg.eigvalsh(X.T @ X)[-1] * np.linalg.eigvalsh(B.T @ B)[-1]


@pytest.mark.parametrize("shared", ["input", "output"])
def test_frozen_shared_gradient_descent_reaches_the_least_squares_solution(shared):
    layer, data, loss = regression_setup(shared, train_shared=False)
    k = layer.n_tasks
    weight0, bias0 = layer.base.weight.clone(), layer.base.bias.clone()
    shared0 = [p.detach().clone() for p in layer.shared_parameters()]
    references = [least_squares_reference(layer, data, i) for i in range(k)]
    # One step size for every worker: 1 / max_i L_i (gradient descent converges for each)
    lr = 1.0 / max(gradient_lipschitz(layer, data, i) for i in range(k))
    result = train_multilora(layer, loss, k, 600, lr=lr)
    for task, reference in enumerate(references):
        (own,) = layer.task_parameters(task)
        np.testing.assert_allclose(own.detach().numpy(), reference, rtol=1e-9, atol=1e-10)
    assert torch.equal(layer.base.weight, weight0) and torch.equal(layer.base.bias, bias0)
    assert all(torch.equal(p, q) for p, q in zip(layer.shared_parameters(), shared0))
    # frozen: the shared factor goes down once, nothing comes back
    p_shared = shared0[0].numel()
    assert result.shared_size == p_shared
    assert result.history[0]["bytes_sent"] == 4 * k * p_shared
    assert all(h["bytes_sent"] == 0 for h in result.history[1:])
    assert result.bytes_received == 0 and result.vector.size == 0


def test_shared_gradient_is_the_sum_of_the_task_gradients():
    layer, data, loss = regression_setup("input", train_shared=True, d=10, m=7, r=3, k=4,
                                         n=20)
    randomise_task_factors(layer, seed=5)
    A0 = layer.lora_A.detach().clone()
    B0 = [b.detach().clone() for b in layer.lora_B]
    # independent reference: the closed-form gradients of L_i = ||P_i - Y_i||^2 / (n m)
    s, n, m = layer.scale, 20, 7
    W0, b0 = data["W0"], data["b0"]
    grad_A, grad_B = torch.zeros_like(A0), []
    for task in range(4):
        X, Y = data["X_train"][task], data["Y_train"][task]
        E = 2 * (X @ W0.T + b0 + s * (X @ A0.T) @ B0[task].T - Y) / (n * m)
        grad_A += s * B0[task].T @ E.T @ X
        grad_B.append(s * E.T @ X @ A0.T)
    # ... and autograd of the summed (global) loss
    auto_A = torch.autograd.grad(global_loss(layer, loss, 4), [layer.lora_A])[0]
    torch.testing.assert_close(auto_A, grad_A, rtol=1e-10, atol=1e-12)
    lr = 0.1
    result = train_multilora(layer, loss, 4, 1, lr=lr)
    torch.testing.assert_close(layer.lora_A.detach(), A0 - lr * grad_A, rtol=1e-12,
                               atol=1e-13)
    for task in range(4):
        torch.testing.assert_close(layer.lora_B[task].detach(), B0[task] - lr * grad_B[task],
                                   rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(result.vector,
                                  layer.lora_A.detach().reshape(-1).float().numpy())
    # trained: the shared factor goes down to and comes back from each of the 4 workers
    assert result.history[0]["bytes_sent"] == result.history[0]["bytes_received"] \
        == 4 * 4 * A0.numel()


@pytest.mark.parametrize("train_shared", [False, True])
def test_training_moves_only_what_trains(train_shared):
    layer, data, loss = regression_setup("input", train_shared=train_shared, d=8, m=6,
                                         r=2, k=3, n=16)
    weight0, bias0 = layer.base.weight.clone(), layer.base.bias.clone()
    A0 = layer.lora_A.detach().clone()
    result = train_multilora(layer, loss, 3, 20,
                             make_optimizer=lambda p: torch.optim.Adam(p, lr=0.05),
                             evaluate=lambda model: model.lora_B[0].abs().sum().item(),
                             eval_every=8)
    assert [h["step"] for h in result.history if "metric" in h] == [7, 15, 19]
    assert result.history[-1]["metric"] == layer.lora_B[0].abs().sum().item()
    assert torch.equal(layer.base.weight, weight0) and torch.equal(layer.base.bias, bias0)
    assert torch.equal(layer.lora_A.detach(), A0) != train_shared
    assert all(b.abs().sum() > 0 for b in layer.lora_B)
    first, last = result.history[0]["losses"], result.history[-1]["losses"]
    assert all(b < a for a, b in zip(first, last))


def test_transformer_with_task_heads_trains_as_server_and_workers():
    torch.manual_seed(0)
    model = tiny_encoder(d_model=16, n_heads=2, d_ff=32, n_layers=2, n_classes=3, seed=0)
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    attach_multilora(model, 2, r=2, train_shared=True)
    shared = shared_parameters(model)
    assert [p.shape for p in shared] == [torch.Size([2, 16])] * 4     # A of q, v x 2 layers
    own = [task_parameters(model, i) for i in range(2)]
    # B of q, v x 2 layers, then the task's head (weight, bias)
    assert [tuple(p.shape) for p in own[0]] == [(16, 2)] * 4 + [(3, 16), (3,)]
    assert not {id(p) for p in own[0]} & {id(p) for p in own[1]}
    trainable = ParameterVector(model, buffers=False, trainable_only=True).size
    assert trainable == sum(p.numel() for p in shared + own[0] + own[1])
    g = torch.Generator().manual_seed(1)
    X = torch.randn(2, 12, 64, generator=g)
    y = torch.randint(0, 3, (2, 12), generator=g)

    def loss(model, task, step):
        return F.cross_entropy(model(X[task]), y[task])
    heads0 = [copy.deepcopy(h) for h in model.head.heads]
    train_multilora(model, loss, 2, 5, make_optimizer=lambda p: torch.optim.Adam(p, lr=0.01))
    state = model.state_dict()
    for name, value in frozen.items():
        if not name.startswith("head."):
            key = name.replace(".q.", ".q.base.").replace(".v.", ".v.base.")
            assert torch.equal(state[key], value), name
    for task in range(2):
        assert not torch.equal(model.head.heads[task].weight, heads0[task].weight)
    assert all(not torch.equal(layer.lora_B[0], layer.lora_B[1])
               for layer in multilora_layers(model).values())


# --------------------------------------------------------------------------- Hessian

def test_frozen_global_hessian_is_block_diagonal_with_the_task_minimum():
    """Shared factor frozen: the Hessian of sum_i L_i in (B_1, ..., B_k) is block diagonal,
    block i = (2 s^2 / (n m)) (Z_i^T Z_i kron I_m) (computed here by hand), so lambda_min is
    the smallest task's alpha_i."""
    layer, data, loss = regression_setup("input", train_shared=False, d=6, m=3, r=2, k=3,
                                         n=10)
    k, r, m = 3, 2, 3
    names = [f"lora_B.{i}" for i in range(k)]

    def global_of(vector):
        params = dict(zip(names, vector.view(k, m, r)))

        def functional(model, task, step):
            out = torch.func.functional_call(model, params, (data["X_train"][task],))
            return F.mse_loss(out, data["Y_train"][task])
        return global_loss(layer, functional, k)
    hessian = torch.autograd.functional.hessian(global_of, torch.zeros(k * m * r,
                                                                       dtype=torch.float64))
    alphas = []
    for task in range(k):
        Z = (data["X_train"][task] @ layer.lora_A.detach().T).numpy()
        block = 2 * layer.scale ** 2 / (10 * m) * np.kron(np.eye(m), Z.T @ Z)   # row-major B
        sl = slice(task * m * r, (task + 1) * m * r)
        np.testing.assert_allclose(hessian[sl, sl].numpy(), block, rtol=1e-10, atol=1e-12)
        alphas.append(np.linalg.eigvalsh(block)[0])
        off = np.delete(hessian[sl].numpy(), np.r_[sl], axis=1)
        assert np.all(off == 0)
    assert np.linalg.eigvalsh(hessian.numpy())[0] == pytest.approx(min(alphas), rel=1e-10)


def test_joint_global_hessian_lambda_min_is_at_least_alpha():
    """Shared factor trained, each L_i = MSE_i + rho/2 (||A||^2 + ||B_i||^2), near a good
    fit (where each L_i is strongly convex; the bilinear B_i A makes it non-convex far
    from one): the global Hessian in (A, B_1..B_k) assembles from the task Hessians
    (H_00 = sum_i H_00^i, H_0i = H_0i^i, H_ij = 0), and lambda_min >= alpha = min_i
    lambda_min(H^i) (module docstring), not only alpha / 2 as Lemma 4.8 states under an
    extra assumption."""
    layer, data, loss = regression_setup("input", train_shared=True, d=4, m=3, r=2, k=3,
                                         n=12, noise=0.01, weight_noise=0.0)
    k, r, d, m, rho = 3, 2, 4, 3, 0.2
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():                         # the true factors, perturbed
        layer.lora_A.copy_(data["A_true"] + 0.01 * torch.randn(r, d, generator=g,
                                                               dtype=torch.float64))
        for B, B_true in zip(layer.lora_B, data["B_true"]):
            B.copy_(B_true / layer.scale)
    nA, nB = r * d, m * r
    point = flat([layer.lora_A.detach()] + [b.detach() for b in layer.lora_B])

    def params_of(vector):
        A, Bs = vector[:nA].view(r, d), vector[nA:].view(k, m, r)
        return {"lora_A": A, **{f"lora_B.{i}": Bs[i] for i in range(k)}}

    def task_term(params, task):
        out = torch.func.functional_call(layer, params, (data["X_train"][task],))
        ridge = params["lora_A"].square().sum() + params[f"lora_B.{task}"].square().sum()
        return F.mse_loss(out, data["Y_train"][task]) + 0.5 * rho * ridge

    def global_of(vector):
        params = params_of(vector)
        return global_loss(layer, lambda model, task, step: task_term(params, task), k)
    hessian = torch.autograd.functional.hessian(global_of, point).numpy()
    assembled = np.zeros_like(hessian)
    alphas = []
    for task in range(k):
        own = np.r_[np.arange(nA), nA + task * nB + np.arange(nB)]

        def task_of(sub, task=task, own=own):
            vector = point.clone()
            vector[torch.as_tensor(own)] = sub
            return global_loss(layer, lambda model, i, step: task_term(params_of(vector), i)
                               if i == task else 0.0, k)
        H_task = torch.autograd.functional.hessian(task_of, point[own]).numpy()
        alphas.append(np.linalg.eigvalsh(H_task)[0])
        assembled[np.ix_(own, own)] += H_task
    np.testing.assert_allclose(hessian, assembled, rtol=1e-10, atol=1e-12)
    alpha = min(alphas)
    assert alpha > 0                              # the premise: each L_i strongly convex
    assert np.linalg.eigvalsh(hessian)[0] >= alpha - 1e-12


@pytest.mark.parametrize("k", [3, 8])
def test_papers_appendix_matrix_is_no_global_hessian(k):
    """Task losses with Hessian [[4, -3], [-3, 4]] in (x, y_i) (alpha = 1, scalar x, y_i):
    the global Hessian has 4k at (0, 0), not 4 as in the appendix's H, and lambda_min >= 1,
    while the appendix's H is indefinite for k >= 3."""
    H_task = torch.tensor([[4.0, -3.0], [-3.0, 4.0]], dtype=torch.float64)

    def global_of(z):
        return sum(0.5 * torch.stack([z[0], z[i]]) @ H_task @ torch.stack([z[0], z[i]])
                   for i in range(1, k + 1))
    H = torch.autograd.functional.hessian(global_of, torch.zeros(k + 1,
                                                                 dtype=torch.float64))
    appendix = 4 * np.eye(k + 1)
    appendix[0, 1:] = appendix[1:, 0] = -3
    assert H[0, 0].item() == 4 * k
    np.testing.assert_array_equal(H.numpy()[1:, :], appendix[1:, :])
    assert np.linalg.eigvalsh(H.numpy())[0] >= 1.0 - 1e-12
    assert np.linalg.eigvalsh(appendix)[0] < 0
    ones = np.ones(k + 1)
    assert ones @ appendix @ ones == -2 * k + 4              # the appendix's Part 1


def test_multitask_regression_has_a_common_factor():
    data = multitask_regression(n_tasks=3, d=10, m=6, r=2, n_train=5, n_val=4, n_test=7,
                                weight_noise=0.0, seed=3, dtype=torch.float64)
    A = data["A_true"]
    torch.testing.assert_close(A @ A.T, torch.eye(2, dtype=torch.float64))
    for dW in data["dW_true"]:                    # every row of dW_i in the row space of A*
        torch.testing.assert_close(dW @ A.T @ A, dW)
        assert torch.linalg.matrix_rank(dW).item() == 2
    assert [x.shape for x in data["X_test"]] == [(7, 10)] * 3
    again = multitask_regression(n_tasks=3, d=10, m=6, r=2, n_train=5, n_val=4, n_test=7,
                                 weight_noise=0.0, seed=3, dtype=torch.float64)
    assert torch.equal(again["Y_train"][2], data["Y_train"][2])


# --------------------------------------------------------------------------- over MPI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
PS_SCRIPT = os.path.join(os.path.dirname(__file__), "mpi", "multilora_ps.py")


def load_ps_script():
    spec = importlib.util.spec_from_file_location("multilora_ps", PS_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_ps(tmp_path, mode, fail=""):
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, PS_SCRIPT, str(out), mode, fail],
                          env=env, capture_output=True, text=True, timeout=180)
    return proc, out


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["trained", "frozen"])
def test_parameter_server_over_mpirun_equals_the_in_process_run(tmp_path, mode):
    proc, out = run_ps(tmp_path, mode)
    assert proc.returncode == 0, proc.stderr[-2000:]
    over_mpi = json.loads(out.read_text())
    ps = load_ps_script()
    model, task_loss = ps.build(mode == "trained")
    result = train_multilora(model, task_loss, ps.N_TASKS, ps.STEPS,
                             make_optimizer=ps.optimizer)
    vector = ParameterVector(model, buffers=False, trainable_only=True).get()
    np.testing.assert_array_equal(np.asarray(over_mpi["vector"], dtype=np.float32), vector)
    np.testing.assert_array_equal(np.asarray(over_mpi["shared"], dtype=np.float32),
                                  result.vector)
    assert over_mpi["history"] == result.history
    assert (len(result.vector) > 0) == (mode == "trained")


@pytest.mark.mpi
def test_parameter_server_error_on_one_rank_aborts_all(tmp_path):
    proc, out = run_ps(tmp_path, "trained", "fail")
    assert proc.returncode != 0 and not out.exists()
    assert proc.stderr.count("task 1 failed on purpose") == 1
