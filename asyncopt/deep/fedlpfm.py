"""Fed-LPFM: frozen per-client teachers distilled into a federated student.

Thesis 002, chapter 5 (Xidong Wu, PhD thesis, 2024); docs/deep_methods.md, "Fed-LPFM".
With the baselines FedAvg, FedProx and FML.

Every method runs on :func:`asyncopt.deep.run_federated` with :class:`LocalTrainer`
(same seeds: same partition, same student initialisation, same minibatch orders), and
only the student's vector travels (FedAvg aggregation, weights n_i / sum_j n_j, an empty
client weighs 0). The methods differ only in the client's minibatch loss:

- ``fedavg``: CE(student(x), y);
- ``fedprox``: CE(student(x), y) + mu/2 ||theta - theta_t||^2 (theta_t: the global
  vector the client received; :func:`asyncopt.deep.fedprox_term`);
- ``fml``: federated mutual learning (Shen et al. 2020): each client also keeps a private
  model phi_i that never travels; per minibatch the shared ("meme") student minimises
  alpha CE(meme, y) + (1 - alpha) KL(p_private || p_meme) and the private model
  beta CE(private, y) + (1 - beta) KL(p_meme || p_private) (the other model's
  probabilities are constants), both with one SGD step (:class:`MutualLearningLoss`);
- ``fedlpfm``: lam CE(student, y) + (1 - lam) sum_{k in teachers(i)} T^2
  KL(softmax(t_k(x)/T) || softmax(student(x)/T)) with frozen teachers t_k
  (:func:`distillation_loss`, :class:`DistillationLoss`); defaults lam = 0.5, T = 3 (the
  thesis gives neither); ``direction="reverse"`` gives KL(student || teacher), the
  direction the thesis prints.

Teachers are frozen (:func:`freeze`: ``requires_grad=False``, eval mode), held by the
client's loss object and never part of the model that :class:`ParameterVector` flattens,
so they never change and never appear in a message. Students use GroupNorm instead of
BatchNorm (:func:`student_mlp`), so the vector holds no running statistics.

The small experiment of the specification lives here too: :func:`digits_pools`
(scikit-learn's digits cut into a public pool for the teacher, a client pool and a test
set), :func:`train_teacher` (the frozen teacher, fitted on the public pool only),
:func:`validation_split` (a validation set carved from the client pool, for choosing
hyperparameters without the test set), :func:`make_partition` (the seven partitions of
chapter 5 by name) and :func:`run_method`.

Why the defaults are what they are (``benchmarks/bench_fedlpfm.py``):

- the public pool has 700 digits (DEFAULT_N_PUBLIC), so that the teacher knows more than
  the federation, as the thesis' foundation-model teacher does;
- the teacher is an MLP (``kind="mlp"``), chosen on the validation split;
- lam = 0.5, T = 3 and the forward KL are the specification's, kept after a check on the
  validation split;
- every method takes the same 5 local epochs a round.
"""
import numpy as np
import torch
import torch.nn.functional as F

from .ato import accuracy
from .federated import LocalTrainer, aggregation_weights, run_federated
from .partition import class_split_partition, dirichlet_partition, iid_partition

PARTITION_NAMES = ("iid", "dir1.0", "dir0.5", "dir0.1", "dir0.05", "dir0.01", "class_split")
METHODS = ("fedavg", "fedprox", "fml", "fedlpfm")
KL_DIRECTIONS = ("forward", "reverse")
# The specification's defaults, kept after a validation check (module docstring).
DEFAULT_LAM, DEFAULT_TEMPERATURE, DEFAULT_DIRECTION = 0.5, 3.0, "forward"
# The public pool the teacher is fitted on: the teacher must know more than the clients
# together (module docstring).
DEFAULT_N_PUBLIC = 700

__all__ = ["PARTITION_NAMES", "METHODS", "make_partition", "student_mlp", "freeze",
           "kd_term", "distillation_loss", "DistillationLoss", "MutualLearningLoss",
           "aggregation_weights", "digits_pools", "train_teacher", "validation_split",
           "accuracy", "run_method", "TEACHER_KINDS", "DEFAULT_LAM", "DEFAULT_TEMPERATURE",
           "DEFAULT_DIRECTION", "DEFAULT_N_PUBLIC"]


