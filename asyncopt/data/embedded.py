"""Data sets shipped inside the package: the LIBSVM a9a (Adult) training set.

docs/design.md §7.
"""
import functools
from importlib import resources

import numpy as np
import scipy.sparse as sp

from .crosses import feature_crosses
from .libsvm import load_libsvm

A9A_FILE = "a9a.svm.xz"
A9A_ARRAYS = "a9a.npz"
A9A_N_FEATURES = 123


def a9a_from_text():
    """(X, y) parsed from the embedded LIBSVM text ``a9a.svm.xz`` (``load_libsvm``)."""
    with resources.as_file(resources.files(__package__).joinpath(A9A_FILE)) as path:
        return load_libsvm(path, n_features=A9A_N_FEATURES, zero_based=False)


def a9a_arrays_from_text():
    """The arrays of ``a9a.npz``, from the LIBSVM text: the rows' lengths, the
    zero-based columns (uint8: 123 features) and the 0/1 labels (uint8); every stored
    value of a9a is 1. Regenerate the file with ``np.savez_compressed(path,
    **a9a_arrays_from_text())``."""
    X, y = a9a_from_text()
    if not np.all(X.data == 1.0) or np.any(np.diff(X.indptr) > 255):
        raise ValueError("a9a.svm.xz is not the binary a9a set that a9a.npz encodes")
    return {"row_lengths": np.diff(X.indptr).astype(np.uint8),
            "columns": X.indices.astype(np.uint8), "labels": (y > 0).astype(np.uint8)}


@functools.lru_cache(maxsize=1)
def _a9a_arrays():
    """(X, y) of the embedded set, read-only, from ``a9a.npz`` rather than by parsing the
    text, since every worker under mpirun reads the whole set."""
    with resources.files(__package__).joinpath(A9A_ARRAYS).open("rb") as f, \
            np.load(f) as arrays:
        row_lengths, columns = arrays["row_lengths"], arrays["columns"]
        y = arrays["labels"].astype(np.float64)
    indptr = np.zeros(row_lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(row_lengths, out=indptr[1:])
    X = sp.csr_matrix((np.ones(columns.shape[0]), columns.astype(np.int32), indptr),
                      shape=(row_lengths.shape[0], A9A_N_FEATURES))
    X.has_sorted_indices = True
    for array in (X.data, X.indices, X.indptr, y):
        array.setflags(write=False)
    return X, y


def load_a9a(degree=1, labels="pm1"):
    """The a9a training set as ``(X, y)``: 32,560 rows x 123 binary features, X a float64
    ``csr_matrix`` (sorted indices), y float64.

    The file is the LIBSVM a9a training file of ``../shared/data/a9a`` (labels 0/1 there),
    xz-compressed byte for byte into ``asyncopt/data/a9a.svm.xz``; it is read from its
    binary form ``a9a.npz`` (``a9a_arrays_from_text``).

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
