"""Data sets shipped inside the package: the LIBSVM a9a (Adult) training set (DESIGN 7)."""
import functools
import lzma
from importlib import resources

import numpy as np
import scipy.sparse as sp

from .crosses import feature_crosses
from .libsvm import _compact_csr

A9A_FILE = "a9a.svm.xz"
A9A_ARRAYS = "a9a.npz"
A9A_N_FEATURES = 123


def _parse_well_formed(text, n_features):
    """(X, y) of LIBSVM text known to be well formed ("label i:v i:v ..." per line,
    one-based ascending indices): the embedded file only, whose parse is tested against
    scikit-learn's. Vectorised with numpy, without scikit-learn, whose import (with
    scipy.stats) cost each rank of mpirun -n 9 asyncopt-lasso ~5 s of start-up on 2
    cores."""
    lines = [line for line in text.split(b"\n") if line.strip()]
    per_row = np.fromiter((line.count(b":") for line in lines), dtype=np.int64,
                          count=len(lines))
    numbers = np.array(b" ".join(lines).replace(b":", b" ").split()).astype(np.float64)
    indptr = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum(per_row, out=indptr[1:])
    label_at = np.arange(len(lines)) + 2 * indptr[:-1]      # a label, then its pairs
    is_pair = np.ones(numbers.shape[0], dtype=bool)
    is_pair[label_at] = False
    pairs = numbers[is_pair]
    X = sp.csr_matrix((pairs[1::2], pairs[0::2].astype(np.int32) - 1, indptr),
                      shape=(len(lines), n_features))
    return X, numbers[label_at]


def a9a_from_text():
    """(X, y) parsed from the embedded LIBSVM text ``a9a.svm.xz`` (0.14 s)."""
    with resources.files(__package__).joinpath(A9A_FILE).open("rb") as raw, \
            lzma.open(raw) as f:
        X, y = _parse_well_formed(f.read(), A9A_N_FEATURES)
    return _compact_csr(X), y


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
    """(X, y) of the embedded set, read-only, from ``a9a.npz`` (2 ms): the text's parse
    took 0.14 s, and every worker of ``mpirun -n 9 asyncopt-lasso`` reads the whole set
    (1.1 s of CPU over 8 workers on the 2 cores that also start them)."""
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
