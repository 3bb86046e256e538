"""Block proximal operators on structured groups of torch parameters.

docs/design.md §6; docs/deep_methods.md, "ATO". A structured group g is a set of slices
of one or more tensors; the usual one is a zero-invariant group (ZIG): output channel c
of a conv weight (``weight[c]``) together with ``bn.weight[c]`` and ``bn.bias[c]``, so
that zeroing the group zeroes that channel's output exactly. :class:`ParamGroupSpec`
describes G such groups; its operations run one vectorised pass per tensor
(index_select / index_add_ / index_copy_), never a Python loop over groups.

Operators (x_g: the entries of group g, concatenated over its slices):

- group soft-threshold, the prox of t_g ||.||_2 (``asyncopt.penalties.block_soft_threshold_``,
  the ATO prox step z_g <- z_g max(0, 1 - eta lam_g / ||z_g||_2)):

      x_g <- x_g * max(0, 1 - t_g / ||x_g||_2)     (x_g <- 0 when ||x_g||_2 <= t_g)
      t_g = step * lam_g * w_g                     (the engine's threshold convention)

  Groups of one entry (:meth:`ParamGroupSpec.elementwise`) give L1 soft-thresholding.
- half-space projection (HSPG of OTO, the alternative operator of ATO), with x^_g the
  value of the group before the inner optimizer's step:

      x_g <- x_g - step * lam_g * w_g * x^_g / ||x^_g||_2     (only where x^_g != 0)
      x_g <- 0                              if <x_g, x^_g> < eps * ||x^_g||_2^2

  The first line is the group-Lasso gradient step of HSPG (skipped when lam = 0, leaving
  the pure projection); a group that is zero before the step is left as the step made it.

:class:`ProxOptimizer` wraps any ``torch.optim`` optimizer and applies one operator per
prox group after every inner ``step``.
"""
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

OPERATORS = ("soft_threshold", "half_space")


@dataclass
class _Member:
    """The slices of one tensor taken by a spec: ``slices[k]`` (an index along ``dim``;
    ``dim=None`` indexes the entries of the flattened tensor) belongs to group
    ``groups[k]``. ``full``: the slices are 0..n_slices-1 in order (no gather needed)."""
    tensor: torch.Tensor
    dim: object
    slices: torch.Tensor
    groups: torch.Tensor
    full: bool

    def target(self):
        """(tensor, dim) that the slice indices refer to (flattened when dim is None)."""
        data = self.tensor.detach()
        return (data.view(-1), 0) if self.dim is None else (data, self.dim)

    def indices(self, device):
        if self.slices.device != device:          # the module was moved after the spec
            self.slices, self.groups = self.slices.to(device), self.groups.to(device)
        return self.slices, self.groups


