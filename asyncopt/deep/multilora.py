"""Multi-LoRA: k parallel fine-tuning tasks share one low-rank factor of every adapted layer
(paper 003, "Parameter-efficient fine-tuning via partially decomposable loss analysis and
sharing", section 3 and Algorithm 1; docs/deep_methods.md, "Multi-LoRA").

A :class:`MultiLoRALinear` wraps a frozen ``nn.Linear`` W0 (weight (m, d), y = x W0^T + b)
and gives task i = 0..k-1 the rank-r update

    y_i = x W0^T + b + s * dropout(x) A_i^T B_i^T,    dW_i = s B_i A_i,    s = alpha / r,

A_i: (r, d), B_i: (m, r), with one of the two factors shared by all k tasks:

- ``shared="input"`` (the paper's choice; its A in R^{d x r} multiplies the input first):
  A_i = A for every task, B_i per task. Parameters d r + k r m per layer;
- ``shared="output"``: B_i = B for every task, A_i per task. Parameters m r + k r d;
- ``shared=None``: k independent LoRAs (A_i and B_i per task, Hu et al. 2021), k r (d + m)
  per layer: the baseline, run by the same code.

For d = m the ratio to k independent LoRAs is (d r + k r m) / (k r (d + m)) = (1 + k)/(2k)
(RoBERTa-base, q and v of 12 layers, r = 8, k = 8 tasks: 1,327,104 against 2,359,296; the
paper's table 1 rounds them to 1.3M and 2.4M). :func:`adapter_parameter_count` counts the
factors of a model built with the adapters (on the meta device for RoBERTa-base:
:func:`roberta_base_adapter_counts`); :func:`adapter_parameter_formula` is the closed form.

Initialisation: the per-task factor is zero (B_i = 0, or A_i = 0 with ``shared="output"``),
so every task starts at W0 exactly; the shared factor is random, ``shared_init``:
``"kaiming"`` (PEFT's ``kaiming_uniform_(a=sqrt(5))``, LoRA's default, which the paper's
experiments used: "randomly initialized by default configuration"), ``"gaussian"``
(N(0, 1) entries, as Algorithm 1 line 3 prints), ``"orthogonal"`` (orthonormal rows of A
or columns of B) or a callable that fills the tensor in place. With ``shared=None`` every
A_i is drawn the same way and B_i = 0, as LoRA does.

Tasks are chosen by the ``active_task`` attribute of the adapted layers and of the per-task
heads (:class:`MultiTaskHead`): :func:`set_active_task` sets it across a model,
:func:`task_context` for a block. :func:`attach_multilora` wraps the named ``nn.Linear``
modules (``q`` and ``v`` by default, as the paper), replaces the model's head by k copies
and freezes everything else.

Training, two modes (``train_shared``):

- shared factor frozen (Algorithm 1, lines 7-12: only the B_i train). Each task is then
  an independent problem in its own factors; for a linear layer and the squared loss it is
  a least-squares problem in B_i with the features s x A^T.
- shared factor trained jointly (the theory of section 4: the partially decomposable
  global loss of Definition 4.1, L(x, y) = sum_i L_i(x, y_i), x the shared factors, y_i
  task i's; Claim 4.2: dL/dx = sum_i dL_i/dx, dL/dy_i = dL_i/dy_i).

:func:`train_multilora` runs either mode as a synchronous parameter-server protocol, in
process or, with ``comm=``, under mpirun (rank 0 the server, task i on rank 1 + i mod W;
:func:`_train_over_mpi`), with the same trained parameters. The shared factors (and any other trainable parameter that belongs to no task)
live on the server; task i's factors and head live on worker i and never travel. Step t:

1. the server sends the shared vector x_t to every worker (P_s floats each; with the
   shared factor frozen, only once, before the first step);
2. worker i sets its task active, evaluates L_i(x_t, y_i) on its minibatch, takes
   (g_x^i, g_y^i) = (dL_i/dx, dL_i/dy_i), updates y_i with its own optimizer on g_y^i and,
   when the shared factor trains, sends g_x^i back (P_s floats);
3. the server sums g_x = sum_i g_x^i (Claim 4.2) and updates x with its optimizer.

All workers use the same x_t, so one step is one gradient step on the global loss. Bytes
are the protocol's, 4 per entry (float32, as :class:`~asyncopt.deep.ParameterVector`):
4 P_s k down and 4 P_s k up per step (trained), 4 P_s k down once and nothing up (frozen).

Strong convexity (section 4.5). If every L_i is alpha-strongly convex in (x, y_i), the
global Hessian satisfies z^T H z = sum_i (z_0, z_i)^T H_i (z_0, z_i) >= alpha (k ||z_0||^2
+ sum_i ||z_i||^2) >= alpha ||z||^2: L is alpha-strongly convex, with no further
assumption. Lemma 4.8 (alpha/2 under (k-1)(alpha_0 - alpha) <= alpha/2) and the appendix's
counterexample both treat the global (0, 0) block as one task's H_00 instead of the sum of
the k tasks' blocks; the appendix matrix (4 at (0, 0), -3 to every task) is no global
Hessian: tasks with per-task Hessian [[4, -3], [-3, 4]] give 4k at (0, 0), and the global
matrix stays >= 1 = alpha (``tests/test_deep_multilora.py`` checks both numerically).

Choices: the shared gradient is the plain sum of Claim 4.2 (not the mean), so with SGD the
shared factor moves k times as far per unit of learning rate as with the mean; ``alpha``
defaults to 16 (the paper's RoBERTa setting, as :class:`~asyncopt.deep.lora.LoRALinear`),
``alpha=None`` sets s = 1. Each adapted layer has its own shared factor (shared across
tasks, not layers).
"""
import copy
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..comm.wire import abort_all_ranks
from .federated import FLOAT32_BYTES, FederatedResult, ParameterVector
from .lora import (RANDOM_INITS, LowRankLinear, adapter_parameter_count, freeze_except,
                   wrap_linear_layers)
