"""Client partitions (METHODS Fed-LPFM): disjoint, covering, non-empty, reproducible per
seed; Dirichlet skew grows as alpha shrinks; k-classes and the class split give every
client exactly k classes."""
import numpy as np
import pytest

pytest.importorskip("torch")
from asyncopt.deep.partition import (class_split_partition, dirichlet_partition,  # noqa: E402
                                     iid_partition, k_classes_partition)


def make_labels(n=2000, n_classes=10, seed=0):
    """Unbalanced labels with string-free, non-contiguous class values."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.5, 1.5, n_classes)
    return 3 * rng.choice(n_classes, size=n, p=p / p.sum()) + 7


PARTITIONERS = {
    "iid": lambda labels, k, seed: iid_partition(labels, k, seed=seed),
    "dirichlet_1": lambda labels, k, seed: dirichlet_partition(labels, k, 1.0, seed=seed),
    "dirichlet_0.01": lambda labels, k, seed: dirichlet_partition(labels, k, 0.01, seed=seed),
    "k_classes_3": lambda labels, k, seed: k_classes_partition(labels, k, 3, seed=seed),
    # fewer clients than classes need more classes each to hold every class (K + k > C)
    "class_split": lambda labels, k, seed: class_split_partition(
        labels, k, classes_per_client=max(2, 11 - k), seed=seed),
}


def assert_is_partition(parts, n, n_clients):
    assert len(parts) == n_clients
    assert all(p.dtype == np.int64 and p.ndim == 1 and p.size > 0 for p in parts)
    everything = np.concatenate(parts)
    assert everything.size == n                                   # disjoint ...
    assert np.array_equal(np.sort(everything), np.arange(n))      # ... and covering


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
@pytest.mark.parametrize("n_clients", [4, 10, 25])
def test_partitions_are_disjoint_covering_and_non_empty(name, n_clients):
    labels = make_labels()
    assert_is_partition(PARTITIONERS[name](labels, n_clients, 0), labels.size, n_clients)


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_same_seed_same_partition_other_seed_other_partition(name):
    labels = make_labels()
    first, again = (PARTITIONERS[name](labels, 10, 5) for _ in range(2))
    other = PARTITIONERS[name](labels, 10, 6)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def label_entropy(labels, part):
    _, counts = np.unique(labels[part], return_counts=True)
    q = counts / counts.sum()
    return float(-(q * np.log(q)).sum())


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels = make_labels()
    alphas = [100.0, 1.0, 0.1, 0.01]
    mean_entropy = [np.mean([np.mean([label_entropy(labels, part) for part in
                                      dirichlet_partition(labels, 10, alpha, seed=seed)])
                             for seed in range(3)]) for alpha in alphas]
    assert all(a > b for a, b in zip(mean_entropy, mean_entropy[1:])), mean_entropy
    assert mean_entropy[0] > 0.95 * np.log(10)       # alpha = 100: close to the global mix
    assert mean_entropy[-1] < np.log(2)              # alpha = 0.01: one or two classes each


def test_dirichlet_shares_follow_the_per_class_draw():
    """With one class the partition is the Dirichlet draw itself: client k gets
    floor(cumsum(q)) cuts of the n samples, q ~ Dir(alpha 1_K) from the same generator."""
    n, k, alpha = 1000, 5, 0.7
    parts = dirichlet_partition(np.zeros(n), k, alpha, seed=np.random.default_rng(11))
    rng = np.random.default_rng(11)
    rng.permutation(n)                               # the class's shuffle comes first
    cuts = (np.cumsum(rng.dirichlet(np.full(k, alpha)))[:-1] * n).astype(int)
    assert [p.size for p in parts] == list(np.diff(np.r_[0, cuts, n]))


def test_dirichlet_fix_up_fills_clients_when_redraws_do_not():
    labels = make_labels(n=120, n_classes=4)
    parts = dirichlet_partition(labels, 30, 0.01, seed=0, min_size=2, max_redraws=1)
    assert_is_partition(parts, labels.size, 30)
    assert min(p.size for p in parts) >= 2


def holders_of(labels, parts):
    return {c: [i for i, p in enumerate(parts) if np.any(labels[p] == c)]
            for c in np.unique(labels)}


@pytest.mark.parametrize("n_clients,k", [(10, 2), (4, 3), (25, 4), (10, 10)])
def test_k_classes_gives_exactly_k_classes_split_evenly(n_clients, k):
    labels = make_labels()
    parts = k_classes_partition(labels, n_clients, k, seed=1)
    assert all(np.unique(labels[p]).size == k for p in parts)
    for c, holders in holders_of(labels, parts).items():
        shares = [np.count_nonzero(labels[parts[i]] == c) for i in holders]
        assert max(shares) - min(shares) <= 1


def test_class_split_is_two_classes_per_client_each_class_on_two_clients():
    labels = make_labels()
    parts = class_split_partition(labels, 10, seed=2)
    assert all(np.unique(labels[p]).size == 2 for p in parts)
    holders = holders_of(labels, parts)
    assert all(len(h) == 2 for h in holders.values())
    # clients i and i + 1 share one class: the classes form one cycle through all clients
    pairs = [set(np.unique(labels[p])) for p in parts]
    assert all(len(pairs[i] & pairs[(i + 1) % 10]) == 1 for i in range(10))


def test_iid_sizes_differ_by_at_most_one():
    parts = iid_partition(1003, 10, seed=0)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def test_impossible_requests_are_refused():
    labels = make_labels(n=50, n_classes=10)
    with pytest.raises(ValueError, match="cannot fill"):
        iid_partition(labels, 51)
    with pytest.raises(ValueError, match="cannot hold"):
        k_classes_partition(labels, 3, 2)
    with pytest.raises(ValueError, match="cannot hold"):
        class_split_partition(labels, 4, 2)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(labels, 5, 0.0)
