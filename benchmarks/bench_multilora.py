"""Multi-LoRA against k independent LoRAs on k related tasks (METHODS card "Multi-LoRA",
paper 003; asyncopt.deep.multilora).

Table 1, the card's multi-task linear regression (``multilora.multitask_regression``):
d = m = 32, r = 4, k = 8 tasks on one "pre-trained" layer W0; task i's true update is
dW_i* = B_i* A* + E_i (A* common, orthonormal rows; ||E_i||_F ~ 0.1 ||B_i* A*||_F) and
y = x (W0 + dW_i*)^T + b0 + N(0, 1) noise, so the best test MSE per entry is about 1 and W0
alone scores about 5. Per task n_train = 128 (the full mode also runs 32 and 512), 128
validation and 1000 test samples. Methods, all the same MultiLoRALinear code (alpha 16,
PEFT's kaiming init of the random factor, per-task factor 0):

- ``lora``: k independent LoRAs (``shared=None``), k r (d + m) parameters;
- ``shared_trained``: Multi-LoRA, shared input factor trained jointly (the sum of the
  task gradients, Claim 4.2), d r + k r m parameters;
- ``shared_frozen``: Multi-LoRA as Algorithm 1 (shared factor frozen at its random init);
- ``none``: W0 alone.

Table 2, a tiny MLP adapted to k related tasks: an MLP 64-128-10 (ReLU) pre-trained on
upright digits (scikit-learn's 8 x 8 digits, 600 images, Adam, 300 steps), then k = 8
tasks, task i = the digits rotated by theta_i in linspace(-60, 60, 8) degrees, each with
its own 80 training images (disjoint) and the same 250 validation and 307 test images
rotated by theta_i; adapters (r = 4) on both linear layers, the same four methods;
reported: test error (1 - accuracy), mean over tasks.

Fairness: every method trains with Adam, full batch, the same number of steps and the same
learning-rate grid; each method's rate is the one with the lowest validation error (mean
over seeds), and its test figure is reported at that rate. Training runs through
``train_multilora`` (the parameter-server protocol: shared factors on the server, task i's
factors on worker i; bytes counted, 4 per float).

    python benchmarks/bench_multilora.py --quick   # 3 seeds, 400 steps, 4 rates (~80 s)
    python benchmarks/bench_multilora.py           # 5 seeds, 2000 steps, 5 rates, 3 sizes (~25 min)

Prints the tables and, as its last line, the JSON {"method": "multilora", "test_mse":
{"lora", "shared_trained", "shared_frozen", "none"}, "param_ratio": Multi-LoRA / LoRA
parameters} (table 1, n_train = 128); writes it with per-seed figures, the validation grid,
table 2, bytes per step and the machine info to benchmarks/results/bench_multilora_quick.json
(full mode: bench_multilora.json) and a figure next to it (.png).
"""
import argparse
import copy
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from asyncopt.deep.multilora import (MultiLoRALinear, adapter_parameter_count,  # noqa: E402
                                     attach_multilora, multitask_regression, task_context,
                                     train_multilora)
from benchmarks.common import finish_deep_benchmark, format_table  # noqa: E402

METHODS = ("lora", "shared_trained", "shared_frozen", "none")
TRAINED = METHODS[:3]
# (shared side, train_shared) of each trained method
SETTINGS = {"lora": (None, True), "shared_trained": ("input", True),
            "shared_frozen": ("input", False)}
QUICK = dict(seeds=3, steps=400, lrs=(1e-3, 3e-3, 1e-2, 3e-2), n_train=(128,),
             mlp_steps=300)
FULL = dict(seeds=5, steps=2000, lrs=(1e-3, 3e-3, 1e-2, 3e-2, 1e-1), n_train=(32, 128, 512),
            mlp_steps=1000)
