"""FedPFT, federated proxy fine-tuning (paper 000; docs/deep_methods.md, "FedPFT").

The server keeps the foundation model (FM); clients fine-tune LoRA adapters (Q, K, V, O;
r = 4, alpha = 16) and the task head on a compressed proxy, the sub-FM; the server
averages them (FedAvg, ``asyncopt.deep.federated``) and plugs them into the FM.

- Sub-FM construction (section 3.4, eq. 8), :func:`build_sub_fm`: in every layer but the
  first and the last, keep the top ``1 - drop_ratio`` (default 25%) of the FFN neurons by
  saliency(i) = sqrt(sum_j (u_ij^2 + w_ji^2)), u_i the neuron's fan-in row of
  ``fc1.weight`` and w_i its fan-out column of ``fc2.weight``; attention is unchanged, so
  adapters have the same shapes on both models. Before any distillation the compressed
  FFN differs from the full one by exactly the dropped neurons' sum
  sum_{i dropped} act(u_i . a + b_i) w_i.
- Layer-level distillation before FL (section 3.5.1, eq. 13), :func:`distillation_loss`,
  :func:`distill`: over the L layers,

      (1/L) sum_l [ ||O_l - O'_l||^2 / mean(O_l^2) + mu ||W_l U_l - W'_l U'_l||_F^2 ],

  O_l, O'_l the layer-l outputs of FM and sub-FM on the distillation data (the paper's
  plain squared error, here normalised by the teacher's mean square so that layers of
  any scale weigh alike), W U the FFN's d x d product (the paper's W_1 W_2); mu = 1, the
  term kept in the graph (differentiable). Only the compressed FFNs and their
  LayerNorm train. The distillation data is the pretraining domain, not the task's.
- Neuron-level alignment during FL (section 3.5.2, eq. 14), every ``align_every`` = 10
  rounds: the round's clients report, per compressed neuron, how many of their token
  activations were exactly zero (:func:`zero_activation_counts`; APoZ needs a ReLU FFN);
  the server sums them, picks in each compressed FFN the p = 50% of neurons with the
  highest APoZ (:func:`select_by_apoz`) and re-distils only those neurons' parameters
  (fan-in row, bias, fan-out column) with the current adapters plugged into both models
  (:func:`align_neurons`); everything else stays bit-identical. The aligned neurons are
  sent to the clients of the next rounds.
- Bytes per round: 4 (adapters + head) per participant each way; in an alignment round
  also 4 (2 d + 1) per aligned neuron to each participant, and 4 per compressed neuron
  from each participant (its zero counts).

Baselines (:func:`run_fedpft` ``method=``): "fedpetuning" (LoRA on the full FM, FedAvg),
"fedot" (Offsite-Tuning's layer-drop emulator, :func:`layer_drop_emulator`: the first and
last layers kept as the adapter, LoRA of rank r L / 2 on them so that the trainable count
matches, the middle layers dropped uniformly to ``emulator_layers`` and distilled before
FL with the same loss), and the ablations "fedpft_n" (no distillation), "fedpft_b"
(before FL only), "fedpft_d" (during FL only).
"""
import copy
import math

import numpy as np
import torch
from torch import nn

from .ato import _train_epoch as train_epoch
from .ato import accuracy
from .fedlpfm import digits_pools
from .federated import (FLOAT32_BYTES, LocalTrainer, run_federated,
                        sample_clients)
from .lora import (adapter_parameter_count, attach_lora, freeze_except, is_adapter_parameter,
                   lora_layers, trainable_parameter_count)
from .transformer import FeedForward

METHODS = ("fedpetuning", "fedot", "fedpft", "fedpft_n", "fedpft_b", "fedpft_d")


def ffn_saliency(ffn):
    """saliency(i) = sqrt(sum_j u_ij^2 + w_ji^2) for every neuron i of ``ffn`` (eq. 8)."""
    u, w = ffn.fc1.weight.detach(), ffn.fc2.weight.detach()
    return torch.sqrt((u ** 2).sum(1) + (w ** 2).sum(0))


def top_neurons(ffn, keep_ratio):
    """Indices (ascending) of the round(keep_ratio d_ff) most salient neurons, at least 1."""
    d_ff = ffn.d_ff
    k = min(d_ff, max(1, int(round(keep_ratio * d_ff))))
    order = torch.argsort(ffn_saliency(ffn), descending=True, stable=True)
    return torch.sort(order[:k]).values