# --------------------------------------------------------------------------- partitions

def make_partition(name, labels, n_clients, seed=0, classes_per_client=2):
    """Return one of chapter 5's client partitions by name.

    ``"iid"`` (:func:`iid_partition`), ``"dir<alpha>"`` e.g. ``"dir0.1"`` (class-wise
    Dirichlet(alpha) label skew, :func:`dirichlet_partition`) and ``"class_split"`` (every
    client holds exactly ``classes_per_client`` classes, :func:`class_split_partition`);
    PARTITION_NAMES lists the seven of the thesis.

    Parameters
    ----------
    name : str
        The partition's name.
    labels : array-like of shape (n_samples,)
        The class labels.
    n_clients : int
        K.
    seed : int or numpy.random.Generator, default=0
        Seed of the draw: the same seed gives the same partition.
    classes_per_client : int, default=2
        k of ``"class_split"``.

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted index arrays, disjoint, non-empty, covering range(n_samples).
    """
    if name == "iid":
        return iid_partition(labels, n_clients, seed=seed)
    if name == "class_split":
        return class_split_partition(labels, n_clients, classes_per_client, seed=seed)
    if name.startswith("dir"):
        try:
            alpha = float(name[3:])
        except ValueError:
            alpha = None
        if alpha is not None:
            return dirichlet_partition(labels, n_clients, alpha, seed=seed)
    raise ValueError(f"unknown partition {name!r}: expected 'iid', 'dir<alpha>' or "
                     f"'class_split' (the card's: {', '.join(PARTITION_NAMES)})")


# --------------------------------------------------------------------------- models

def student_mlp(n_features=64, n_hidden=32, n_classes=10, groups=4):
    """Build the specification's student: an MLP with GroupNorm instead of BatchNorm.

    Linear(n_features, n_hidden), GroupNorm(groups, n_hidden), ReLU,
    Linear(n_hidden, n_classes) (64-32-10 by default). GroupNorm has no running statistics,
    so nothing but parameters travels.

    Parameters
    ----------
    n_features : int, default=64
        Inputs.
    n_hidden : int, default=32
        Hidden units.
    n_classes : int, default=10
        Outputs.
    groups : int, default=4
        GroupNorm groups (must divide ``n_hidden``).

    Returns
    -------
    torch.nn.Sequential
        The student.
    """
    return torch.nn.Sequential(torch.nn.Linear(n_features, n_hidden),
                               torch.nn.GroupNorm(groups, n_hidden),
                               torch.nn.ReLU(),
                               torch.nn.Linear(n_hidden, n_classes))


def freeze(module):
    """Freeze a teacher in place: no gradients, eval mode.

    Every parameter gets ``requires_grad=False`` (its ``.grad`` dropped).

    Parameters
    ----------
    module : torch.nn.Module
        The teacher.

    Returns
    -------
    torch.nn.Module
        ``module``, in eval mode.
    """
    for p in module.parameters():
        p.requires_grad_(False)
        p.grad = None
    return module.eval()


# --------------------------------------------------------------------------- losses

def kd_term(student_logits, teacher_logits, temperature=3.0, direction="forward"):
    """Return the temperature-scaled distillation term T^2 KL, averaged over the batch.

    ``direction="forward"``: T^2 KL(softmax(teacher/T) || softmax(student/T)) (Hinton et
    al. 2015); ``"reverse"``: T^2 KL(softmax(student/T) || softmax(teacher/T)), as printed
    in thesis 002 ch. 5. The teacher's logits are constants.

    Parameters
    ----------
    student_logits : torch.Tensor
        Shape (batch, classes).
    teacher_logits : torch.Tensor
        Shape (batch, classes).
    temperature : float, default=3.0
        T.
    direction : {"forward", "reverse"}, default="forward"
        The KL direction.

    Returns
    -------
    torch.Tensor
        The scalar term.
    """
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"direction must be one of {KL_DIRECTIONS}, got {direction!r}")
    T = float(temperature)
    log_p_student = F.log_softmax(student_logits / T, dim=1)
    log_p_teacher = F.log_softmax(teacher_logits.detach() / T, dim=1)
    if direction == "forward":   # sum_c p_t (log p_t - log p_s)
        kl = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)
    else:                        # sum_c p_s (log p_s - log p_t)
        kl = F.kl_div(log_p_teacher, log_p_student, reduction="batchmean", log_target=True)
    return T * T * kl


