"""LoRA, low-rank adaptation of frozen linear layers (Hu et al. 2021, eq. 3; paper 000
section 3 and paper 003 section 2 use it as the tuned part of the foundation model).

A :class:`LoRALinear` wraps a frozen ``nn.Linear`` W0 (weight of shape (m, d), y = x W0^T
+ b) and adds a rank-r update

    y = x W0^T + b + (alpha / r) * dropout(x) A^T B^T,    A: (r, d), B: (m, r),

A drawn as PEFT draws it (``kaiming_uniform_(a=sqrt(5))``), B = 0, so the wrapped layer
starts as W0 exactly. Only A and B are trainable. :meth:`LoRALinear.merged_weight` is W0 +
(alpha / r) B A.

:func:`attach_lora` replaces every ``nn.Linear`` whose attribute name is one of
``targets`` (default the attention projections ``q``, ``k``, ``v``, ``o`` of
:mod:`asyncopt.deep.transformer`) and freezes the rest of the model except the modules
named in ``trainable`` (the task head). :func:`adapter_vector` is the
:class:`~asyncopt.deep.federated.ParameterVector` of what is trainable (adapters, then the
head, in ``named_parameters`` order): the flat float32 vector that travels to the parameter
server. Two models whose adapted layers have the same shapes (a foundation model and its
compressed proxy, which differ only in their FFNs) have the same adapter layout, so a
vector trained on one loads into the other unchanged.

PEFT's ``LoraConfig`` does the same for Hugging Face models, but it requires
``transformers`` and ``accelerate``; this module is the part the bridge needs,
with no dependency beyond torch.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .federated import ParameterVector

ATTENTION_TARGETS = ("q", "k", "v", "o")


RANDOM_INITS = ("kaiming", "gaussian", "orthogonal")


def init_random_factor(tensor, how="kaiming"):
    """Fill a random low-rank factor in place: ``"kaiming"`` (PEFT's
    ``kaiming_uniform_(a=sqrt(5))``, LoRA's A), ``"gaussian"`` (N(0, 1) entries),
    ``"orthogonal"`` (orthonormal rows or columns) or a callable ``how(tensor)``. Meta
    tensors are left as they are."""
    if tensor.device.type == "meta":
        return tensor
    with torch.no_grad():
        if callable(how):
            how(tensor)
        elif how == "kaiming":
            nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))
        elif how == "gaussian":
            nn.init.normal_(tensor)
        elif how == "orthogonal":
            nn.init.orthogonal_(tensor)
        else:
            raise ValueError(f"a random factor's init must be one of {RANDOM_INITS} or a "
                             f"callable, got {how!r}")
    return tensor


class LowRankLinear(nn.Module):
    """What :class:`LoRALinear` and Multi-LoRA's layer share: a frozen ``nn.Linear`` W0
    kept as the submodule ``base`` (its weight and bias frozen in place), the rank ``r``,
    ``alpha`` and ``scale`` s = alpha / r (``alpha=None``: s = 1), the dropout on the
    update's input, and

        y = x W0^T + b + s * dropout(x) A^T B^T,    merged weight W0 + s B A,

    for the factors (A, B) that :meth:`factors` returns. A subclass creates its factors
    ``lora_A`` / ``lora_B`` in ``_init_factors(**options)`` (with :meth:`new_factor`),
    which ``__init__`` calls after the common set-up and before the dropout;
    ``kind`` names the layer in error messages."""

    kind = "LoRA"

    def __init__(self, base, r, alpha, dropout, **options):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"{self.kind} wraps nn.Linear, got {type(base).__name__}")
        if int(r) < 1:
            raise ValueError(f"{self.kind} rank r must be >= 1, got {r}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.r = int(r)
        self.alpha = float(self.r if alpha is None else alpha)
        self.scale = self.alpha / self.r
        self._init_factors(**options)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def _init_factors(self, **options):
        raise NotImplementedError

    def new_factor(self, side, init=None):
        """Return a new factor ``nn.Parameter`` on W0's device and dtype.

        Parameters
        ----------
        side : {"A", "B"}
            ``"A"``: shape (r, d); ``"B"``: shape (m, r).
        init : str or callable, default=None
            None: zeros; else drawn by :func:`init_random_factor` (``"kaiming"``,
            ``"gaussian"``, ``"orthogonal"`` or a callable filling the tensor).

        Returns
        -------
        torch.nn.Parameter
            The factor.
        """
        shape = (self.r, self.in_features) if side == "A" else (self.out_features, self.r)
        factory = {"device": self.base.weight.device, "dtype": self.base.weight.dtype}
        if init is None:
            return nn.Parameter(torch.zeros(shape, **factory))
        return nn.Parameter(init_random_factor(torch.empty(shape, **factory), init))

    @property
    def in_features(self):
        """The input size d of the wrapped layer.
        """
        return self.base.in_features

    @property
    def out_features(self):
        """The output size m of the wrapped layer.
        """
        return self.base.out_features

    def factors(self, task=None):
        """(A, B) of the update ``forward`` applies."""
        raise NotImplementedError

    def forward(self, x):
        """Apply y = x W0^T + b + s * dropout(x) A^T B^T with the active factors.

        Parameters
        ----------
        x : torch.Tensor
            Inputs, (..., d).

        Returns
        -------
        torch.Tensor
            Outputs, (..., m).
        """
        A, B = self.factors()
        return self.base(x) + self.scale * F.linear(F.linear(self.dropout(x), A), B)

    def merged_weight(self, task=None):
        """Return W0 + s B A, the weight of the equivalent plain linear layer.

        Parameters
        ----------
        task : int, default=None
            Whose factors, where the layer has several; None: the active ones.

        Returns
        -------
        torch.Tensor
            Shape (m, d).
        """
        A, B = self.factors(task)
        return self.base.weight + self.scale * (B @ A)


class LoRALinear(LowRankLinear):
    """A frozen ``nn.Linear`` plus the trainable low-rank update (alpha / r) B A.

        y = x W0^T + b + (alpha / r) * dropout(x) A^T B^T,    A: (r, d), B: (m, r),

    A drawn by ``kaiming_uniform_(a=sqrt(5))`` (as PEFT), B = 0, so the layer starts as W0
    exactly (Hu et al. 2021, eq. 3). Only A and B train; ``base`` is kept as a submodule
    (its weight and bias frozen in place).

    Parameters
    ----------
    base : torch.nn.Linear
        The layer W0 (weight (m, d)).
    r : int, default=4
        The rank, >= 1.
    alpha : float, default=16.0
        The scale numerator: s = alpha / r (None: s = 1).
    dropout : float, default=0.0
        Dropout on the update's input.

    Attributes
    ----------
    lora_A : torch.nn.Parameter
        A, (r, d).
    lora_B : torch.nn.Parameter
        B, (m, r).
    scale : float
        s = alpha / r.
    base : torch.nn.Linear
        The frozen layer.
    """

    def __init__(self, base, r=4, alpha=16.0, dropout=0.0):
        super().__init__(base, r, alpha, dropout)

    def _init_factors(self):
        self.lora_A = self.new_factor("A", "kaiming")
        self.lora_B = self.new_factor("B")

    def factors(self, task=None):
        """Return (A, B); the layer has one update, so ``task`` is not used.

        Parameters
        ----------
        task : int, default=None
            Ignored.

        Returns
        -------
        tuple of torch.nn.Parameter
            (A, B).
        """
        return self.lora_A, self.lora_B

    def extra_repr(self):
        """Return the rank and alpha for the module's repr.

        Returns
        -------
        str
            ``"r=..., alpha=..."``.
        """
        return f"r={self.r}, alpha={self.alpha:g}"


def is_adapter_parameter(name):
    """Whether the qualified parameter name is a low-rank factor (a ``lora_A`` / ``lora_B``
    of :class:`LoRALinear` or of Multi-LoRA's layer)."""
    return ".lora_" in f".{name}"


def adapter_parameter_count(model):
    """Scalars in the adapter factors of ``model`` (:func:`is_adapter_parameter`; shared
    and per-task, trainable or frozen; bases and heads excluded): what LoRA papers count
    as the tuned parameters. Works on meta-device models."""
    return int(sum(p.numel() for name, p in model.named_parameters()
                   if is_adapter_parameter(name)))


def freeze_except(model, trainable=()):
    """Freeze every parameter of ``model`` except LoRA factors and the parameters of the
    submodules whose qualified names are in ``trainable``."""
    trainable = tuple(trainable)
    for name, p in model.named_parameters():
        keep = is_adapter_parameter(name) or any(
            name == t or name.startswith(t + ".") for t in trainable)
        p.requires_grad_(keep)
    return model


def attach_lora(model, targets=ATTENTION_TARGETS, r=4, alpha=16.0, dropout=0.0,
                trainable=("head",)):
    """Wrap the named ``nn.Linear`` layers of ``model`` in :class:`LoRALinear`, in place.

    Every ``nn.Linear`` whose attribute name is in ``targets`` is wrapped; then everything
    but the adapters and the submodules named in ``trainable`` is frozen.

    Parameters
    ----------
    model : torch.nn.Module
        The model, changed in place.
    targets : iterable of str, default=("q", "k", "v", "o")
        Attribute names of the layers to wrap (the attention projections of
        :mod:`asyncopt.deep.transformer`).
    r : int, default=4
        The rank.
    alpha : float, default=16.0
        The scale numerator (s = alpha / r).
    dropout : float, default=0.0
        Dropout on the updates' input.
    trainable : iterable of str, default=("head",)
        Qualified names of submodules left trainable (the task head).

    Returns
    -------
    list of str
        The qualified names of the wrapped layers.

    Raises
    ------
    ValueError
        If no layer matched.
    """
    wrapped = wrap_linear_layers(
        model, targets, lambda base: LoRALinear(base, r=r, alpha=alpha, dropout=dropout))
    freeze_except(model, trainable)
    return wrapped


def wrap_linear_layers(model, targets, wrap):
    """Replace, in place, every ``nn.Linear`` of ``model`` whose attribute name is in
    ``targets`` by ``wrap(layer)``; return the qualified names replaced (an error if
    none matched). The one traversal LoRA and Multi-LoRA attach with."""
    targets = set(targets)
    wrapped = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                setattr(parent, child_name, wrap(child))
                wrapped.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    if not wrapped:
        raise ValueError(f"no nn.Linear named one of {sorted(targets)} in the model")
    return wrapped


def lora_layers(model):
    """The :class:`LoRALinear` layers of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def adapter_vector(model):
    """Return the :class:`ParameterVector` of the trainable parameters (adapters and head).

    It is the vector FedPFT's and Multi-LoRA's clients send, 4 bytes per entry; two models
    whose adapted layers have the same shapes have the same layout.

    Parameters
    ----------
    model : torch.nn.Module
        A model with adapters attached.

    Returns
    -------
    ParameterVector
        Trainable parameters only, no buffers.
    """
    return ParameterVector(model, buffers=False, trainable_only=True)


def trainable_parameter_count(model):
    """Number of trainable scalars of ``model``."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))