@torch.no_grad()
def compress_ffn(ffn, neurons):
    """A new :class:`FeedForward` holding only ``neurons`` of ``ffn`` (rows of fc1 and its
    bias, columns of fc2; fc2's bias kept)."""
    neurons = torch.as_tensor(neurons, dtype=torch.long)
    sub = FeedForward(ffn.fc1.in_features, len(neurons), ffn.activation)
    sub.to(ffn.fc1.weight.dtype)
    sub.fc1.weight.copy_(ffn.fc1.weight[neurons])
    sub.fc1.bias.copy_(ffn.fc1.bias[neurons])
    sub.fc2.weight.copy_(ffn.fc2.weight[:, neurons])
    sub.fc2.bias.copy_(ffn.fc2.bias)
    return sub


def compressed_layers(n_layers):
    """The layers FedPFT compresses: all but the first and the last."""
    return list(range(1, n_layers - 1))


def build_sub_fm(fm, drop_ratio=0.75):
    """Build the sub-FM: the FM with its middle FFNs cut to their most salient neurons.

    A deep copy of ``fm`` whose compressed layers (all but the first and the last) keep the
    top ``1 - drop_ratio`` FFN neurons by saliency(i) = sqrt(sum_j (u_ij^2 + w_ji^2))
    (paper 000, section 3.4, eq. 8); attention is unchanged, so adapters have the same
    shapes on both models.

    Parameters
    ----------
    fm : TransformerEncoder
        The foundation model (left as is).
    drop_ratio : float, default=0.75
        Fraction of FFN neurons dropped in every compressed layer, in [0, 1).

    Returns
    -------
    sub_fm : TransformerEncoder
        The compressed copy.
    kept : dict of int to torch.Tensor
        For each compressed layer, the kept neuron indices of the FM's FFN (ascending).
    """
    if not 0 <= drop_ratio < 1:
        raise ValueError(f"drop_ratio must be in [0, 1), got {drop_ratio}")
    sub = copy.deepcopy(fm)
    kept = {}
    for layer in compressed_layers(len(fm.layers)):
        neurons = top_neurons(fm.layers[layer].ffn, 1.0 - drop_ratio)
        sub.layers[layer].ffn = compress_ffn(fm.layers[layer].ffn, neurons)
        kept[layer] = neurons
    return sub, kept


def layer_drop_emulator(fm, emulator_layers=2):
    """Offsite-Tuning's emulator: the first and last layers of ``fm`` kept, the middle ones
    dropped uniformly to ``emulator_layers`` (deep copies). Returns ``(emulator,
    layer_map)``, ``layer_map[j]`` the FM layer that emulator layer j copies."""
    n = len(fm.layers)
    middle = np.arange(1, n - 1)
    keep = middle[np.round(np.linspace(0, len(middle) - 1, emulator_layers)).astype(int)]
    layer_map = [0] + sorted(set(int(i) for i in keep)) + [n - 1]
    emulator = copy.deepcopy(fm)
    emulator.layers = nn.ModuleList([copy.deepcopy(fm.layers[i]) for i in layer_map])
    return emulator, layer_map


def ffn_product(ffn):
    """W U (d x d): the FFN's fan-out times fan-in, the paper's W_1 W_2 transposed."""
    return ffn.fc2.weight @ ffn.fc1.weight


@torch.no_grad()
def teacher_ffn_products(fm, proxy, layer_map=None):
    """{FM layer i: its W U} for the FM layers ``layer_map[j]`` (identity for a sub-FM)
    whose proxy layer j has a narrower FFN: the frozen targets of eq. 13's W U term."""
    layer_map = range(len(proxy.layers)) if layer_map is None else layer_map
    return {i: ffn_product(fm.layers[i].ffn) for j, i in enumerate(layer_map)
            if proxy.layers[j].ffn.d_ff != fm.layers[i].ffn.d_ff}