N_TASKS, RANK, DIM = 8, 4, 32
MAIN_N_TRAIN = 128


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK['seeds']} seeds, {QUICK['steps']} steps, "
                        f"{len(QUICK['lrs'])} rates (about 80 s on 2 cores)")
    p.add_argument("--seeds", type=int, help="seeds 0..S-1 (quick 3, full 5)")
    p.add_argument("--steps", type=int, help="regression steps (quick 400, full 2000)")
    p.add_argument("--mlp-steps", type=int, help="digits MLP steps (quick 300, full 1000)")
    p.add_argument("--lrs", type=lambda s: tuple(float(v) for v in s.split(",")),
                   help="comma-separated Adam learning rates (the grid)")
    p.add_argument("--n-train", type=lambda s: tuple(int(v) for v in s.split(",")),
                   help="per-task training sizes of table 1 (must include 128)")
    p.add_argument("--no-mlp", action="store_true", help="skip table 2 (digits MLP)")
    p.add_argument("--out", help="JSON path (default results/bench_multilora[_quick].json)")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if MAIN_N_TRAIN not in args.n_train:
        p.error(f"--n-train must include {MAIN_N_TRAIN} (the reported figure)")
    return args


def adam(lr):
    return lambda params: torch.optim.Adam(params, lr=lr)


def select_rate(val, test):
    """{lr: [per-seed]} validation and test figures -> (chosen lr, its test figures)."""
    lr = min(val, key=lambda rate: np.mean(val[rate]))
    return lr, test[lr]


# --------------------------------------------------------------------------- table 1

def regression_model(data, method, seed):
    """A MultiLoRALinear on the data's W0 (``none``: the bare layer W0)."""
    base = nn.Linear(DIM, DIM)
    with torch.no_grad():
        base.weight.copy_(data["W0"])
        base.bias.copy_(data["b0"])
    if method == "none":
        return base.requires_grad_(False)
    shared, train_shared = SETTINGS[method]
    torch.manual_seed(seed)
    return MultiLoRALinear(base, r=RANK, n_tasks=N_TASKS, shared=shared,
                           train_shared=train_shared)


@torch.no_grad()
def mean_mse(model, X, Y):
    """Per-entry MSE, mean over the tasks."""
    errors = []
    for task, (x, y) in enumerate(zip(X, Y)):
        if isinstance(model, MultiLoRALinear):
            with task_context(model, task):
                errors.append(F.mse_loss(model(x), y).item())
        else:
            errors.append(F.mse_loss(model(x), y).item())
    return float(np.mean(errors))


def run_regression(method, n_train, seed, lr, steps):
    """(validation MSE, test MSE, trained model, result or None) of one run."""
    data = multitask_regression(n_tasks=N_TASKS, d=DIM, m=DIM, r=RANK, n_train=n_train,
                                seed=seed)
    model = regression_model(data, method, seed)
    result = None
    if method != "none":
        def loss(model, task, step):
            return F.mse_loss(model(data["X_train"][task]), data["Y_train"][task])
        result = train_multilora(model, loss, N_TASKS, steps, make_optimizer=adam(lr))
    return (mean_mse(model, data["X_val"], data["Y_val"]),
            mean_mse(model, data["X_test"], data["Y_test"]), model, result)


def table_regression(args):
    """{n_train: {"val": {method: {lr: [..]}}, "test": ..., "chosen_lr", "test_mse"}}
    plus parameter counts, bytes per step and the loss curves of seed 0."""
    out, curves, extra = {}, {}, {}
    for n_train in args.n_train:
        val = {m: {} for m in METHODS}
        test = {m: {} for m in METHODS}
        for method in METHODS:
            for lr in (args.lrs if method != "none" else (0.0,)):
                val[method][lr], test[method][lr] = [], []
                for seed in range(args.seeds):
                    v, t, model, result = run_regression(method, n_train, seed, lr,
                                                         args.steps)
                    val[method][lr].append(v)
                    test[method][lr].append(t)
                    if seed == 0 and result is not None:
                        curves.setdefault(n_train, {}).setdefault(method, {})[lr] = [
                            float(np.mean(h["losses"])) for h in result.history]
                    if n_train == MAIN_N_TRAIN and seed == 0 and lr == args.lrs[0]:
                        extra[method] = {
                            "adapter_parameters": (adapter_parameter_count(model)
                                                   if result is not None else 0),
                            "bytes_per_step": (result.history[-1]["bytes_sent"]
                                               + result.history[-1]["bytes_received"]
                                               if result is not None else 0),
                            "bytes_total": (result.bytes_sent + result.bytes_received
                                            if result is not None else 0)}
        chosen = {m: select_rate(val[m], test[m]) for m in METHODS}
        out[n_train] = {"val": val, "test": test,
                        "chosen_lr": {m: chosen[m][0] for m in METHODS},
                        "test_mse": {m: float(np.mean(chosen[m][1])) for m in METHODS},
                        "test_mse_per_seed": {m: chosen[m][1] for m in METHODS}}
        print(f"n_train {n_train}: " + ", ".join(
            f"{m} {out[n_train]['test_mse'][m]:.4f}" for m in METHODS), flush=True)
    return out, curves, extra