def distillation_loss(student_logits, teacher_logits, labels, lam=0.5, temperature=3.0,
                      direction="forward"):
    """Return Fed-LPFM's local loss, cross-entropy plus distillation from frozen teachers.

        lam CE(student, y) + (1 - lam) sum_k T^2 KL(softmax(t_k/T) || softmax(student/T))

    (thesis 002 ch. 5; the KL direction is ``direction``, :func:`kd_term`).

    Parameters
    ----------
    student_logits : torch.Tensor
        Shape (batch, classes).
    teacher_logits : torch.Tensor or sequence of torch.Tensor
        One tensor, or one per teacher of the client.
    labels : torch.Tensor
        Shape (batch,), class indices.
    lam : float, default=0.5
        Weight of the cross-entropy (the thesis gives none; 0.5 weighs both terms alike).
    temperature : float, default=3.0
        T.
    direction : {"forward", "reverse"}, default="forward"
        The KL direction.

    Returns
    -------
    torch.Tensor
        The scalar loss.
    """
    if torch.is_tensor(teacher_logits):
        teacher_logits = [teacher_logits]
    loss = lam * F.cross_entropy(student_logits, labels)
    kd = sum(kd_term(student_logits, t, temperature, direction) for t in teacher_logits)
    return loss + (1.0 - lam) * kd


class DistillationLoss:
    """The ``batch_loss`` hook of :class:`LocalTrainer` for Fed-LPFM.

    ``loss(model, x, y, client)`` is :func:`distillation_loss` of ``model(x)`` against the
    client's frozen teachers. Every teacher is frozen (:func:`freeze`) here and run under
    ``torch.no_grad`` in eval mode; it lives in this object only, never in the model that is
    communicated.

    Parameters
    ----------
    teachers : torch.nn.Module or sequence
        One module (every client's teacher), or a sequence with one entry per client, each a
        module or a sequence of modules (the client's teachers).
    lam : float, default=0.5
        Weight of the cross-entropy, in [0, 1].
    temperature : float, default=3.0
        T.
    direction : {"forward", "reverse"}, default="forward"
        The KL direction.

    Attributes
    ----------
    shared : list of torch.nn.Module or None
        The teacher every client shares (None with per-client teachers).
    per_client : list of list of torch.nn.Module or None
        Each client's teachers (None with a shared teacher).
    """

    def __init__(self, teachers, lam=0.5, temperature=3.0, direction="forward"):
        if direction not in KL_DIRECTIONS:
            raise ValueError(f"direction must be one of {KL_DIRECTIONS}, got {direction!r}")
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        if isinstance(teachers, torch.nn.Module):
            self.shared = [freeze(teachers)]
            self.per_client = None
        else:
            self.shared = None
            self.per_client = [[freeze(t)] if isinstance(t, torch.nn.Module)
                               else [freeze(m) for m in t] for t in teachers]
        self.lam, self.temperature, self.direction = float(lam), float(temperature), direction

    def teachers_of(self, client):
        """Return the frozen teacher modules of ``client``.

        Parameters
        ----------
        client : int
            The client id.

        Returns
        -------
        list of torch.nn.Module
            Its teachers.
        """
        return self.shared if self.per_client is None else self.per_client[client]

    def __call__(self, model, x, y, client):
        with torch.no_grad():
            teacher_logits = [t.eval()(x) for t in self.teachers_of(client)]
        return distillation_loss(model(x), teacher_logits, y, self.lam, self.temperature,
                                 self.direction)


