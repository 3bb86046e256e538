"""Reading LIBSVM / SVMlight files, whole or as byte-range shards, with line-precise errors.

Parsing is one numba pass over the bytes (``kernels.parse``, numbers converted exactly as
Python's ``float`` does), scikit-learn's ``load_svmlight_file`` format: ``label [qid:Q]
index:value ...`` with '#' comments, without scikit-learn (whose import every MPI worker
would pay, and whose parser is slower). This module also rejects what that reader lets
through (non-finite values, empty files), names the file and line of every malformed line
in a one-line error, reads ``.xz`` files, and gives the MPI workers their byte ranges.

A byte range ``(offset, length)`` means the lines that start at a byte position in
``(offset, offset + length]`` (``[0, length]`` when ``offset`` is 0; ``length <= 0``: to the
end of the file). That is what scikit-learn's ``offset``/``length`` promise, but its reader
also takes the next data line when a range ends on a blank or comment line; this module
cuts the range itself and parses whole lines.
"""
import bz2
import gzip
import lzma
import math
import os

import numpy as np
import scipy.sparse as sp

from ..runtime import available_cores

_INT32_MAX = np.iinfo(np.int32).max
_CHUNK = 1 << 20
_PARSE_BLOCK = 1 << 26


class LibsvmFormatError(ValueError):
    """A LIBSVM file that cannot be read as data; the message is ``file:line: problem``."""


def _open_binary(path, mode="rb"):
    name = os.fspath(path)
    suffix = os.path.splitext(name)[1].lower()
    if suffix == ".gz":
        return gzip.open(name, mode)
    if suffix == ".bz2":
        return bz2.open(name, mode)
    if suffix in (".xz", ".lzma"):
        return lzma.open(name, mode)
    return open(name, mode)


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
    """(problem, min_index, max_index) of one line; problem is None for a valid or blank
    line."""
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