# --------------------------------------------------------------------------- table 2

def rotated_digits_tasks(seed, n_pretrain=600, n_per_task=80, n_val=250,
                         angles=tuple(np.linspace(-60, 60, N_TASKS))):
    """Digits scaled to [0, 1]: a pre-training pool (upright) and, per task, its own
    training images and the shared validation / test images, rotated by the task's angle
    (``scipy.ndimage.rotate``, bilinear, same shape)."""
    from scipy.ndimage import rotate
    from sklearn.datasets import load_digits
    digits = load_digits()
    images, labels = digits.images / 16.0, digits.target
    order = np.random.default_rng(seed).permutation(len(labels))
    start = n_pretrain + n_per_task * len(angles)
    parts = {"pretrain": order[:n_pretrain],
             "val": order[start:start + n_val], "test": order[start + n_val:]}

    def as_tensors(index, angle):
        pics = images[index] if angle == 0 else np.stack(
            [rotate(img, angle, reshape=False, order=1) for img in images[index]])
        return (torch.as_tensor(pics.reshape(len(index), -1), dtype=torch.float32),
                torch.as_tensor(labels[index]))

    tasks = {"pretrain": as_tensors(parts["pretrain"], 0), "angles": list(angles)}
    for split in ("train", "val", "test"):
        tasks[split] = []
        for i, angle in enumerate(angles):
            index = (order[n_pretrain + i * n_per_task:n_pretrain + (i + 1) * n_per_task]
                     if split == "train" else parts[split])
            tasks[split].append(as_tensors(index, angle))
    return tasks


