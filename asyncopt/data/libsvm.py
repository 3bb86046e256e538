"""Reading LIBSVM / SVMlight files, whole or as byte-range shards, with line-precise errors.

Parsing is scikit-learn's (``sklearn.datasets.load_svmlight_file``); this module adds
checks it does not make (non-finite values, empty files), a one-line error naming the file
and line for every malformed line, ``.xz`` files, and the byte ranges the MPI workers read.

A byte range ``(offset, length)`` means the lines that start at a byte position in
``(offset, offset + length]`` (``[0, length]`` when ``offset`` is 0; ``length <= 0``: to the
end of the file). That is what scikit-learn's ``offset``/``length`` promise, but its reader
also takes the next data line when a range ends on a blank or comment line; this module
cuts the range itself and hands scikit-learn whole lines.
"""
import bz2
import gzip
import io
import lzma
import math
import os

import numpy as np
import scipy.sparse as sp

_INT32_MAX = np.iinfo(np.int32).max
_CHUNK = 1 << 20


class LibsvmFormatError(ValueError):
    """A LIBSVM file that cannot be read as data; the message is ``file:line: problem``."""


def _open_binary(path):
    name = os.fspath(path)
    suffix = os.path.splitext(name)[1].lower()
    if suffix == ".gz":
        return gzip.open(name, "rb")
    if suffix == ".bz2":
        return bz2.open(name, "rb")
    if suffix in (".xz", ".lzma"):
        return lzma.open(name, "rb")
    return open(name, "rb")


def _is_compressed(path):
    return os.path.splitext(os.fspath(path))[1].lower() in (".gz", ".bz2", ".xz", ".lzma")


def _is_range(offset, length):
    return offset != 0 or length > 0


def _parse_float(token):
    try:
        return float(token)
    except ValueError:
        return None


def _parse_int(token):
    try:
        return int(token)
    except ValueError:
        return None


def _show(token):
    return token.decode("utf-8", "replace")


def _line_problem(line, one_based):
    """(problem, min_index, max_index) of one line; problem is None for a valid or blank line."""
    hash_at = line.find(b"#")
    if hash_at >= 0:
        line = line[:hash_at]
    parts = line.split()
    if not parts:
        return None, -1, -1
    label = _parse_float(parts[0])
    if label is None:
        return f"bad label '{_show(parts[0])}' (expected a number)", -1, -1
    if not math.isfinite(label):
        return f"non-finite label '{_show(parts[0])}'", -1, -1
    features = parts[1:]
    if features and features[0].startswith(b"qid"):
        features = features[1:]
    first = -1
    previous = -1
    for token in features:
        index_s, colon, value_s = token.partition(b":")
        index = _parse_int(index_s) if colon else None
        value = _parse_float(value_s) if colon else None
        if index is None or value is None:
            return f"bad feature '{_show(token)}' (expected index:value)", -1, -1
        if index < 0:
            return f"negative feature index in '{_show(token)}'", -1, -1
        if index > _INT32_MAX:
            return f"feature index too large in '{_show(token)}'", -1, -1
        if index == 0 and one_based:
            return f"feature index 0 in '{_show(token)}' of a one-based file", -1, -1
        if not math.isfinite(value):
            return f"non-finite value in '{_show(token)}'", -1, -1
        if index <= previous:
            return f"feature indices not strictly increasing at '{_show(token)}'", -1, -1
        if previous < 0:
            first = index
        previous = index
    return None, first, previous


def _newlines_before(path, position):
    count = 0
    with _open_binary(path) as f:
        remaining = position
        while remaining > 0:
            block = f.read(min(_CHUNK, remaining))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count


def _range_span(path, offset, length):
    """(start, end) bytes of the lines that start in (offset, offset + length]
    (in [0, length] for offset 0; up to the end of the file for length <= 0)."""
    with _open_binary(path) as f:
        if offset > 0:
            f.seek(offset)
            f.readline()
        start = f.tell()
        if length > 0:
            f.seek(max(offset + length, start))
            f.readline()
        elif not _is_compressed(path):
            return start, max(start, os.path.getsize(path))
        else:
            while f.read(_CHUNK):
                pass
        return start, f.tell()


def _read_span(path, start, end):
    with _open_binary(path) as f:
        f.seek(start)
        return f.read(end - start)


def _find_bad_line(lines, zero_based, n_features):
    """(index in ``lines``, problem) of the first malformed line, or None."""
    one_based = zero_based is False
    maxima = []
    min_index = None
    for i, line in enumerate(lines):
        problem, first, last = _line_problem(line, one_based)
        if problem is not None:
            return i, problem
        if last >= 0:
            maxima.append((i, last))
            min_index = first if min_index is None else min(min_index, first)
    if n_features is None or not maxima:
        return None
    if zero_based == "auto":
        shift = 1 if min_index > 0 else 0
    else:
        shift = 0 if zero_based else 1
    for i, max_index in maxima:
        if max_index - shift >= n_features:
            return i, f"feature index {max_index} exceeds n_features={n_features}"
    return None