def distillation_loss(fm_states, sub_states, fm, sub, layer_map=None, mu=1.0, mask=None,
                      fm_products=None):
    """Eq. 13 (module docstring) over the layer outputs ``fm_states[1:]`` (teacher) and
    ``sub_states[1:]``; ``layer_map[j]``: the FM layer matched by the proxy's layer j
    (identity for a sub-FM). The W U term runs over proxy layers whose FFN is narrower
    than the FM's. ``mask`` (batch, tokens): only positions with mask 1 count (padding
    of token-id batches left out). ``fm_products``: :func:`teacher_ffn_products` of
    (fm, sub, layer_map) when already computed."""
    n = len(sub_states) - 1
    layer_map = list(range(n)) if layer_map is None else layer_map
    if mu and fm_products is None:
        fm_products = teacher_ffn_products(fm, sub, layer_map)
    weight = None if mask is None else mask.to(sub_states[0].dtype)[..., None]

    def mean(t):
        return t.mean() if weight is None else (t * weight).sum() / (
            weight.sum() * t.shape[-1])

    total = 0.0
    for j, i in enumerate(layer_map):
        teacher = fm_states[i + 1].detach()
        total = total + mean((sub_states[j + 1] - teacher) ** 2) / (mean(teacher ** 2) + 1e-12)
        if mu and i in fm_products:
            diff = fm_products[i] - ffn_product(sub.layers[j].ffn)
            total = total + mu * (diff ** 2).sum()
    return total / n


def _distilled_parameters(proxy, layers):
    return [p for j in layers for module in (proxy.layers[j].ffn, proxy.layers[j].ffn_norm)
            for p in module.parameters()]


def distill(fm, proxy, X, *, layers, layer_map=None, epochs=5, lr=1e-3, mu=1.0,
            batch_size=64, seed=0, neuron_masks=None):
    """Minimise :func:`distillation_loss` over the FFN and FFN-LayerNorm parameters of the
    proxy's ``layers`` with AdamW on ``X`` (``epochs`` passes, possibly fractional).
    ``neuron_masks``: {layer: bool mask over its neurons}; when given only those neurons'
    fc1 rows and biases and fc2 columns change (the LayerNorm and fc2's bias stay): every
    other entry is restored after each step, so the rest is bit-identical. Returns the
    loss per step."""
    params = _distilled_parameters(proxy, layers)
    frozen_state = [p.requires_grad for p in proxy.parameters()]
    for p in proxy.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    X = torch.as_tensor(X)
    generator = torch.Generator().manual_seed(seed)
    n_steps = max(1, int(math.ceil(epochs * len(X) / batch_size)))
    saved = {id(p): p.detach().clone() for p in params} if neuron_masks else None
    was_training = (fm.training, proxy.training)
    fm.eval()
    proxy.eval()
    fm_products = teacher_ffn_products(fm, proxy, layer_map)
    losses = []
    for step in range(n_steps):
        batch = X[torch.randint(len(X), (min(batch_size, len(X)),), generator=generator)]
        with torch.no_grad():
            teacher = fm.hidden_states(batch)
        loss = distillation_loss(teacher, proxy.hidden_states(batch), fm, proxy, layer_map,
                                 mu, mask=fm.mask_of(batch), fm_products=fm_products)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if neuron_masks:
            _restore_unselected(proxy, layers, neuron_masks, saved)
        losses.append(float(loss.detach()))
    for p, flag in zip(proxy.parameters(), frozen_state):
        p.requires_grad_(flag)
    fm.train(was_training[0])
    proxy.train(was_training[1])
    return losses


@torch.no_grad()
def _restore_unselected(proxy, layers, neuron_masks, saved):
    for j in layers:
        ffn, norm = proxy.layers[j].ffn, proxy.layers[j].ffn_norm
        keep = ~torch.as_tensor(neuron_masks.get(j, torch.zeros(ffn.d_ff, dtype=torch.bool)))
        ffn.fc1.weight[keep] = saved[id(ffn.fc1.weight)][keep]
        ffn.fc1.bias[keep] = saved[id(ffn.fc1.bias)][keep]
        ffn.fc2.weight[:, keep] = saved[id(ffn.fc2.weight)][:, keep]
        for p in (ffn.fc2.bias, norm.weight, norm.bias):
            p.copy_(saved[id(p)])
        for p in (ffn.fc1.weight, ffn.fc1.bias, ffn.fc2.weight):
            saved[id(p)].copy_(p)