class MutualLearningLoss:
    """The ``batch_loss`` hook of :class:`LocalTrainer` for FML, federated mutual learning.

    Shen et al. 2020. Client i keeps a private model phi_i (``make_model()``, initialised
    under ``torch.manual_seed(seed * 100003 + i)`` without touching the global RNG) that
    never travels. ``loss(model, x, y, client)``, with p = softmax(model(x)) (the shared
    "meme" model) and q = softmax(phi_i(x)):

    - takes one SGD step (``lr``, ``momentum``; one optimizer per client, its state kept
      across rounds) on phi_i for beta CE(phi_i(x), y) + (1 - beta) KL(p || q);
    - returns alpha CE(model(x), y) + (1 - alpha) KL(q || p) for the meme model,

    the other model's probabilities treated as constants (both computed before the step),
    at temperature 1.

    Parameters
    ----------
    make_model : callable
        ``make_model()`` builds a private model.
    n_clients : int
        K.
    lr : float
        Learning rate of the private models' SGD.
    alpha : float, default=0.5
        Cross-entropy weight of the meme model's loss (the paper's default).
    beta : float, default=0.5
        Cross-entropy weight of the private model's loss (the paper's default).
    momentum : float, default=0.0
        Momentum of the private models' SGD.
    seed : int, default=0
        Seed of the private models' initialisation.

    Attributes
    ----------
    private : list of torch.nn.Module
        The private models, one per client.
    optimizers : list of torch.optim.SGD
        Their optimizers.
    """

    def __init__(self, make_model, n_clients, lr, alpha=0.5, beta=0.5, momentum=0.0,
                 seed=0):
        self.alpha, self.beta = float(alpha), float(beta)
        self.private = []
        with torch.random.fork_rng(devices=[]):
            for client in range(int(n_clients)):
                torch.manual_seed(int(seed) * 100003 + client)
                self.private.append(make_model())
        self.optimizers = [torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
                           for m in self.private]

    def __call__(self, model, x, y, client):
        private, optimizer = self.private[client], self.optimizers[client]
        private.train()
        meme_logits, private_logits = model(x), private(x)
        private_loss = (self.beta * F.cross_entropy(private_logits, y)
                        + (1.0 - self.beta) * kd_term(private_logits, meme_logits.detach(),
                                                      1.0, "forward"))
        optimizer.zero_grad()
        private_loss.backward()
        optimizer.step()
        return (self.alpha * F.cross_entropy(meme_logits, y)
                + (1.0 - self.alpha) * kd_term(meme_logits, private_logits.detach(), 1.0,
                                               "forward"))


# --------------------------------------------------------------------------- experiment

def digits_pools(n_public=DEFAULT_N_PUBLIC, n_test=450, seed=0):
    """scikit-learn's digits (1797 x 64, shipped with the package, no download), pixels
    scaled to [0, 1], cut by a seeded permutation into a public pool (the teacher's
    training data, ``n_public``; 700, so that the teacher knows more than the clients
    together, see the module docstring), a test set (``n_test``) and the client pool (the
    rest: 647 digits with the defaults).
    Returns a dict of float32 / int64 numpy arrays: X_public, y_public, X_clients,
    y_clients, X_test, y_test."""
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    X, y = (X / 16.0).astype(np.float32), y.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    public, test = order[:n_public], order[n_public:n_public + n_test]
    clients = order[n_public + n_test:]
    return {"X_public": X[public], "y_public": y[public], "X_test": X[test],
            "y_test": y[test], "X_clients": X[clients], "y_clients": y[clients]}


TEACHER_KINDS = ("mlp", "linear")