def _format_error(path, lines, first_line, zero_based, n_features, fallback):
    name = os.fspath(path)
    found = _find_bad_line(lines, zero_based, n_features)
    if found is None:
        return LibsvmFormatError(f"{name}: {fallback}")
    i, problem = found
    return LibsvmFormatError(f"{name}:{first_line() + i}: {problem}")


def _compact_csr(X):
    """X as a csr_matrix with sorted indices, int32 index arrays where they fit."""
    X = sp.csr_matrix(X)
    X.sort_indices()
    if X.nnz <= _INT32_MAX and X.shape[1] <= _INT32_MAX:
        X.indices = X.indices.astype(np.int32, copy=False)
        X.indptr = X.indptr.astype(np.int32, copy=False)
    return X


def load_libsvm(path, n_features=None, zero_based="auto", offset=0, length=-1,
                dtype=np.float64):
    """Read a LIBSVM / SVMlight file (plain, .gz, .bz2 or .xz) into ``(X, y)``.

    X is a ``scipy.sparse.csr_matrix`` of ``dtype`` with sorted indices (int32 index arrays
    when they fit, else int64), y a float64 array of the labels.

    ``zero_based``: True, False or "auto" (one-based if no index 0 appears); with a byte
    range ("auto" cannot see the whole file) "auto" means zero-based, as in scikit-learn,
    so pass ``zero_based=False`` to read shards of a one-based file such as a9a.

    ``offset`` / ``length``: read only the lines of that byte range (see the module
    docstring and ``libsvm_byte_ranges``); ``n_features`` is then required, so that all
    shards have the same width. A byte range may hold no rows (a 0-row X); a whole file
    without rows is an error.

    Raises FileNotFoundError for a missing file and LibsvmFormatError (a ValueError) with
    the message ``file:line: problem`` for a malformed line: a label or value that is not a
    finite number, a token that is not ``index:value``, a negative index, index 0 in a file
    read with ``zero_based=False``, indices not strictly increasing, an index beyond
    ``n_features``.
    """
    name = os.fspath(path)
    if not os.path.exists(name):
        raise FileNotFoundError(f"LIBSVM file not found: {name}")
    if os.path.isdir(name):
        raise IsADirectoryError(f"LIBSVM path is a directory, not a file: {name}")
    if zero_based not in (True, False, "auto"):
        raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
    ranged = _is_range(offset, length)
    if ranged and n_features is None:
        raise ValueError("n_features is required when reading a byte range (offset/length)")
    if ranged:
        start, end = _range_span(name, offset, length)
        chunk = _read_span(name, start, end)
        if zero_based == "auto":
            zero_based = True

        def lines():
            return io.BytesIO(chunk)

        def first_line():
            return _newlines_before(name, start) + 1
    else:
        def lines():
            return _open_binary(name)

        def first_line():
            return 1

    def failure(fallback):
        with lines() as f:
            return _format_error(name, f, first_line, zero_based, n_features, fallback)

    try:
        with lines() as f:
            from sklearn.datasets import load_svmlight_file  # 0.8 s: only when parsing
            X, y = load_svmlight_file(f, n_features=n_features, dtype=dtype,
                                      zero_based=zero_based)
    except (ValueError, OverflowError) as error:
        raise failure(str(error).splitlines()[0] if str(error) else "malformed") from error
    except (EOFError, OSError, lzma.LZMAError) as error:
        raise LibsvmFormatError(f"{name}: cannot decompress/read: {error}") from error
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(X.data))):
        raise failure("non-finite value")
    if X.shape[0] == 0 and not ranged:
        raise LibsvmFormatError(f"{name}: no data rows (empty, or only blank and comment lines)")
    return _compact_csr(X), np.asarray(y, dtype=np.float64)


def libsvm_byte_ranges(path, n_parts):
    """Split an uncompressed LIBSVM file into ``n_parts`` byte ranges ``(offset, length)``.

    Reading every range with ``load_libsvm(path, n_features, zero_based, offset, length)``
    gives disjoint blocks of consecutive rows whose concatenation, in order, is the whole
    file. Boundaries are at line starts near ``k * size / n_parts``, so parts hold about the
    same number of bytes. A part that gets no line (more parts than lines) is
    ``(size, 0)``, which reads as 0 rows.
    """
    name = os.fspath(path)
    if not os.path.exists(name):
        raise FileNotFoundError(f"LIBSVM file not found: {name}")
    if _is_compressed(name):
        raise ValueError(f"byte ranges need an uncompressed file, got {name}")
    n_parts = int(n_parts)
    if n_parts < 1:
        raise ValueError(f"n_parts must be >= 1, got {n_parts}")
    size = os.path.getsize(name)
    starts = [0]
    with open(name, "rb") as f:
        for k in range(1, n_parts):
            target = max(k * size // n_parts, 2, starts[-1] + 1)
            if target >= size:
                break
            f.seek(target - 1)
            f.readline()
            start = f.tell()
            if start >= size:
                break
            starts.append(start)
    bounds = [0] + [s - 1 for s in starts[1:]] + [size]
    ranges = [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(len(starts))]
    ranges += [(size, 0)] * (n_parts - len(ranges))
    return ranges