@torch.no_grad()
def zero_activation_counts(model, X, layers, batch_size=256):
    """For each of ``layers``: (zeros per neuron, tokens seen), zeros counting the token
    activations act(u_i . a + b_i) <= 0 on ``X`` (APoZ's numerator, eq. 14; APoZ_i =
    zeros_i / tokens). For ReLU that is exactly the zeros; for GELU, which is almost never
    exactly 0, it counts the inactive side u_i . a + b_i <= 0."""
    counts = {j: torch.zeros(model.layers[j].ffn.d_ff, dtype=torch.float64) for j in layers}
    tokens = {j: 0 for j in layers}
    handles = []
    for j in layers:
        def hook(module, inputs, output, j=j):
            flat = output.reshape(-1, output.shape[-1])
            counts[j] += (flat <= 0).sum(0).double()
            tokens[j] += flat.shape[0]
        handles.append(model.layers[j].ffn.act.register_forward_hook(hook))
    was = model.training
    model.eval()
    try:
        X = torch.as_tensor(X)
        for start in range(0, len(X), batch_size):
            model(X[start:start + batch_size])
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    return {j: (counts[j].numpy(), tokens[j]) for j in layers}


def select_by_apoz(reports, p=0.5):
    """Sum the clients' zero counts per layer and return {layer: bool mask} selecting the
    round(p d_ff) neurons of highest APoZ (ties to the lower index)."""
    layers = reports[0].keys()
    masks = {}
    for j in layers:
        zeros = sum(r[j][0] for r in reports)
        tokens = sum(r[j][1] for r in reports)
        apoz = zeros / max(tokens, 1)
        k = max(1, int(round(p * apoz.size)))
        chosen = np.argsort(-apoz, kind="stable")[:k]
        mask = np.zeros(apoz.size, dtype=bool)
        mask[chosen] = True
        masks[j] = torch.from_numpy(mask)
    return masks


def align_neurons(fm, sub, X, masks, *, epochs=0.2, lr=1e-3, mu=1.0, batch_size=64, seed=0):
    """Neuron-level alignment: :func:`distill` of the sub-FM toward the FM restricted to
    the neurons in ``masks``. Returns the loss per step."""
    return distill(fm, sub, X, layers=sorted(masks), epochs=epochs, lr=lr, mu=mu,
                   batch_size=batch_size, seed=seed, neuron_masks=masks)


def _renamed(name, layer_map):
    if layer_map is None or not name.startswith("layers."):
        return name
    _, j, rest = name.split(".", 2)
    return f"layers.{layer_map[int(j)]}.{rest}"


def _adapter_pairs(proxy, fm, layer_map=None):
    """(proxy parameter, FM parameter) for each trainable parameter of the proxy, matched
    by name (proxy layer j -> FM layer ``layer_map[j]``); an error if the FM lacks one
    or its shape differs."""
    fm_params = dict(fm.named_parameters())
    for name, p in proxy.named_parameters():
        if not p.requires_grad:
            continue
        target = fm_params.get(_renamed(name, layer_map))
        if target is None or target.shape != p.shape:
            raise ValueError(f"the FM has no parameter matching {name} {tuple(p.shape)}")
        yield p, target


@torch.no_grad()
def plug_adapters(proxy, fm, layer_map=None):
    """Copy the proxy's trainable parameters (LoRA factors and head) into the FM's
    parameters of the same name (proxy layer j -> FM layer ``layer_map[j]``). The FM must
    carry adapters of the same shapes; nothing else of the FM changes. Returns the
    number of scalars copied."""
    copied = 0
    for p, target in _adapter_pairs(proxy, fm, layer_map):
        target.copy_(p)
        copied += p.numel()
    return copied


def with_adapters(model, r=4, alpha=16.0, layers=None, n_classes=None, seed=0):
    """A deep copy of ``model`` with LoRA on Q, K, V, O of ``layers`` (all by default) and a
    fresh task head of ``n_classes`` outputs (seeded), everything else frozen."""
    torch.manual_seed(seed)
    model = copy.deepcopy(model)
    if n_classes is not None:
        model.head = nn.Linear(model.d_model, n_classes)
    targets = range(len(model.layers)) if layers is None else layers
    for j in targets:
        attach_lora(model.layers[j], r=r, alpha=alpha, trainable=())
    freeze_except(model, ("head",))
    return model


