"""Client partitions of a labelled data set for federated runs.

See docs/deep_methods.md, "Fed-LPFM". Every partitioner returns ``n_clients`` sorted
int64 index arrays that are disjoint, cover range(n_samples) and are non-empty; it is
seeded (``seed``: an int or a ``numpy.random.Generator``), so the same seed gives the
same partition.

- :func:`iid_partition`: a uniform random permutation cut into near-equal parts.
- :func:`dirichlet_partition`: label skew of Hsu et al. (2019): for every class c,
  proportions q_c ~ Dir(alpha 1_K) over the K clients and client k gets the share
  q_{c,k} of the class's samples; small alpha concentrates each class on few clients.
- :func:`k_classes_partition`: every client holds k distinct classes drawn at random
  (NIID-Bench's "#C = k"), each class's samples split evenly among its holders.
- :func:`class_split_partition`: Fed-LPFM's "class split" (thesis 002, ch. 5: "each
  client's data is sampled from 2 of the 10 classes"): the classes in a random cyclic
  order, client i holds the k consecutive classes starting at position i, each class's
  samples split evenly among its holders, so every client has exactly k classes and
  neighbouring clients share one.
"""
import numpy as np


def _labels_and_rng(labels, n_clients, seed):
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}")
    if int(n_clients) < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if labels.shape[0] < n_clients:
        raise ValueError(f"{labels.shape[0]} samples cannot fill {n_clients} clients")
    return labels, int(n_clients), np.random.default_rng(seed)


def _class_indices(labels, rng):
    """[(class, shuffled indices of its samples)] in class order."""
    classes, inverse = np.unique(labels, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=classes.size))[:-1]
    return classes, [rng.permutation(part) for part in np.split(order, bounds)]


def _finish(parts):
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid_partition(labels, n_clients, seed=0):
    """Cut a uniform random permutation of the samples into near-equal client parts.

    The parts' sizes differ by at most one.

    Parameters
    ----------
    labels : array-like of shape (n_samples,) or int
        The labels, or the sample count instead (only the length matters).
    n_clients : int
        K >= 1, at most n_samples.
    seed : int or numpy.random.Generator, default=0
        Seed of the draw: the same seed gives the same partition.

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted index arrays, disjoint, non-empty, covering range(n_samples).
    """
    n = int(labels) if np.ndim(labels) == 0 else len(labels)
    _, n_clients, rng = _labels_and_rng(np.empty(n), n_clients, seed)
    return _finish(np.array_split(rng.permutation(n), n_clients))


def dirichlet_partition(labels, n_clients, alpha, seed=0, min_size=1, max_redraws=100):
    """Partition with label skew by class-wise Dirichlet proportions.

    For every class c (its samples in random order), q_c ~ Dir(alpha 1_K) and the samples
    are cut at floor(cumsum(q_c) n_c), so client k gets about q_{c,k} n_c of them. The
    whole draw is repeated (at most ``max_redraws`` times) until every client has at least
    ``min_size`` samples; if that never happens (small alpha and many clients), each client
    short of ``min_size`` takes random samples from the currently largest client until it
    has enough (the fix-up moves at most K * min_size samples).

    Parameters
    ----------
    labels : array-like of shape (n_samples,)
        The class labels.
    n_clients : int
        K >= 1.
    alpha : float
        The Dirichlet concentration, > 0; small alpha concentrates each class on few
        clients.
    seed : int or numpy.random.Generator, default=0
        Seed of the draw: the same seed gives the same partition.
    min_size : int, default=1
        The least number of samples of a client.
    max_redraws : int, default=100
        Draws tried before the fix-up.

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted index arrays, disjoint, non-empty, covering range(n_samples).
    """
    labels, n_clients, rng = _labels_and_rng(labels, n_clients, seed)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_size * n_clients > labels.shape[0]:
        raise ValueError(f"{labels.shape[0]} samples cannot give {n_clients} clients "
                         f"{min_size} each")
    _, per_class = _class_indices(labels, rng)
    for _ in range(max(int(max_redraws), 1)):
        parts = [[] for _ in range(n_clients)]
        for indices in per_class:
            shares = rng.dirichlet(np.full(n_clients, float(alpha)))
            cuts = (np.cumsum(shares)[:-1] * indices.size).astype(np.int64)
            for client, piece in enumerate(np.split(indices, cuts)):
                parts[client].append(piece)
        parts = [np.concatenate(p) for p in parts]
        if min(p.size for p in parts) >= min_size:
            return _finish(parts)
    for client in range(n_clients):
        while parts[client].size < min_size:
            donor = int(np.argmax([p.size for p in parts]))
            take = min(min_size - parts[client].size, parts[donor].size - min_size)
            moved = rng.choice(parts[donor].size, size=take, replace=False)
            parts[client] = np.concatenate([parts[client], parts[donor][moved]])
            parts[donor] = np.delete(parts[donor], moved)
    return _finish(parts)