from .transformer import bert_encoder

SHARED_SIDES = ("input", "output", None)
SHARED_INITS = RANDOM_INITS
PAPER_TARGETS = ("q", "v")
# RoBERTa-base (Liu et al. 2019) in bert_encoder's terms: the paper's table 1 model.
ROBERTA_BASE = dict(vocab_size=50265, max_positions=514, type_vocab_size=1, d_model=768,
                    n_heads=12, d_ff=3072, n_layers=12)

__all__ = ["MultiLoRALinear", "MultiTaskHead", "attach_multilora", "set_active_task",
           "task_context", "multilora_layers", "shared_parameters", "task_parameters",
           "adapter_parameter_count", "adapter_parameter_formula",
           "roberta_base_adapter_counts", "global_loss", "train_multilora",
           "MultiLoRAResult", "multitask_regression", "SHARED_SIDES", "SHARED_INITS",
           "PAPER_TARGETS", "ROBERTA_BASE"]


class MultiLoRALinear(LowRankLinear):
    """A frozen ``nn.Linear`` W0 plus k task updates s B_i A_i that share one factor.

        y_i = x W0^T + b + s * dropout(x) A_i^T B_i^T,    s = alpha / r,

    A_i: (r, d), B_i: (m, r); ``shared="input"``: A_i = A (paper 003's choice),
    ``"output"``: B_i = B, None: k independent LoRAs (module docstring). ``active_task``
    picks the update ``forward`` uses (None until set when k > 1). The per-task factor
    starts at zero, so every task starts at W0 exactly.

    Parameters
    ----------
    base : torch.nn.Linear
        The layer W0 (weight (m, d)), frozen in place.
    r : int, default=8
        The rank.
    n_tasks : int, default=2
        k.
    alpha : float, default=16.0
        The scale numerator, s = alpha / r (None: s = 1); 16 is the paper's RoBERTa
        setting.
    shared : {"input", "output", None}, default="input"
        Which factor the tasks share.
    shared_init : {"kaiming", "gaussian", "orthogonal"} or callable, default="kaiming"
        Initialisation of the shared factor (and of every A_i with ``shared=None``).
    train_shared : bool, default=False
        Whether the shared factor trains (False: Algorithm 1, only the per-task factors).
    dropout : float, default=0.0
        Dropout on the updates' input.

    Attributes
    ----------
    lora_A : torch.nn.Parameter or torch.nn.ParameterList
        A when shared ((r, d)), else the k per-task A_i.
    lora_B : torch.nn.Parameter or torch.nn.ParameterList
        B when shared ((m, r)), else the k per-task B_i.
    scale : float
        s.
    active_task : int or None
        The task ``forward`` uses.
    """

    kind = "Multi-LoRA"

    def __init__(self, base, r=8, n_tasks=2, alpha=16.0, shared="input",
                 shared_init="kaiming", train_shared=False, dropout=0.0):
        super().__init__(base, r, alpha, dropout, n_tasks=n_tasks, shared=shared,
                         shared_init=shared_init)
        self.train_shared = bool(train_shared)

    def _init_factors(self, n_tasks, shared, shared_init):
        if int(n_tasks) < 1:
            raise ValueError(f"n_tasks must be >= 1, got {n_tasks}")
        if shared not in SHARED_SIDES:
            raise ValueError(f"shared must be one of {SHARED_SIDES}, got {shared!r}")
        if not callable(shared_init) and shared_init not in SHARED_INITS:
            raise ValueError(f"shared_init must be one of {SHARED_INITS} or a callable, "
                             f"got {shared_init!r}")
        self.n_tasks, self.shared = int(n_tasks), shared
        self.active_task = 0 if self.n_tasks == 1 else None

        def per_task(side, init=None):
            return nn.ParameterList(self.new_factor(side, init) for _ in range(self.n_tasks))

        if shared == "input":
            self.lora_A, self.lora_B = self.new_factor("A", shared_init), per_task("B")
        elif shared == "output":
            self.lora_A, self.lora_B = per_task("A"), self.new_factor("B", shared_init)
        else:
            self.lora_A, self.lora_B = per_task("A", shared_init), per_task("B")

    @property
    def train_shared(self):
        """Whether the shared factor trains (``requires_grad``); False for ``shared=None``."""
        return any(p.requires_grad for p in self.shared_parameters())

    @train_shared.setter
    def train_shared(self, value):
        for p in self.shared_parameters():
            p.requires_grad_(bool(value))

    def shared_parameters(self):
        """Return the shared factor as a list (empty for ``shared=None``).

        Returns
        -------
        list of torch.nn.Parameter
            [A], [B] or [].
        """
        return {"input": [self.lora_A], "output": [self.lora_B], None: []}[self.shared]

    def task_parameters(self, task):
        """Return a task's own factor(s): B_i, A_i, or both (``shared=None``).

        Parameters
        ----------
        task : int
            The task i.

        Returns
        -------
        list of torch.nn.Parameter
            Its factors.
        """
        own = {"input": [self.lora_B], "output": [self.lora_A],
               None: [self.lora_A, self.lora_B]}[self.shared]
        return [factors[task] for factors in own]

    def factors(self, task=None):
        """Return (A_i, B_i) of a task.

        Parameters
        ----------
        task : int, default=None
            The task; None: the active one.

        Returns
        -------
        tuple of torch.nn.Parameter
            (A_i, B_i).
        """
        task = self._task(task)
        A = self.lora_A if self.shared == "input" else self.lora_A[task]
        B = self.lora_B if self.shared == "output" else self.lora_B[task]
        return A, B

    def _task(self, task):
        task = self.active_task if task is None else task
        if task is None:
            raise RuntimeError("no active task: call set_active_task(model, i) first")
        if not 0 <= int(task) < self.n_tasks:
            raise IndexError(f"task {task} out of range for {self.n_tasks} tasks")
        return int(task)

    def extra_repr(self):
        """Return the rank, task count, alpha and shared side for the module's repr.

        Returns
        -------
        str
            ``"r=..., n_tasks=..., alpha=..., shared=..."``.
        """
        return (f"r={self.r}, n_tasks={self.n_tasks}, alpha={self.alpha:g}, "
                f"shared={self.shared!r}")