def adapter_gradient(model, X, y, layer_map=None):
    """The task loss's gradient over the trainable parameters, keyed by FM name (proxy
    layer j renamed to ``layer_map[j]``)."""
    model.zero_grad()
    was = model.training
    model.eval()
    loss = nn.functional.cross_entropy(model(torch.as_tensor(X)), torch.as_tensor(y).long())
    loss.backward()
    model.train(was)
    grads = {_renamed(n, layer_map): p.grad.detach().clone()
             for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return grads


GRADIENT_SCOPES = ("adapters", "all")


def relative_gradient_error(fm, proxy, X, y, layer_map=None, g_fm=None):
    """||g_proxy - g_FM|| / ||g_FM|| over the FM's trainable parameters, the proxy's
    gradient taken as 0 on adapters it does not have (layers a layer-drop emulator
    dropped). Both models must hold the same adapter values. ``g_fm``: the FM's
    ``adapter_gradient`` on (X, y) when the caller already has it. Returns {"adapters":
    the ratio over the LoRA factors only (the attention gradients of the paper's Theorem
    2), "all": over the LoRA factors and the head}."""
    if g_fm is None:
        g_fm = adapter_gradient(fm, X, y)
    g_proxy = adapter_gradient(proxy, X, y, layer_map)
    errors = {}
    for scope in GRADIENT_SCOPES:
        keys = [k for k in g_fm if scope == "all" or is_adapter_parameter(k)]
        num = sum(float(((g_proxy.get(k, torch.zeros_like(g_fm[k])) - g_fm[k]) ** 2).sum())
                  for k in keys)
        den = sum(float((g_fm[k] ** 2).sum()) for k in keys)
        errors[scope] = math.sqrt(num / den)
    return errors


def proxy_gradient_errors(fm, points, X, y, X_distill, *, drop_ratio=0.75,
                          distill_epochs=5, distill_lr=2e-3, mu=1.0, emulator_layers=2,
                          seed=0):
    """:func:`relative_gradient_error` of three proxies of ``fm`` at the adapters and head
    of each model in ``points`` ({label: the FM with LoRA on every layer}, e.g. the start
    of fine-tuning and FedPETuning's result): the sub-FM after layer-level distillation
    ("distilled"), the sub-FM as built ("undistilled") and the distilled layer-drop
    emulator of FedOT ("layer_drop"), on the task data (X, y). The proxies are built and
    distilled once for all points. Returns {label: {scope: {proxy: error}}} for the scopes
    of :data:`GRADIENT_SCOPES`."""
    fm = copy.deepcopy(fm).eval()
    sub, _ = build_sub_fm(fm, drop_ratio)
    distilled = copy.deepcopy(sub)
    distill(fm, distilled, X_distill, layers=compressed_layers(len(fm.layers)),
            epochs=distill_epochs, lr=distill_lr, mu=mu, seed=seed)
    emulator, layer_map = layer_drop_emulator(fm, emulator_layers)
    distill(fm, emulator, X_distill, layers=range(1, len(layer_map) - 1),
            layer_map=layer_map, epochs=distill_epochs, lr=distill_lr, mu=mu, seed=seed)
    errors = {}
    for label, tuned in points.items():
        first = next(iter(lora_layers(tuned).values()))
        r, alpha = first.r, first.alpha
        n_classes = tuned.head.out_features
        errors[label] = {scope: {} for scope in GRADIENT_SCOPES}
        g_fm = adapter_gradient(tuned, X, y)
        for name, proxy, mapping in (("distilled", distilled, None),
                                     ("undistilled", sub, None),
                                     ("layer_drop", emulator, layer_map)):
            proxy = with_adapters(proxy, r=r, alpha=alpha, n_classes=n_classes)
            with torch.no_grad():
                for p, source in _adapter_pairs(proxy, tuned, mapping):
                    p.copy_(source)
            for scope, value in relative_gradient_error(tuned, proxy, X, y, mapping,
                                                        g_fm).items():
                errors[label][scope][name] = value
    return errors


def parameter_count(model):
    """All scalars of ``model`` (what a client has to hold)."""
    return int(sum(p.numel() for p in model.parameters()))


def run_fedpft(fm, X, y, partition, X_test, y_test, X_distill, *, method="fedpft",
               n_classes=10, rounds=30, client_fraction=0.5, r=4, alpha=16.0, lr=2e-3,
               local_epochs=1, batch_size=16, drop_ratio=0.75, distill_epochs=5,
               distill_lr=2e-3, mu=1.0, align_every=10, align_fraction=0.5,
               align_epochs=0.2, emulator_layers=2, seed=0, verbose=False):
    """Fine-tune a pretrained FM federatedly by FedPFT or one of its baselines.

    The clients train LoRA adapters (Q, K, V, O) and the task head on a proxy (FedPFT: the
    distilled sub-FM; "fedpetuning": the FM itself; "fedot": the layer-drop emulator), the
    server averages them (FedAvg) and plugs them into the FM; FedPFT re-aligns the proxy's
    most-inactive neurons every ``align_every`` rounds (module docstring).

    Parameters
    ----------
    fm : TransformerEncoder
        The pretrained foundation model (copied, not changed).
    X : array-like
        All clients' inputs.
    y : array-like
        All clients' labels.
    partition : sequence of array-like of int
        Client -> row indices of ``X``.
    X_test : array-like
        Test inputs.
    y_test : array-like
        Test labels.
    X_distill : array-like
        Distillation data (the pretraining domain, not the task's).
    method : str, default="fedpft"
        One of METHODS: "fedpetuning", "fedot", "fedpft", "fedpft_n" (no distillation),
        "fedpft_b" (before FL only), "fedpft_d" (during FL only).
    n_classes : int, default=10
        Outputs of the task head.
    rounds : int, default=30
        Federated rounds.
    client_fraction : float, default=0.5
        Participating fraction per round.
    r : int, default=4
        LoRA rank.
    alpha : float, default=16.0
        LoRA scale numerator.
    lr : float, default=2e-3
        The clients' AdamW learning rate.
    local_epochs : int, default=1
        Local epochs per round.
    batch_size : int, default=16
        Local minibatch size.
    drop_ratio : float, default=0.75
        FFN neurons dropped in the sub-FM's compressed layers.
    distill_epochs : float, default=5
        Epochs of layer-level distillation before FL (0: none).
    distill_lr : float, default=2e-3
        AdamW learning rate of the distillations.
    mu : float, default=1.0
        Weight of eq. 13's W U term.
    align_every : int, default=10
        Rounds between neuron-level alignments (0: none).
    align_fraction : float, default=0.5
        Fraction p of each compressed FFN's neurons re-aligned, those of highest APoZ.
    align_epochs : float, default=0.2
        Epochs of each alignment.
    emulator_layers : int, default=2
        Middle layers kept by FedOT's emulator.
    seed : int, default=0
        Seed of the adapters, the batch orders and the client sampling.
    verbose : bool, default=False
        One line per round.

    Returns
    -------
    dict
        ``method``; ``acc`` (the FM with the averaged adapters plugged in, on the test
        set); ``proxy_acc`` (the proxy with them); ``history`` (the federated records, with
        alignment rounds' extra bytes); ``bytes_per_round`` (mean over rounds, both
        directions); ``client_params`` (scalars the client holds: the proxy with adapters);
        ``fm_params`` (the FM with adapters); ``trainable`` (adapters + head);
        ``lora_params``; ``model`` and ``proxy``, the tuned FM and proxy.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    L = len(fm.layers)
    fm = copy.deepcopy(fm).eval()
    layer_map = None
    if method == "fedpetuning":
        proxy = with_adapters(fm, r=r, alpha=alpha, n_classes=n_classes, seed=seed)
        target = proxy
    elif method == "fedot":
        emulator, layer_map = layer_drop_emulator(fm, emulator_layers)
        if distill_epochs:
            distill(fm, emulator, X_distill, layers=range(1, len(layer_map) - 1),
                    layer_map=layer_map, epochs=distill_epochs, lr=distill_lr, mu=mu,
                    seed=seed)
        r_ot = r * L // 2
        ends = (0, len(layer_map) - 1)
        proxy = with_adapters(emulator, r=r_ot, alpha=alpha * r_ot / r, layers=ends,
                              n_classes=n_classes, seed=seed)
        target = with_adapters(fm, r=r_ot, alpha=alpha * r_ot / r, layers=(0, L - 1),
                               n_classes=n_classes, seed=seed)
    else:
        sub, _ = build_sub_fm(fm, drop_ratio)
        if method in ("fedpft", "fedpft_b") and distill_epochs:
            distill(fm, sub, X_distill, layers=compressed_layers(L), epochs=distill_epochs,
                    lr=distill_lr, mu=mu, seed=seed)
        proxy = with_adapters(sub, r=r, alpha=alpha, n_classes=n_classes, seed=seed)
        target = with_adapters(fm, r=r, alpha=alpha, n_classes=n_classes, seed=seed)
    aligning = method in ("fedpft", "fedpft_d") and align_every
    trainer = LocalTrainer(X, y, partition, epochs=local_epochs, batch_size=batch_size,
                           seed=seed, make_optimizer=lambda p: torch.optim.AdamW(
                               p, lr=lr, weight_decay=0.0))
    n_clients = len(partition)
    chunk = align_every if aligning else rounds
    history, offset = [], 0
    rng = np.random.default_rng([seed, 1])
    d = fm.d_model
    while offset < rounds:
        extra_down = extra_up = 0
        if aligning and offset > 0:
            clients = sample_clients(rng, n_clients, client_fraction)
            reports = [zero_activation_counts(proxy, X[partition[c]], compressed_layers(L))
                       for c in clients if len(partition[c])]
            masks = select_by_apoz(reports, align_fraction)
            plug_adapters(proxy, target, layer_map)
            align_neurons(target, proxy, X_distill, masks, epochs=align_epochs,
                          lr=distill_lr, mu=mu, seed=seed + offset)
            n_aligned = sum(int(m.sum()) for m in masks.values())
            n_compressed = sum(proxy.layers[j].ffn.d_ff for j in compressed_layers(L))
            extra_down = FLOAT32_BYTES * (2 * d + 1) * n_aligned * len(clients)
            extra_up = FLOAT32_BYTES * n_compressed * len(clients)
        steps = min(chunk, rounds - offset)
        result = run_federated(
            proxy, lambda model, c, rr, o=offset: trainer(model, c, rr + o), n_clients,
            steps, client_fraction=client_fraction, seed=seed + offset,
            trainable_only=True, buffers=False, verbose=verbose, label=method)
        for k, record in enumerate(result.history):
            record = dict(record, round=offset + k)
            if k == 0:
                record["bytes_sent"] += extra_down
                record["bytes_received"] += extra_up
                record["aligned_bytes"] = extra_down
            history.append(record)
        offset += steps
    proxy_acc = accuracy(proxy, X_test, y_test)
    if target is not proxy:
        plug_adapters(proxy, target, layer_map)
    per_round = [h["bytes_sent"] + h["bytes_received"] for h in history]
    return {"method": method, "acc": accuracy(target, X_test, y_test),
            "proxy_acc": proxy_acc, "history": history,
            "bytes_per_round": float(np.mean(per_round)),
            "client_params": parameter_count(proxy), "fm_params": parameter_count(target),
            "trainable": trainable_parameter_count(proxy),
            "lora_params": adapter_parameter_count(proxy), "model": target, "proxy": proxy}


def transposed_digits(X):
    """The shifted task: each 8 x 8 digit read column by column (the image transposed), so
    the tokens the FM saw as rows now arrive as columns."""
    X = np.asarray(X)
    return np.ascontiguousarray(X.reshape(-1, 8, 8).transpose(0, 2, 1).reshape(len(X), 64))


def fedpft_digits(n_public=700, n_test=450, seed=0):
    """scikit-learn's digits cut as :func:`~asyncopt.deep.fedlpfm.digits_pools` does: the
    public pool (upright digits) pretrains the FM and is the distillation data; the
    client pool and the test set carry the shifted task (:func:`transposed_digits`)."""
    pools = digits_pools(n_public=n_public, n_test=n_test, seed=seed)
    return {"X_pretrain": pools["X_public"], "y_pretrain": pools["y_public"],
            "X_clients": transposed_digits(pools["X_clients"]),
            "y_clients": pools["y_clients"],
            "X_test": transposed_digits(pools["X_test"]), "y_test": pools["y_test"]}


def pretrain(model, X, y, epochs=40, lr=3e-3, batch_size=64, seed=0):
    """Train every parameter of ``model`` with AdamW on (X, y), cross-entropy, in seeded
    minibatches; returns ``model`` (in eval mode)."""
    generator = torch.Generator().manual_seed(seed)
    X, y = torch.as_tensor(X), torch.as_tensor(y).long()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    for _ in range(epochs):
        train_epoch(model, optimizer, X, y, batch_size, generator)
    return model.eval()