def _line_cuts(text, parts, end):
    """Offsets 0 = c_0 < ... < c_k = end (k <= parts) cutting text[:end] (whole lines) into
    k pieces of about the same bytes, each made of whole lines."""
    cuts = [0]
    for k in range(1, parts):
        at = text.find(b"\n", max(k * end // parts, cuts[-1]), end) + 1
        if at <= cuts[-1] or at >= end:
            continue
        cuts.append(at)
    return cuts + [end]


class _Block:
    """Whole LIBSVM lines text[start:end] parsed by ``kernels.parse.parse_libsvm_chunk``
    (``parse``, on any thread: the kernel releases the GIL), then checked, with the
    numbers the kernel leaves to Python's float converted (``finish``, in line order).
    ``fail(line, problem)`` builds the error for a 0-based line of this block."""

    def __init__(self, text, start, end, zero_based, n_features):
        self.text, self.start, self.end = text, start, end
        self.zero_based, self.n_features = zero_based, n_features
        self.parsed = None

    def parse(self):
        from asyncopt.kernels.parse import POW10_HI, POW10_LO, parse_libsvm_chunk
        code = {True: 1, False: 0, "auto": -1}[self.zero_based]
        bound = -1 if self.n_features is None else \
            self.n_features - (self.zero_based is True)
        buf = np.frombuffer(self.text, dtype=np.uint8, count=self.end - self.start,
                            offset=self.start)
        self.parsed = parse_libsvm_chunk(buf, code, bound, POW10_HI, POW10_LO)

    def finish(self, fail):
        from asyncopt.kernels.parse import INDEX_TOO_LARGE, OK
        status, self.n_lines, self.y, self.row_line, self.indptr, self.indices, \
            self.data, fallback = self.parsed
        self.parsed = None
        text = self.text[self.start:self.end] if status != OK or fallback.shape[0] else b""
        self.text = None
        # the numbers left to float come from the lines before the one the kernel
        # stopped at, so a non-finite one among them is the first error
        for position, lo, hi in fallback:
            value = float(text[lo:hi])
            row = -position - 1
            if position >= 0:
                self.data[position] = value
                row = int(np.searchsorted(self.indptr, position, side="right")) - 1
            else:
                self.y[row] = value
            if not math.isfinite(value):
                line = int(self.row_line[row])
                raise fail(line, _line_problem(_nth_line(text, line), False)[0])
        if status != OK:
            problem, _, last = _line_problem(_nth_line(text, self.n_lines),
                                             one_based=self.zero_based is False)
            if problem is None and status == INDEX_TOO_LARGE:
                problem = f"feature index {last} exceeds n_features={self.n_features}"
            raise fail(self.n_lines, problem or "not a LIBSVM line (label [qid:Q] "
                       "index:value ..., with decimal numbers)")


def _nth_line(text, line):
    return text.split(b"\n", line + 1)[line]


def _parse_lines(text, end, zero_based, n_features, fail, n_threads, blocks, lines):
    """Parse the whole lines text[:end] in ``n_threads`` pieces at once (no copy of the
    text: each piece is read in place) and append them, finished, to ``blocks``; ``lines``
    lines came before text. Returns the line count after it."""
    from asyncopt.kernels.linalg import run_in_parallel
    if end == 0:
        return lines
    cuts = _line_cuts(text, max(1, int(n_threads)), end)
    pieces = [_Block(text, a, b, zero_based, n_features)
              for a, b in zip(cuts[:-1], cuts[1:])]
    run_in_parallel([piece.parse for piece in pieces])
    for piece in pieces:
        base = lines
        piece.finish(lambda line, problem: fail(base + line, problem))
        piece.row_line += base
        blocks.append(piece)
        lines += piece.n_lines
    return lines


def _joined(blocks):
    """(y, indptr, indices, data, row_line) of parsed blocks, in order."""
    if len(blocks) == 1:
        b = blocks[0]
        return b.y, b.indptr, b.indices, b.data, b.row_line
    starts = np.cumsum([0] + [b.data.shape[0] for b in blocks[:-1]])
    indptr = np.concatenate([[0]] + [b.indptr[1:] + k for b, k in zip(blocks, starts)])
    return (np.concatenate([b.y for b in blocks] or [np.empty(0)]), indptr,
            np.concatenate([b.indices for b in blocks] or [np.empty(0, np.int64)]),
            np.concatenate([b.data for b in blocks] or [np.empty(0)]),
            np.concatenate([b.row_line for b in blocks] or [np.empty(0, np.int64)]))


def _parse_stream(stream, zero_based, n_features, fail, n_threads=1):
    """(y, indptr, indices, data, row_line) of the LIBSVM lines of a binary stream, read
    in blocks of about _PARSE_BLOCK bytes cut at line ends, each parsed in ``n_threads``
    pieces at once; indices as written; row_line: each row's 0-based line in the stream.
    ``fail(line, problem)`` builds the error for a 0-based line of the stream."""
    blocks, carry, lines = [], b"", 0
    while True:
        text = stream.read(_PARSE_BLOCK)
        if text:
            text = carry + text if carry else text
            end = text.rfind(b"\n") + 1
            carry = text[end:]
            if end == 0:
                continue
        elif carry:
            text, end, carry = carry, len(carry), b""
        else:
            break
        lines = _parse_lines(text, end, zero_based, n_features, fail, n_threads, blocks,
                             lines)
    return _joined(blocks)


def load_libsvm(path, n_features=None, zero_based="auto", offset=0, length=-1,
                dtype=np.float64, n_threads=None):
    """Read a LIBSVM / SVMlight file (plain, .gz, .bz2 or .xz) into ``(X, y)``.

    X is a ``scipy.sparse.csr_matrix`` of ``dtype`` with sorted indices (int32 index arrays
    when they fit, else int64), y a float64 array of the labels. Numbers are converted
    exactly as Python's ``float`` does (kernels.parse).

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

    ``n_threads``: threads that parse at once, each a piece of whole lines (default: this
    process's cores, ``runtime.available_cores``; under MPI pass the cores of one rank).
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
        if zero_based == "auto":
            zero_based = True

        def parse(threads):
            # the span is read whole, and its lines parsed where they lie
            text, blocks = _read_span(name, start, end), []
            _parse_lines(text, len(text), zero_based, n_features, fail, threads, blocks, 0)
            return _joined(blocks)

        def first_line():
            return _newlines_before(name, start) + 1
    else:
        def parse(threads):
            with _open_binary(name) as f:
                return _parse_stream(f, zero_based, n_features, fail, threads)

        def first_line():
            return 1

    def fail(line, problem):
        return LibsvmFormatError(f"{name}:{first_line() + line}: {problem}")

    try:
        y, indptr, indices, data, row_line = parse(
            available_cores() if n_threads is None else n_threads)
    except (EOFError, OSError, lzma.LZMAError) as error:
        raise LibsvmFormatError(f"{name}: cannot decompress/read: {error}") from error
    if y.shape[0] == 0 and not ranged:
        raise LibsvmFormatError(f"{name}: no data rows (empty, or only blank and comment lines)")
    shift = zero_based is False or (zero_based == "auto" and indices.shape[0] > 0
                                     and indices.min() > 0)
    if shift:
        indices -= 1
    width = int(indices.max()) + 1 if indices.shape[0] else 0
    if n_features is not None and width > n_features:
        first = np.argmax(indices >= n_features)
        row = int(np.searchsorted(indptr, first, side="right")) - 1
        written = int(indices[indptr[row + 1] - 1]) + shift
        raise fail(int(row_line[row]), f"feature index {written} exceeds "
                   f"n_features={n_features}")
    shape = (y.shape[0], width if n_features is None else n_features)
    small = indices.shape[0] <= _INT32_MAX and shape[1] <= _INT32_MAX
    index = np.int32 if small else np.int64
    X = sp.csr_matrix((data.astype(dtype, copy=False), indices.astype(index, copy=False),
                       indptr.astype(index, copy=False)), shape=shape)
    X.has_sorted_indices = True
    return X, y


def save_libsvm(path, X, y, zero_based=False, rows_per_write=100_000):
    """Write (X, y) as a LIBSVM file (plain, or compressed by its suffix: .gz, .bz2, .xz):
    one line ``label index:value ...`` per row, its stored entries in index order, every
    number as Python's ``repr`` (the shortest text that reads back to the same double, so
    ``load_libsvm`` returns X and y exactly). One-based indices unless ``zero_based``.
    Written ``rows_per_write`` rows at a time."""
    X = sp.csr_matrix(X, dtype=np.float64)
    X.sort_indices()
    y = np.asarray(y, dtype=np.float64).ravel()
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} labels")
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(X.data))):
        raise ValueError("X and y must be finite to be written as LIBSVM")
    name = os.fspath(path)
    shift = 0 if zero_based else 1
    with _open_binary(name, "wb") as f:
        for lo in range(0, X.shape[0], rows_per_write):
            block = X[lo:lo + rows_per_write]
            pairs = list(map("%d:%r".__mod__, zip((block.indices + shift).tolist(),
                                                  block.data.tolist())))
            ends = block.indptr.tolist()
            text = "".join(
                repr(label) + "".join(" " + pair for pair in pairs[a:b]) + "\n"
                for label, a, b in zip(y[lo:lo + rows_per_write].tolist(), ends, ends[1:]))
            f.write(text.encode("ascii"))


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