class ParamGroupSpec:
    """G structured groups of torch parameters, each a list of tensor slices.

    Groups must be disjoint and non-empty; every tensor must be contiguous, and all share
    one dtype and device. Shortcuts: :meth:`aligned` (slice g of every tensor is group g,
    e.g. conv out-channels with their BN parameters), :meth:`output_channels` (the same for
    modules' ``weight`` and ``bias``) and :meth:`elementwise` (one group per entry: L1).

    Parameters
    ----------
    groups : sequence of sequences of (tensor, dim, index)
        ``groups[g]`` lists the slices of group g: the slice ``index`` of ``tensor`` along
        ``dim`` (``dim=None``: the single entry ``tensor.view(-1)[index]``).

    Attributes
    ----------
    n_groups : int
        G.
    sizes : ndarray of int64, shape (G,)
        Entries per group.
    dtype : torch.dtype
        The tensors' dtype.
    device : torch.device
        The tensors' device.

    See Also
    --------
    ProxOptimizer : Applies a block operator to such groups after every step.
    """

    def __init__(self, groups):
        groups = [list(group) for group in groups]
        if not groups:
            raise ValueError("ParamGroupSpec needs at least one group")
        listed = OrderedDict()            # (id(tensor), dim) -> (tensor, [(index, g)])
        for g, group in enumerate(groups):
            if not group:
                raise ValueError(f"group {g} is empty")
            for item in group:
                if len(item) != 3:
                    raise ValueError(f"group {g}: expected (tensor, dim, index), got {item!r}")
                tensor, dim, index = item
                if not isinstance(tensor, torch.Tensor):
                    raise TypeError(f"group {g}: {type(tensor).__name__} is not a tensor")
                key = (id(tensor), None if dim is None else int(dim) % max(tensor.dim(), 1))
                listed.setdefault(key, (tensor, []))[1].append((int(index), g))
        members = []
        for (_, dim), (tensor, pairs) in listed.items():
            index, owner = (np.array(column, dtype=np.int64) for column in zip(*pairs))
            members.append(self._member(tensor, dim, index, owner))
        self._init(members, len(groups))

    @classmethod
    def aligned(cls, tensors_and_dims):
        """Make group g the slice g along ``dim`` of every listed tensor.

        All tensors must have the same size along their dim, e.g.
        ``aligned([(conv.weight, 0), (bn.weight, 0), (bn.bias, 0)])``.

        Parameters
        ----------
        tensors_and_dims : iterable of (tensor, int)
            The tensors and the dim along which each is sliced.

        Returns
        -------
        ParamGroupSpec
            One group per slice index.
        """
        tensors_and_dims = list(tensors_and_dims)
        if not tensors_and_dims:
            raise ValueError("aligned() needs at least one (tensor, dim)")
        sizes = {tensor.shape[dim] for tensor, dim in tensors_and_dims}
        if len(sizes) != 1:
            raise ValueError(f"aligned tensors differ in size along their dims: {sorted(sizes)}")
        n_groups = sizes.pop()
        spec = cls.__new__(cls)
        ar = np.arange(n_groups)
        spec._init([cls._member(tensor, int(dim) % tensor.dim(), ar, ar)
                    for tensor, dim in tensors_and_dims], n_groups)
        return spec

    @classmethod
    def output_channels(cls, *modules):
        """Make one group per output channel (row) of the modules' ``weight`` and ``bias``.

        The slices are along dim 0: the zero-invariant groups of Conv/Linear followed by
        BatchNorm/GroupNorm (``output_channels(conv, bn)``). Parameters that are None are
        skipped.

        Parameters
        ----------
        *modules : torch.nn.Module
            Modules with ``weight`` and (optionally) ``bias`` of equal size along dim 0.

        Returns
        -------
        ParamGroupSpec
            One group per output channel.
        """
        members = [(param, 0) for module in modules for name in ("weight", "bias")
                   if (param := getattr(module, name, None)) is not None]
        return cls.aligned(members)

    @classmethod
    def elementwise(cls, tensors):
        """Make one group per entry of every tensor, numbered tensor by tensor (L1).

        Parameters
        ----------
        tensors : iterable of torch.Tensor
            The tensors.

        Returns
        -------
        ParamGroupSpec
            One group per entry.
        """
        tensors = list(tensors)
        if not tensors:
            raise ValueError("elementwise() needs at least one tensor")
        spec = cls.__new__(cls)
        members, offset = [], 0
        for tensor in tensors:
            n = tensor.numel()
            members.append(cls._member(tensor, None, np.arange(n), offset + np.arange(n)))
            offset += n
        spec._init(members, offset)
        return spec

    @staticmethod
    def _member(tensor, dim, index, owner):
        if not tensor.is_contiguous():
            raise ValueError("ParamGroupSpec needs contiguous tensors")
        n_slices = tensor.numel() if dim is None else tensor.shape[dim]
        if index.size and (index.min() < 0 or index.max() >= n_slices):
            raise ValueError(f"slice index out of range [0, {n_slices}) for a tensor of "
                             f"shape {tuple(tensor.shape)} along dim {dim}")
        order = np.argsort(index, kind="stable")
        index, owner = index[order], owner[order]
        if np.any(np.diff(index) == 0):
            raise ValueError(f"a slice of a tensor of shape {tuple(tensor.shape)} (dim {dim}) "
                             "is listed twice: groups must be disjoint")
        full = index.size == n_slices          # sorted, unique and in range: 0..n-1
        as_long = lambda a: torch.as_tensor(a, dtype=torch.long, device=tensor.device)  # noqa: E731
        return _Member(tensor, dim, as_long(index), as_long(owner), bool(full))

    def _init(self, members, n_groups):
        dims = {}
        for member in members:
            dims.setdefault(id(member.tensor), set()).add(member.dim)
        if any(len(d) > 1 for d in dims.values()):
            raise ValueError("a tensor is sliced along two different dims: groups could "
                             "overlap; slice each tensor along one dim")
        kinds = {(m.tensor.dtype, m.tensor.device) for m in members}
        if len(kinds) != 1:
            raise ValueError(f"the tensors of a spec must share dtype and device, got {kinds}")
        self._members = members
        self.n_groups = int(n_groups)
        self.dtype, self.device = kinds.pop()
        sizes = np.zeros(self.n_groups, dtype=np.int64)
        for m in members:
            per_slice = 1 if m.dim is None else m.tensor.numel() // max(m.tensor.shape[m.dim], 1)
            np.add.at(sizes, m.groups.cpu().numpy(), per_slice)
        if np.any(sizes == 0):
            raise ValueError(f"group {int(np.argmax(sizes == 0))} has no entries")
        self.sizes = sizes

    @property
    def tensors(self):
        """The tensors the groups slice (each once)."""
        return [m.tensor for m in self._members]

    # -- vectorised group operations (one pass per tensor) -------------------------------

    @staticmethod
    def _rows(member, values=None):
        """(n_listed_slices, slice_size) matrix of the member's slices (``values``, a
        snapshot's matrix, is returned as it is)."""
        if values is not None:
            return values
        data, dim = member.target()
        moved = data.movedim(dim, 0)
        if not member.full:
            moved = moved.index_select(0, member.indices(data.device)[0])
        return moved.reshape(moved.shape[0], -1)

    def snapshot(self):
        """Return a copy of every group's current values.

        It is the reference x^ of the half-space projection.

        Returns
        -------
        list of torch.Tensor
            One (n_listed_slices, slice_size) matrix per member tensor.
        """
        return [self._rows(m).clone() for m in self._members]

    def _reduce(self, per_slice_rows):
        out = torch.zeros(self.n_groups, dtype=self.dtype, device=self.device)
        for member, rows in zip(self._members, per_slice_rows):
            out.index_add_(0, member.indices(rows.device)[1], rows.sum(dim=1))
        return out

    def sq_norms(self, values=None):
        """Return ||x_g||_2^2 for every group.

        Parameters
        ----------
        values : list of torch.Tensor, default=None
            A :meth:`snapshot` to take the norms of; None: the current values.

        Returns
        -------
        torch.Tensor
            Shape (G,), in the spec's dtype.
        """
        values = values or [None] * len(self._members)
        return self._reduce([self._rows(m, v).square() for m, v in zip(self._members, values)])

    def dots(self, reference):
        """Return <x_g, x^_g> for every group.

        Parameters
        ----------
        reference : list of torch.Tensor
            A :meth:`snapshot` x^.

        Returns
        -------
        torch.Tensor
            Shape (G,).
        """
        return self._reduce([self._rows(m) * ref for m, ref in zip(self._members, reference)])

    def _write(self, member, make):
        """x_slices <- make(x_slices, broadcast_shape) on the member's listed slices."""
        data, dim = member.target()
        slices, _ = member.indices(data.device)
        shape = [1] * data.dim()
        shape[dim] = slices.numel()
        if member.full:
            data.copy_(make(data, shape))
        else:
            data.index_copy_(dim, slices, make(data.index_select(dim, slices), shape))

    def scale_(self, factors):
        """Scale every group in place: x_g <- factors[g] * x_g.

        Parameters
        ----------
        factors : torch.Tensor
            Shape (G,), on the spec's device.
        """
        for m in self._members:
            per_slice = factors.index_select(0, m.indices(factors.device)[1])
            self._write(m, lambda x, shape, f=per_slice: x * f.view(shape))

    def add_scaled_(self, reference, coefficients):
        """Add scaled reference values in place: x_g <- x_g + coefficients[g] * x^_g.

        Parameters
        ----------
        reference : list of torch.Tensor
            A :meth:`snapshot` x^.
        coefficients : torch.Tensor
            Shape (G,).
        """
        for m, ref in zip(self._members, reference):
            per_slice = coefficients.index_select(0, m.indices(coefficients.device)[1])
            data, dim = m.target()
            rest = list(data.movedim(dim, 0).shape[1:])

            def make(x, shape, ref=ref, f=per_slice, rest=rest, dim=dim):
                step = (ref * f[:, None]).reshape([ref.shape[0]] + rest).movedim(0, dim)
                return x + step
            self._write(m, make)

    def as_group_tensor(self, value, name="value"):
        """Return ``value`` (a scalar or G numbers) as a (G,) tensor of the spec's dtype.

        Parameters
        ----------
        value : float or array-like
            A scalar (broadcast to every group) or G values.
        name : str, default="value"
            The name used in the error message.

        Returns
        -------
        torch.Tensor
            Shape (G,).

        Raises
        ------
        ValueError
            If ``value`` has another shape.
        """
        out = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        if out.dim() == 0:
            return out.expand(self.n_groups)
        if out.shape != (self.n_groups,):
            raise ValueError(f"{name} must be a scalar or have shape ({self.n_groups},), "
                             f"got {tuple(out.shape)}")
        return out