def _split_among_holders(per_class, holders):
    """Each class's samples cut into near-equal parts, one per holder (in holder order)."""
    parts = {}
    for c, indices in enumerate(per_class):
        if indices.size < len(holders[c]):
            raise ValueError(f"class {c} has {indices.size} samples for "
                             f"{len(holders[c])} clients")
        for client, piece in zip(holders[c], np.array_split(indices, len(holders[c]))):
            parts.setdefault(client, []).append(piece)
    return parts


def k_classes_partition(labels, n_clients, k, seed=0):
    """Give every client exactly ``k`` distinct classes, split evenly among holders.

    Classes are dealt first so that every class has a holder: in a random class order,
    class j goes to client j mod K; then every client draws its remaining classes uniformly
    at random among those it does not hold. Needs K k >= n_classes (else some class would
    stay unassigned) and k <= n_classes.

    Parameters
    ----------
    labels : array-like of shape (n_samples,)
        The class labels.
    n_clients : int
        K >= 1.
    k : int
        Classes per client, in [1, n_classes].
    seed : int or numpy.random.Generator, default=0
        Seed of the draw: the same seed gives the same partition.

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted index arrays, disjoint, non-empty, covering range(n_samples).
    """
    labels, n_clients, rng = _labels_and_rng(labels, n_clients, seed)
    classes, per_class = _class_indices(labels, rng)
    n_classes = classes.size
    if not 1 <= k <= n_classes:
        raise ValueError(f"k must be in [1, {n_classes}], got {k}")
    if n_clients * k < n_classes:
        raise ValueError(f"{n_clients} clients with {k} classes each cannot hold all "
                         f"{n_classes} classes")
    held = [[] for _ in range(n_clients)]
    for j, c in enumerate(rng.permutation(n_classes)):
        held[j % n_clients].append(int(c))
    for client in range(n_clients):
        others = np.setdiff1d(np.arange(n_classes), held[client])
        held[client] += [int(c) for c in rng.choice(others, k - len(held[client]),
                                                     replace=False)]
    holders = [[client for client in range(n_clients) if c in held[client]]
               for c in range(n_classes)]
    parts = _split_among_holders(per_class, holders)
    return _finish([np.concatenate(parts[client]) for client in range(n_clients)])


def class_split_partition(labels, n_clients, classes_per_client=2, seed=0):
    """Partition by Fed-LPFM's class split: consecutive classes of a random cyclic order.

    With the classes in a random cyclic order pi, client i holds classes pi[i mod C],
    pi[(i + 1) mod C], ..., pi[(i + k - 1) mod C] (k = ``classes_per_client``), and each
    class's samples are split evenly among its holders. Every client has exactly k classes.
    Needs K + k - 1 >= C (every class held) and k <= C.

    Parameters
    ----------
    labels : array-like of shape (n_samples,)
        The class labels (C classes).
    n_clients : int
        K >= 1.
    classes_per_client : int, default=2
        k, in [1, C]; 2 is the thesis' setting.
    seed : int or numpy.random.Generator, default=0
        Seed of the draw: the same seed gives the same partition.

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted index arrays, disjoint, non-empty, covering range(n_samples).
    """
    labels, n_clients, rng = _labels_and_rng(labels, n_clients, seed)
    classes, per_class = _class_indices(labels, rng)
    n_classes, k = classes.size, int(classes_per_client)
    if not 1 <= k <= n_classes:
        raise ValueError(f"classes_per_client must be in [1, {n_classes}], got {k}")
    if min(n_clients, n_classes) + k - 1 < n_classes:
        raise ValueError(f"{n_clients} clients with {k} classes each cannot hold all "
                         f"{n_classes} classes")
    order = rng.permutation(n_classes)
    held = [{int(order[(i + j) % n_classes]) for j in range(k)} for i in range(n_clients)]
    holders = [[client for client in range(n_clients) if c in held[client]]
               for c in range(n_classes)]
    parts = _split_among_holders(per_class, holders)
    return _finish([np.concatenate(parts[client]) for client in range(n_clients)])