class MultiTaskHead(nn.Module):
    """A set of k task heads; ``forward`` applies ``heads[active_task]``.

    Parameters
    ----------
    heads : iterable of torch.nn.Module
        One head per task.

    Attributes
    ----------
    heads : torch.nn.ModuleList
        The heads.
    n_tasks : int
        k.
    active_task : int or None
        The head ``forward`` uses (None until set when k > 1).
    """

    def __init__(self, heads):
        super().__init__()
        self.heads = nn.ModuleList(heads)
        self.n_tasks = len(self.heads)
        self.active_task = 0 if self.n_tasks == 1 else None

    def task_parameters(self, task):
        """Return the parameters of a task's head.

        Parameters
        ----------
        task : int
            The task.

        Returns
        -------
        list of torch.nn.Parameter
            Its head's parameters.
        """
        return list(self.heads[task].parameters())

    def forward(self, x):
        """Apply the active task's head.

        Parameters
        ----------
        x : torch.Tensor
            The head's input.

        Returns
        -------
        torch.Tensor
            ``heads[active_task](x)``.
        """
        if self.active_task is None:
            raise RuntimeError("no active task: call set_active_task(model, i) first")
        return self.heads[self.active_task](x)


def _task_modules(model):
    return [m for m in model.modules() if isinstance(m, (MultiLoRALinear, MultiTaskHead))]