@torch.no_grad()
def group_soft_threshold_(spec, thresholds):
    """Apply the group soft-threshold, the prox of t_g ||.||_2, in place.

    For every group, x_g <- x_g max(0, 1 - t_g / ||x_g||_2) (x_g <- 0 when
    ||x_g|| <= t_g), exactly as ``asyncopt.penalties.block_soft_threshold_``.

    Parameters
    ----------
    spec : ParamGroupSpec
        The groups.
    thresholds : float or array-like
        t_g: a scalar or G values.

    Returns
    -------
    torch.Tensor
        The (G,) scales max(0, 1 - t_g / ||x_g||) applied.
    """
    t = spec.as_group_tensor(thresholds, "thresholds")
    norms = spec.sq_norms().sqrt()
    scales = torch.where(norms <= t, torch.zeros_like(norms), 1.0 - t / norms)
    spec.scale_(scales)
    return scales


@torch.no_grad()
def half_space_project_(spec, reference, eps=0.0):
    """Apply HSPG's half-space projection in place.

    x_g <- 0 for every group with <x_g, x^_g> < eps ||x^_g||_2^2, x^ a
    :meth:`ParamGroupSpec.snapshot` taken before the step.

    Parameters
    ----------
    spec : ParamGroupSpec
        The groups.
    reference : list of torch.Tensor
        The snapshot x^.
    eps : float, default=0.0
        The projection's margin.

    Returns
    -------
    torch.Tensor
        The (G,) bool mask of the groups it zeroed.
    """
    zeroed = spec.dots(reference) < eps * spec.sq_norms(reference)
    spec.scale_((~zeroed).to(spec.dtype))
    return zeroed