def pretrained_mlp(tasks, seed, steps=300):
    """MLP 64-128-10 (ReLU) fitted on the upright pre-training pool (Adam 1e-2, weight
    decay 1e-3, full batch)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3)
    X, y = tasks["pretrain"]
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
    return model


@torch.no_grad()
def mean_error(model, split, adapted):
    errors = []
    for task, (X, y) in enumerate(split):
        if adapted:
            with task_context(model, task):
                pred = model(X).argmax(1)
        else:
            pred = model(X).argmax(1)
        errors.append(float((pred != y).float().mean()))
    return float(np.mean(errors))


def run_mlp(tasks, base, method, seed, lr, steps):
    """(validation error, test error, adapter parameters) of one run."""
    model = copy.deepcopy(base)
    if method == "none":
        return mean_error(model, tasks["val"], False), mean_error(model, tasks["test"],
                                                                  False), 0
    shared, train_shared = SETTINGS[method]
    torch.manual_seed(seed)
    attach_multilora(model, N_TASKS, targets=("0", "2"), r=RANK, shared=shared,
                     train_shared=train_shared, task_head=None)

    def loss(model, task, step):
        X, y = tasks["train"][task]
        return F.cross_entropy(model(X), y)
    train_multilora(model, loss, N_TASKS, steps, make_optimizer=adam(lr))
    return (mean_error(model, tasks["val"], True), mean_error(model, tasks["test"], True),
            adapter_parameter_count(model))


def table_mlp(args):
    val = {m: {} for m in METHODS}
    test = {m: {} for m in METHODS}
    params = {}
    for seed in range(args.seeds):
        tasks = rotated_digits_tasks(seed)
        base = pretrained_mlp(tasks, seed)
        for method in METHODS:
            for lr in (args.lrs if method != "none" else (0.0,)):
                v, t, params[method] = run_mlp(tasks, base, method, seed, lr,
                                               args.mlp_steps)
                val[method].setdefault(lr, []).append(v)
                test[method].setdefault(lr, []).append(t)
    chosen = {m: select_rate(val[m], test[m]) for m in METHODS}
    return {"val": val, "test": test, "chosen_lr": {m: chosen[m][0] for m in METHODS},
            "test_error": {m: float(np.mean(chosen[m][1])) for m in METHODS},
            "test_error_per_seed": {m: chosen[m][1] for m in METHODS},
            "adapter_parameters": params,
            "param_ratio": params["shared_trained"] / params["lora"]}


# --------------------------------------------------------------------------- report

def plot(path, regression, curves):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    sizes = sorted(regression)
    for method in METHODS:
        left.plot(sizes, [regression[n]["test_mse"][method] for n in sizes], marker="o",
                  label=method)
        if method in curves.get(MAIN_N_TRAIN, {}):
            lr = regression[MAIN_N_TRAIN]["chosen_lr"][method]
            right.plot(curves[MAIN_N_TRAIN][method][lr], label=f"{method} (lr {lr:g})")
    left.axhline(1.0, color="k", linestyle=":", linewidth=0.8, label="noise floor")
    left.set_xscale("log", base=2)
    left.set_xlabel("training samples per task")
    left.set_ylabel("test MSE per entry")
    left.set_title(f"multi-task regression d=m={DIM}, r={RANK}, k={N_TASKS}", fontsize=10)
    right.set_yscale("log")
    right.set_xlabel("step")
    right.set_ylabel("training MSE, mean over tasks")
    right.set_title(f"n_train={MAIN_N_TRAIN}, seed 0, chosen rates", fontsize=10)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    print(f"Multi-LoRA benchmark: k={N_TASKS}, r={RANK}, d=m={DIM}; seeds={args.seeds}, "
          f"steps={args.steps}, Adam rates {args.lrs}, n_train {args.n_train}", flush=True)
    start = time.perf_counter()
    regression, curves, extra = table_regression(args)
    main_table = regression[MAIN_N_TRAIN]
    lora, multi = (extra[m]["adapter_parameters"] for m in ("lora", "shared_trained"))
    param_ratio = multi / lora
    bound = (1 + N_TASKS) / (2 * N_TASKS)
    mse = main_table["test_mse"]
    rows = [[m, f"{mse[m]:.4f}", f"{mse[m] / mse['lora']:.3f}",
             f"{main_table['chosen_lr'][m]:g}" if m != "none" else "-",
             extra.get(m, {}).get("adapter_parameters", 0),
             extra.get(m, {}).get("bytes_per_step", 0)] for m in METHODS]
    print()
    print(f"Table 1: test MSE per entry (noise floor 1.0), n_train {MAIN_N_TRAIN} per task, "
          f"mean over {args.seeds} seeds")
    print(format_table(["method", "test MSE", "/ lora", "lr", "parameters",
                        "bytes/step"], rows))
    if len(regression) > 1:
        print()
        print(format_table(["n_train"] + list(METHODS),
                           [[n] + [f"{regression[n]['test_mse'][m]:.4f}" for m in METHODS]
                            for n in sorted(regression)]))
    met = mse["shared_trained"] <= 1.1 * mse["lora"] and param_ratio <= bound + 0.01
    print(f"param_ratio {param_ratio:.4f} (bound (1+k)/(2k) = {bound:.4f}); shared_trained / "
          f"lora test MSE {mse['shared_trained'] / mse['lora']:.3f}: target "
          f"{'met' if met else 'NOT met'}")
    mlp = None
    if not args.no_mlp:
        mlp = table_mlp(args)
        print()
        print(f"Table 2: digits rotated by {N_TASKS} angles, MLP 64-128-10, test error "
              f"(mean over tasks and {args.seeds} seeds), {args.mlp_steps} steps")
        print(format_table(
            ["method", "test error", "lr", "parameters"],
            [[m, f"{mlp['test_error'][m]:.4f}",
              f"{mlp['chosen_lr'][m]:g}" if m != "none" else "-",
              mlp["adapter_parameters"][m]] for m in METHODS]))
    elapsed = time.perf_counter() - start
    print(f"({elapsed:.0f} s)")
    summary = {"method": "multilora", "test_mse": mse, "param_ratio": param_ratio}
    name = "bench_multilora" + ("_quick" if args.quick else "")
    out = finish_deep_benchmark(args, name, summary, elapsed, target_met=met,
                                regression=regression, digits_mlp=mlp,
                                parameters_and_bytes=extra)
    plot(os.path.splitext(out)[0] + ".png", regression, curves)


if __name__ == "__main__":
    main()