def set_active_task(model, task):
    """Make ``task`` the active one in every adapted layer and task head of ``model``.

    Parameters
    ----------
    model : torch.nn.Module
        A model with Multi-LoRA layers or task heads.
    task : int
        The task.

    Returns
    -------
    torch.nn.Module
        ``model``.
    """
    modules = _task_modules(model)
    if not modules:
        raise ValueError("the model has no Multi-LoRA layer or task head")
    for m in modules:
        if not 0 <= int(task) < m.n_tasks:
            raise IndexError(f"task {task} out of range for {m.n_tasks} tasks")
        m.active_task = int(task)
    return model


@contextmanager
def task_context(model, task):
    """Make task i active inside a ``with`` block, the previous one after.

    ``with task_context(model, i):``.

    Parameters
    ----------
    model : torch.nn.Module
        A model with Multi-LoRA layers or task heads.
    task : int
        The task.

    Yields
    ------
    torch.nn.Module
        ``model``, with ``task`` active.
    """
    previous = [(m, m.active_task) for m in _task_modules(model)]
    set_active_task(model, task)
    try:
        yield model
    finally:
        for m, t in previous:
            m.active_task = t


def attach_multilora(model, n_tasks, targets=PAPER_TARGETS, r=8, alpha=16.0, dropout=0.0,
                     shared="input", shared_init="kaiming", train_shared=False,
                     task_head="head", trainable=()):
    """Wrap the named ``nn.Linear`` layers of ``model`` in Multi-LoRA layers, in place.

    Each becomes a :class:`MultiLoRALinear`. The submodule named ``task_head`` (if the
    model has one and it is not None) is replaced by a :class:`MultiTaskHead` of k deep
    copies (every task starts at the base model's output); everything else is frozen except
    the submodules named in ``trainable`` (shared by the tasks), and the shared factors'
    ``requires_grad`` is set to ``train_shared``.

    Parameters
    ----------
    model : torch.nn.Module
        The model, changed in place.
    n_tasks : int
        k.
    targets : iterable of str, default=("q", "v")
        Attribute names of the layers to wrap (the paper's q and v).
    r : int, default=8
        The rank.
    alpha : float, default=16.0
        The scale numerator.
    dropout : float, default=0.0
        Dropout on the updates' input.
    shared : {"input", "output", None}, default="input"
        Which factor the tasks share.
    shared_init : {"kaiming", "gaussian", "orthogonal"} or callable, default="kaiming"
        Initialisation of the shared factor.
    train_shared : bool, default=False
        Whether the shared factors train.
    task_head : str, default="head"
        Name of the head to replace by k copies (falsy: none).
    trainable : iterable of str, default=()
        Qualified names of further submodules left trainable.

    Returns
    -------
    list of str
        The qualified names of the wrapped layers.

    Raises
    ------
    ValueError
        If no layer matched.
    """
    wrapped = wrap_linear_layers(model, targets, lambda base: MultiLoRALinear(
        base, r=r, n_tasks=n_tasks, alpha=alpha, shared=shared, shared_init=shared_init,
        dropout=dropout))
    head_names = ()
    if task_head and isinstance(getattr(model, task_head, None), nn.Module):
        head = getattr(model, task_head)
        setattr(model, task_head, MultiTaskHead(copy.deepcopy(head) for _ in range(n_tasks)))
        head_names = (task_head,)
    freeze_except(model, tuple(trainable) + head_names)
    for layer in multilora_layers(model).values():
        layer.train_shared = train_shared
    return wrapped