class ProxOptimizer(torch.optim.Optimizer):
    """Proximal wrapper: ``inner.step()``, then a block operator on each prox group.

    ``param_groups`` and ``state`` are the inner optimizer's (LR schedulers attached to the
    wrapper drive the inner lr). ``state_dict()`` holds the inner state dict and the prox
    groups' options (not the specs, which refer to live tensors).

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The inner optimizer; it must optimize every tensor the specs slice.
    groups : ParamGroupSpec, dict or list of these
        The prox groups, like torch's parameter groups: a spec, a dict
        ``{"spec": spec, **options}``, or a list of them; options missing from a dict take
        the keyword defaults below.
    operator : {"soft_threshold", "half_space"}, default="soft_threshold"
        The prox of step lam_g w_g ||.||_2, or the HSPG projection with ``eps`` (module
        docstring).
    lam : float or array-like, default=0.0
        The strength, a scalar or one value per group (ATO's lam_g = lam (1 - w_g)).
    weights : float or array-like, default=1.0
        w_g, a scalar or one value per group (the engine's GroupL1 default is
        ``spec.sizes ** 0.5``).
    eps : float, default=0.0
        The margin of the half-space projection.
    step : float or None, default=None
        The step eta of the threshold; None takes the ``lr`` of the inner optimizer's
        parameter group that holds the spec's tensors, read at every step (so LR schedulers
        apply; the tensors of one spec must share one lr).

    Attributes
    ----------
    optimizer : torch.optim.Optimizer
        The inner optimizer.
    prox_groups : list of dict
        The prox groups (``spec`` and options), which may be edited between steps.
    defaults : dict
        The keyword defaults.

    See Also
    --------
    group_soft_threshold_ : The soft-threshold operator.
    half_space_project_ : The half-space projection.
    """

    def __init__(self, optimizer, groups, *, operator="soft_threshold", lam=0.0,
                 weights=1.0, eps=0.0, step=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.defaults = {"operator": operator, "lam": lam, "weights": weights, "eps": eps,
                         "step": step}
        # torch.optim.Optimizer.__init__ would build param_groups of its own; set up only
        # the hook tables it keeps, so that step hooks and LR schedulers work.
        for table in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                      "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                      "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, table, OrderedDict())
        self._patch_step_function()
        self._warned_capturable_if_run_uncaptured = True
        if isinstance(groups, (ParamGroupSpec, dict)):
            groups = [groups]
        self.prox_groups = []
        for group in groups:
            group = {"spec": group} if isinstance(group, ParamGroupSpec) else dict(group)
            if not isinstance(group.get("spec"), ParamGroupSpec):
                raise TypeError("every prox group needs a ParamGroupSpec under 'spec'")
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            self._check_group(group)
            self.prox_groups.append(group)
        optimized = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for k, group in enumerate(self.prox_groups):
            if any(id(t) not in optimized for t in group["spec"].tensors):
                raise ValueError(f"prox group {k} slices a tensor the inner optimizer "
                                 "does not optimize")

    @staticmethod
    def _check_group(group):
        if group["operator"] not in OPERATORS:
            raise ValueError(f"operator must be one of {OPERATORS}, got {group['operator']!r}")
        spec = group["spec"]
        lam = spec.as_group_tensor(group["lam"], "lam")
        weights = spec.as_group_tensor(group["weights"], "weights")
        if torch.any(lam < 0) or torch.any(weights < 0):
            raise ValueError("lam and weights must be >= 0")

    @property
    def param_groups(self):
        """The inner optimizer's parameter groups.
        """
        return self.optimizer.param_groups

    @property
    def state(self):
        """The inner optimizer's state.
        """
        return self.optimizer.state

    def __getstate__(self):
        return dict(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._patch_step_function()

    def __repr__(self):
        options = [{k: v for k, v in g.items() if k != "spec"} | {"n_groups": g["spec"].n_groups}
                   for g in self.prox_groups]
        return f"ProxOptimizer({self.optimizer!r},\n  prox_groups={options})"

    def add_param_group(self, param_group):
        """Add a parameter group to the inner optimizer.

        Parameters
        ----------
        param_group : dict
            As for ``torch.optim.Optimizer.add_param_group``.
        """
        self.optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none=True):
        """Reset the gradients of the inner optimizer's parameters.

        Parameters
        ----------
        set_to_none : bool, default=True
            As for ``torch.optim.Optimizer.zero_grad``.
        """
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step_size(self, group):
        """Return the step eta of a prox group.

        Parameters
        ----------
        group : dict
            One of ``prox_groups``.

        Returns
        -------
        float
            The group's ``step``, or the lr of its tensors' inner group.
        """
        if group["step"] is not None:
            return float(group["step"])
        owner = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        lrs = {float(owner[id(t)]["lr"]) for t in group["spec"].tensors}
        if len(lrs) != 1:
            raise ValueError(f"the tensors of a prox group have different lr {sorted(lrs)}: "
                             "give the group an explicit 'step'")
        return lrs.pop()

    def thresholds(self, group):
        """Return the thresholds t_g = step * lam_g * w_g of a prox group.

        Parameters
        ----------
        group : dict
            One of ``prox_groups``.

        Returns
        -------
        torch.Tensor
            Shape (G,).
        """
        spec = group["spec"]
        return (self.step_size(group) * spec.as_group_tensor(group["lam"], "lam")
                * spec.as_group_tensor(group["weights"], "weights"))

    def step(self, closure=None):
        """Take one inner step, then apply each prox group's operator.

        Parameters
        ----------
        closure : callable, default=None
            Passed on to the inner step.

        Returns
        -------
        object
            What the inner step returned (the closure's loss).
        """
        references = [g["spec"].snapshot() if g["operator"] == "half_space" else None
                      for g in self.prox_groups]
        loss = self.optimizer.step(closure)
        with torch.no_grad():
            for group, reference in zip(self.prox_groups, references):
                spec, t = group["spec"], self.thresholds(group)
                if group["operator"] == "soft_threshold":
                    group_soft_threshold_(spec, t)
                    continue
                if torch.any(t != 0):
                    norms = spec.sq_norms(reference).sqrt()
                    coefficients = torch.where(norms > 0, -t / norms, torch.zeros_like(t))
                    spec.add_scaled_(reference, coefficients)
                half_space_project_(spec, reference, group["eps"])
        return loss

    def state_dict(self):
        """Return the inner state dict and the prox groups' options.

        Returns
        -------
        dict
            ``{"inner": inner state dict, "prox_groups": [options and n_groups per
            group]}``.
        """
        def copy(value):
            return value.detach().clone() if isinstance(value, torch.Tensor) else \
                np.array(value) if isinstance(value, np.ndarray) else value
        return {"inner": self.optimizer.state_dict(),
                "prox_groups": [{k: copy(v) for k, v in g.items() if k != "spec"}
                                | {"n_groups": g["spec"].n_groups} for g in self.prox_groups]}

    def load_state_dict(self, state_dict):
        """Load a :meth:`state_dict` (inner state and prox-group options).

        Parameters
        ----------
        state_dict : dict
            As returned by :meth:`state_dict`, for prox groups with the same group counts.
        """
        saved = state_dict["prox_groups"]
        if len(saved) != len(self.prox_groups):
            raise ValueError(f"state dict has {len(saved)} prox groups, this optimizer "
                             f"{len(self.prox_groups)}")
        for k, (group, options) in enumerate(zip(self.prox_groups, saved)):
            if options["n_groups"] != group["spec"].n_groups:
                raise ValueError(f"prox group {k}: state dict has {options['n_groups']} "
                                 f"groups, the spec {group['spec'].n_groups}")
            candidate = dict(group) | {k2: v for k2, v in options.items() if k2 != "n_groups"}
            self._check_group(candidate)
        self.optimizer.load_state_dict(state_dict["inner"])
        for group, options in zip(self.prox_groups, saved):
            group.update({k: v for k, v in options.items() if k != "n_groups"})