def train_teacher(X, y, n_classes=10, steps=None, lr=None, seed=0, kind="mlp", hidden=128,
                  weight_decay=None):
    """Fit the frozen teacher on the public pool (X, y) by full-batch steps, then freeze it.

    - ``kind="mlp"`` (default): Linear(n_features, ``hidden``) - ReLU - Linear(hidden,
      n_classes), Adam (``lr`` 0.01), ``steps`` 300, ``weight_decay`` 1e-3; chosen on a
      validation split of the client pool (never the test set) among MLP widths, weight
      decays and the linear teacher.
    - ``kind="linear"``: the first version's teacher, a linear softmax classifier, SGD
      (``lr`` 0.5), ``steps`` 30, no weight decay: stopped well short of its optimum.

    The teacher is initialised under ``torch.manual_seed(seed)`` without touching the global
    RNG.

    Parameters
    ----------
    X : array-like or torch.Tensor
        The public pool's inputs.
    y : array-like or torch.Tensor
        Its labels.
    n_classes : int, default=10
        Outputs.
    steps : int, default=None
        Full-batch steps; None: the kind's default.
    lr : float, default=None
        Learning rate; None: the kind's default.
    seed : int, default=0
        Seed of the initialisation.
    kind : {"mlp", "linear"}, default="mlp"
        The teacher's architecture.
    hidden : int, default=128
        Hidden units of the MLP.
    weight_decay : float, default=None
        Weight decay; None: the kind's default.

    Returns
    -------
    torch.nn.Module
        The frozen teacher (:func:`freeze`).
    """
    if kind not in TEACHER_KINDS:
        raise ValueError(f"kind must be one of {TEACHER_KINDS}, got {kind!r}")
    n_features = X.shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "linear":
            teacher = torch.nn.Linear(n_features, n_classes)
        else:
            teacher = torch.nn.Sequential(torch.nn.Linear(n_features, int(hidden)),
                                          torch.nn.ReLU(),
                                          torch.nn.Linear(int(hidden), n_classes))
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    if kind == "linear":
        steps = 30 if steps is None else steps
        optimizer = torch.optim.SGD(teacher.parameters(), lr=0.5 if lr is None else lr,
                                    weight_decay=0.0 if weight_decay is None else weight_decay)
    else:
        steps = 300 if steps is None else steps
        optimizer = torch.optim.Adam(teacher.parameters(), lr=0.01 if lr is None else lr,
                                     weight_decay=1e-3 if weight_decay is None else weight_decay)
    teacher.train()
    for _ in range(int(steps)):
        optimizer.zero_grad()
        F.cross_entropy(teacher(X), y).backward()
        optimizer.step()
    return freeze(teacher)


def validation_split(X, y, fraction=0.2, seed=12345):
    """Carve a validation set from the client pool for choosing hyperparameters without
    the test set: a seeded permutation (``numpy.random.default_rng(seed)``), the first
    ``int(fraction * n)`` samples are the validation set. Returns ``(X_train, y_train,
    X_val, y_val)``."""
    order = np.random.default_rng(seed).permutation(len(y))
    n_val = int(fraction * len(y))
    val, train = order[:n_val], order[n_val:]
    return X[train], y[train], X[val], y[val]


def run_method(method, X, y, partition, rounds, *, make_model=student_mlp, teachers=None,
               epochs=1, batch_size=32, lr=0.05, mu=0.1, lam=0.5, temperature=3.0,
               direction="forward", fml_alpha=0.5, fml_beta=0.5, client_fraction=1.0,
               seed=0, X_test=None, y_test=None, verbose=True, transport=None):
    """One federated run of ``method`` (one of :data:`METHODS`) with
    :func:`run_federated`; same ``seed`` gives every method the same student
    initialisation (``make_model()`` under ``torch.manual_seed(seed)``), the same client
    sampling and the same minibatch orders. ``teachers``: the Fed-LPFM teachers (see
    :class:`DistillationLoss`); ``mu``: the FedProx coefficient. With ``X_test``/
    ``y_test`` the global model's test accuracy is the per-round metric. Returns
    ``(model, FederatedResult)``, the model holding the final global student."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make_model()
    n_clients = len(partition)
    batch_loss, prox = None, 0.0
    if method == "fedprox":
        prox = mu
    elif method == "fml":
        batch_loss = MutualLearningLoss(make_model, n_clients, lr, fml_alpha, fml_beta,
                                        seed=seed)
    elif method == "fedlpfm":
        if teachers is None:
            raise ValueError("fedlpfm needs teachers")
        batch_loss = DistillationLoss(teachers, lam, temperature, direction)
    trainer = LocalTrainer(X, y, partition, epochs=epochs, batch_size=batch_size, lr=lr,
                           mu=prox, seed=seed, batch_loss=batch_loss)
    evaluate = None
    if X_test is not None:
        def evaluate(m):
            return {"acc": accuracy(m, X_test, y_test)}
    result = run_federated(model, trainer, n_clients, rounds, client_fraction=client_fraction,
                           seed=seed, transport=transport, evaluate=evaluate, buffers=True,
                           verbose=verbose, label=method)
    return model, result