def multilora_layers(model):
    """The :class:`MultiLoRALinear` layers of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MultiLoRALinear)}


def task_parameters(model, task):
    """Task ``task``'s trainable parameters: its factors in every adapted layer and its
    head (worker ``task``'s part; they never travel)."""
    params = [p for m in _task_modules(model) for p in m.task_parameters(task)]
    return [p for p in params if p.requires_grad]


def shared_parameters(model):
    """The trainable parameters that belong to no task (the server's part): the shared
    factors when they train, and any other trainable parameter (``named_parameters``
    order)."""
    n_tasks = max((m.n_tasks for m in _task_modules(model)), default=0)
    owned = {id(p) for m in _task_modules(model) for i in range(n_tasks)
             for p in m.task_parameters(i)}
    return [p for p in model.parameters() if p.requires_grad and id(p) not in owned]


def adapter_parameter_formula(shapes, r, n_tasks, shared="input"):
    """The closed form of :func:`adapter_parameter_count` for layers of (in, out) =
    (d, m) ``shapes``: d r + k r m (``"input"``), m r + k r d (``"output"``),
    k r (d + m) (None)."""
    if shared not in SHARED_SIDES:
        raise ValueError(f"shared must be one of {SHARED_SIDES}, got {shared!r}")
    k, total = int(n_tasks), 0
    for d, m in shapes:
        total += {"input": d * r + k * r * m, "output": m * r + k * r * d,
                  None: k * r * (d + m)}[shared]
    return int(total)


def roberta_base_adapter_counts(r=8, n_tasks=8, targets=PAPER_TARGETS):
    """Count the adapter parameters of the paper's table 1 setting on RoBERTa-base.

    The model is built on the meta device (no memory) with the adapters attached.

    Parameters
    ----------
    r : int, default=8
        The rank.
    n_tasks : int, default=8
        k.
    targets : iterable of str, default=("q", "v")
        The adapted layers.

    Returns
    -------
    dict
        ``"lora"``: k independent LoRAs (``shared=None``); ``"multilora"``: shared input
        factor; ``"multilora_output"``: shared output factor; ``"ratio"``:
        multilora / lora.
    """
    counts = {}
    for key, shared in (("lora", None), ("multilora", "input"), ("multilora_output", "output")):
        with torch.device("meta"):
            model = bert_encoder(**ROBERTA_BASE)
            attach_multilora(model, n_tasks, targets=targets, r=r, shared=shared)
        counts[key] = adapter_parameter_count(model)
    counts["ratio"] = counts["multilora"] / counts["lora"]
    return counts


def global_loss(model, task_loss, n_tasks, step=0):
    """The partially decomposable global loss sum_i L_i (Definition 4.1), L_i =
    ``task_loss(model, i, step)`` evaluated with task i active."""
    total = 0
    for task in range(n_tasks):
        with task_context(model, task):
            total = total + task_loss(model, task, step)
    return total


@dataclass
class MultiLoRAResult(FederatedResult):
    """``vector``: the server's final shared vector (float32, the trainable shared
    parameters flattened; empty when the shared factors are frozen); ``history``: one dict
    per step (``step``, ``losses`` (L_i before the step), ``bytes_sent`` /
    ``bytes_received`` of the step and their running totals, ``metric`` when ``evaluate``
    ran); ``shared_size`` P_s: the floats of the shared vector (frozen ones included: they
    go down once); ``trained_shared_size``: the trainable part of it (down and up every
    step); ``task_sizes``: each worker's own floats (never sent)."""
    shared_size: int = 0
    task_sizes: list = field(default_factory=list)
    trained_shared_size: int = 0


def _sgd(lr):
    return lambda params: torch.optim.SGD(params, lr=lr)


def train_multilora(model, task_loss, n_tasks, steps, *, lr=0.01, make_optimizer=None,
                    evaluate=None, eval_every=0, comm=None):
    """Train a Multi-LoRA model by the synchronous parameter-server protocol.

    The protocol of the module docstring: per step, the server's shared factors x go to
    every worker, worker i steps its own factors y_i on dL_i/dy_i and returns dL_i/dx, and
    the server steps x on sum_i dL_i/dx (Claim 4.2). The server's part is
    :func:`shared_parameters` (empty when the shared factors are frozen), worker i's is
    :func:`task_parameters`; each has its own optimizer.

    Parameters
    ----------
    model : torch.nn.Module
        The model with Multi-LoRA layers (:func:`attach_multilora`); ends with the trained
        factors.
    task_loss : callable
        ``task_loss(model, task, step) -> scalar tensor``: worker ``task``'s loss L_i on its
        minibatch of step ``step``, called with the task active.
    n_tasks : int
        k.
    steps : int
        Synchronous steps.
    lr : float, default=0.01
        Learning rate of the default SGD optimizers.
    make_optimizer : callable, default=None
        ``make_optimizer(params)``; None: ``torch.optim.SGD(params, lr=lr)``.
    evaluate : callable, default=None
        ``evaluate(model) -> float | dict``, run every ``eval_every`` steps and after the
        last.
    eval_every : int, default=0
        Steps between evaluations (0: only after the last).
    comm : mpi4py.MPI.Comm, default=None
        A communicator of W + 1 >= 2 ranks: the protocol then runs over MPI (call this on
        every rank, each with the same model and ``task_loss``); None: in process.

    Returns
    -------
    MultiLoRAResult
        The final shared vector, one history record per step (losses and bytes) and the
        protocol's sizes; on MPI worker ranks one with ``is_server=False``.
    """
    make_optimizer = make_optimizer or _sgd(lr)
    if comm is not None:
        return _train_over_mpi(model, task_loss, n_tasks, steps, make_optimizer, evaluate,
                               comm)
    shared, tasks, result = _protocol_parts(model, n_tasks, is_server=True)
    if not any(tasks) and not shared:
        raise ValueError("nothing to train: no trainable task or shared parameter")
    server = make_optimizer(shared) if shared else None
    workers = [make_optimizer(params) if params else None for params in tasks]
    model.train()
    for step in range(steps):
        shared_grads = [torch.zeros_like(p) for p in shared]
        losses = []
        for task in range(n_tasks):
            loss, grads = _task_step(model, task_loss, task, step, shared, tasks[task],
                                     workers[task])
            for total, g in zip(shared_grads, grads):
                total += g
            losses.append(loss)
        if server is not None:
            for p, g in zip(shared, shared_grads):
                p.grad = g
            server.step()
        record = _record_step(result, step, losses, n_tasks)
        if evaluate is not None and (step == steps - 1 or
                                     (eval_every and (step + 1) % eval_every == 0)):
            record["metric"] = evaluate(model)
            model.train()
    result.vector = ParameterVector.of_tensors(shared).get()
    return result


def _protocol_parts(model, n_tasks, is_server):
    """(shared, tasks, result): the server's trainable shared factors, each task's own
    parameters, and the empty :class:`MultiLoRAResult` with the protocol's sizes."""
    shared = shared_parameters(model)
    tasks = [task_parameters(model, i) for i in range(n_tasks)]
    frozen_shared = sum(p.numel() for m in multilora_layers(model).values()
                        for p in m.shared_parameters() if not p.requires_grad)
    trained = int(sum(p.numel() for p in shared))
    result = MultiLoRAResult(vector=None, shared_size=trained + int(frozen_shared),
                             task_sizes=[int(sum(p.numel() for p in t)) for t in tasks],
                             trained_shared_size=trained, is_server=is_server)
    return shared, tasks, result


def _task_step(model, task_loss, task, step, shared, params, optimizer):
    """Worker ``task``'s part of a step: L_i with the task active, its own optimizer step
    on dL_i/dy_i, and (L_i, [dL_i/dx per shared tensor, zeros where unused])."""
    with task_context(model, task):
        loss = task_loss(model, task, step)
    grads = torch.autograd.grad(loss, shared + params, allow_unused=True)
    if optimizer is not None:
        for p, g in zip(params, grads[len(shared):]):
            p.grad = torch.zeros_like(p) if g is None else g
        optimizer.step()
    shared_grads = [torch.zeros_like(p) if g is None else g
                    for p, g in zip(shared, grads[:len(shared)])]
    return float(loss.detach()), shared_grads


def _record_step(result, step, losses, n_tasks):
    """Append step ``step``'s history record (the protocol's bytes, 4 per float: the
    shared vector down to every task, the frozen part only at step 0; the trainable
    part's gradient back up) and return it."""
    trained = result.trained_shared_size
    sent = FLOAT32_BYTES * n_tasks * (result.shared_size if step == 0 else trained)
    received = FLOAT32_BYTES * n_tasks * trained
    before = result.history[-1] if result.history else {}
    record = {"step": step, "losses": list(losses), "bytes_sent": sent,
              "bytes_received": received,
              "bytes_sent_total": before.get("bytes_sent_total", 0) + sent,
              "bytes_received_total": before.get("bytes_received_total", 0) + received}
    result.history.append(record)
    return record


TAG_SHARED_GRADIENTS, TAG_LOSSES, TAG_TASK_VECTOR = 41, 42, 43


def _train_over_mpi(model, task_loss, n_tasks, steps, make_optimizer, evaluate, comm):
    """:func:`train_multilora` over MPI. Rank 0 is the server and holds the trainable
    shared factors; task i runs on rank 1 + i mod W (``federated.client_ranks``), whose
    optimizer alone steps its factors and head. Numpy buffers only, on Dis-DDSS's wire
    (:class:`asyncopt.comm.wire.Wire`; the waits sleep). Step t:

    1. Bcast of the shared vector x_t (float32, P_s; skipped when it is frozen: every rank
       built the same frozen factor);
    2. each worker, for its tasks in ascending order, computes L_i, steps its own factors
       and Sends the rows dL_i/dx (float32, n_own x P_s, tag 41) and the losses (float64,
       tag 42) to rank 0;
    3. rank 0 adds the k rows in task order (as the in-process loop does) and steps x.

    After the last step every worker Sends each of its tasks' parameters (float32, tag 43)
    to rank 0, which loads them and runs ``evaluate`` once. The trained parameters, losses
    and byte counts equal the in-process run's when ``task_loss`` is deterministic in
    (task, step) (tested under ``mpirun -n 3``). A failing rank prints its traceback and
    ends all ranks (``MPI_Abort``).
    """
    from ..comm.wire import Wire
    from .federated import client_ranks
    rank, size = comm.Get_rank(), comm.Get_size()
    wire = Wire(comm)
    if size < 2:
        raise ValueError("Multi-LoRA over MPI needs at least 2 ranks (a server, a worker)")
    try:
        owner = client_ranks(n_tasks, size - 1)
        shared, tasks, result = _protocol_parts(model, n_tasks, is_server=rank == 0)
        shared_flat = ParameterVector.of_tensors(shared)
        mine = [i for i in range(n_tasks) if owner[i] == rank]
        workers = {i: make_optimizer(tasks[i]) for i in mine if tasks[i]}
        server = make_optimizer(shared) if rank == 0 and shared else None
        vector = np.empty(shared_flat.size, dtype=np.float32)
        model.train()
        for step in range(steps):
            if shared_flat.size:
                if rank == 0:
                    vector[:] = shared_flat.get()
                wire.bcast(vector)
                if rank != 0:
                    shared_flat.set(vector)
            if rank == 0:
                rows = np.zeros((n_tasks, shared_flat.size), dtype=np.float32)
                losses = np.zeros(n_tasks, dtype=np.float64)
                for worker in range(1, size):
                    ids = np.flatnonzero(owner == worker)
                    if ids.size == 0:
                        continue
                    buf = np.empty((ids.size, shared_flat.size), dtype=np.float32)
                    lbuf = np.empty(ids.size, dtype=np.float64)
                    wire.recv(buf, worker, TAG_SHARED_GRADIENTS)
                    wire.recv(lbuf, worker, TAG_LOSSES)
                    rows[ids], losses[ids] = buf, lbuf
                if server is not None:
                    total = torch.zeros(shared_flat.size, dtype=torch.float32)
                    for row in rows:
                        total += torch.from_numpy(row)
                    for p, g in zip(shared, torch.split(total, shared_flat.numels)):
                        p.grad = g.view_as(p).clone()
                    server.step()
                _record_step(result, step, losses.tolist(), n_tasks)
            elif mine:
                rows = np.zeros((len(mine), shared_flat.size), dtype=np.float32)
                losses = np.zeros(len(mine), dtype=np.float64)
                for row, task in enumerate(mine):
                    losses[row], grads = _task_step(model, task_loss, task, step, shared,
                                                    tasks[task], workers.get(task))
                    rows[row] = ParameterVector.of_tensors(grads).get()
                wire.send(rows, 0, TAG_SHARED_GRADIENTS)
                wire.send(losses, 0, TAG_LOSSES)
        for task in range(n_tasks):
            task_flat = ParameterVector.of_tensors(tasks[task])
            if rank == 0:
                buf = np.empty(task_flat.size, dtype=np.float32)
                wire.recv(buf, int(owner[task]), TAG_TASK_VECTOR)
                task_flat.set(buf)
            elif owner[task] == rank:
                wire.send(task_flat.get(), 0, TAG_TASK_VECTOR)
        if rank == 0:
            result.vector = shared_flat.get()
            if evaluate is not None and result.history:
                result.history[-1]["metric"] = evaluate(model)
        return result
    except BaseException:
        abort_all_ranks(comm, "asyncopt.deep.multilora")


# --------------------------------------------------------------------------- experiment

def multitask_regression(n_tasks=8, d=32, m=32, r=4, n_train=128, n_val=128, n_test=1000,
                         noise=1.0, weight_noise=0.1, seed=0, dtype=torch.float32):
    """The specification's small experiment: k linear regressions sharing an input factor.

    The k tasks are regressions on one pre-trained W0 whose true updates share an input
    factor.

    W0 (m, d) and b0 (m,) ~ N(0, 1/d) and N(0, 1): the "pre-trained" layer; A* (r, d) with
    orthonormal rows (common to all tasks); per task B_i* (m, r) ~ N(0, 1) and a
    task-specific perturbation E_i (m, d) ~ N(0, weight_noise^2 r / d), so
    dW_i* = B_i* A* + E_i (||E_i||_F^2 / ||B_i* A*||_F^2 ~ weight_noise^2); x ~ N(0, I_d),
    y = x (W0 + dW_i*)^T + b0 + noise * N(0, I_m). Returns a dict with ``W0``, ``b0``,
    ``A_true``, ``B_true`` (k, m, r), ``dW_true`` (k, m, d) and, per split ``train``,
    ``val``, ``test``, the lists ``X_<split>``, ``Y_<split>`` of k tensors. The optimum
    test MSE per output entry is noise^2; W0 alone scores about r + weight_noise^2 r +
    noise^2.
    """
    g = torch.Generator().manual_seed(int(seed))

    def normal(*shape, std=1.0):
        return std * torch.randn(*shape, generator=g, dtype=torch.float64)

    W0, b0 = normal(m, d, std=d ** -0.5), normal(m)
    A_true = torch.linalg.qr(normal(d, r))[0].T
    B_true = normal(n_tasks, m, r)
    dW_true = B_true @ A_true + normal(n_tasks, m, d, std=weight_noise * (r / d) ** 0.5)
    data = {"W0": W0, "b0": b0, "A_true": A_true, "B_true": B_true, "dW_true": dW_true}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        X = [normal(n, d) for _ in range(n_tasks)]
        Y = [x @ (W0 + dW).T + b0 + noise * normal(n, m) for x, dW in zip(X, dW_true)]
        data["X_" + split], data["Y_" + split] = X, Y
    return {k: [t.to(dtype) for t in v] if isinstance(v, list) else v.to(dtype)
            for k, v in data.items()}
