"""Data sets shipped inside the package: the LIBSVM a9a (Adult) training set (DESIGN 7)."""
import functools
import lzma
from importlib import resources

import numpy as np

from .crosses import feature_crosses
from .libsvm import _compact_csr

A9A_FILE = "a9a.svm.xz"
A9A_N_FEATURES = 123


@functools.lru_cache(maxsize=1)
def _a9a_arrays():
    with resources.files(__package__).joinpath(A9A_FILE).open("rb") as raw, \
            lzma.open(raw) as f:
        from sklearn.datasets import load_svmlight_file  # 0.8 s: only when parsing
        X, y = load_svmlight_file(f, n_features=A9A_N_FEATURES, zero_based=False)
    X = _compact_csr(X)
    X.data.setflags(write=False)
    X.indices.setflags(write=False)
    X.indptr.setflags(write=False)
    y.setflags(write=False)
    return X, y


def load_a9a(degree=1, labels="pm1"):
    """The a9a training set as ``(X, y)``: 32,560 rows x 123 binary features, X a float64
    ``csr_matrix`` (sorted indices), y float64.

    The file is the LIBSVM a9a training file of ``../shared/data/a9a`` (labels 0/1 there),
    xz-compressed byte for byte into ``asyncopt/data/a9a.svm.xz``.

    ``labels="pm1"`` maps the labels to -1/+1, ``labels="01"`` keeps 0/1.
    ``degree`` 2 or 3 returns ``feature_crosses(X, degree)``: the 123 features, then the
    5,302 co-occurring pairs (5,425 columns), then for degree 3 the co-occurring triples
    (93,604 columns in all).
    """
    if labels not in ("pm1", "01"):
        raise ValueError(f"labels must be 'pm1' or '01', got {labels!r}")
    X, y = _a9a_arrays()
    y = np.where(y > 0, 1.0, -1.0) if labels == "pm1" else np.where(y > 0, 1.0, 0.0)
    if degree == 1:
        X = X.copy()
        for array in (X.data, X.indices, X.indptr):
            array.setflags(write=True)
        return X, y
    return feature_crosses(X, degree=degree), y
