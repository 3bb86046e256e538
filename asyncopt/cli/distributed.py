"""The command lines under mpirun (Dis-DDSS): rank 0 serves, ranks 1..l are workers that
read only their own shard of the rows.

A plain LIBSVM file is split into l byte ranges at line starts
(``data.libsvm_byte_ranges``): worker k parses range k and nothing else; the feature count
and whether the file is one-based are agreed on with reductions. A compressed file (and
the embedded a9a) cannot be split by bytes: every worker decompresses it and keeps its
contiguous block of rows.

Every step that can fail on bad input runs on all ranks and the outcome is agreed on
(``agree``): if any rank failed, every rank raises the error of the lowest failing rank,
which run_main prints once, on rank 0; no rank is left waiting in a collective.
"""
import numpy as np
import scipy.sparse as sp

ANY_WIDTH = 2 ** 31 - 1


def agree(comm, fn):
    """fn() on every rank; if it raised ValueError / OSError on some rank, raise the error
    of the lowest such rank on every rank."""
    try:
        out, error = fn(), None
    except (ValueError, OSError) as exc:
        out, error = None, exc
    errors = comm.allgather(error)
    for exc in errors:
        if exc is not None:
            raise exc
    return out


def load_shard(args, comm, server_meanwhile=None):
    """(X_k, y_k, name, n, p, nnz): this worker's rows (None on rank 0) and the global
    sizes. ``server_meanwhile``: what rank 0, which reads nothing, runs while the workers
    read."""
    from asyncopt.runtime import available_cores, blas_threads_beside
    from asyncopt.data import load_libsvm, libsvm_byte_ranges
    from asyncopt.data.libsvm import _is_compressed
    from asyncopt.comm.wire import local_ranks

    from .common import CliUsageError, load_data

    rank, workers = comm.Get_rank(), comm.Get_size() - 1
    meanwhile = server_meanwhile or (lambda: None)
    # the parser's threads: this rank's share of the node's cores
    threads = blas_threads_beside(local_ranks(comm)) or available_cores()
    splittable = args.data is not None and not _is_compressed(args.data)
    if args.data is None or not splittable:
        def whole():
            if rank == 0:
                meanwhile()
                return None, None, None
            X, y, name = load_data(args, threads)
            rows = np.array_split(np.arange(X.shape[0]), workers)[rank - 1]
            return X[rows], np.asarray(y)[rows], name
        X, y, name = agree(comm, whole)
        name = comm.bcast(name, root=1)
        p = comm.bcast(None if rank != 1 else X.shape[1], root=1)
    else:
        if args.degree != 1:
            raise CliUsageError("--degree applies to the embedded a9a data set only")
        name = args.data

        def part():
            ranges = libsvm_byte_ranges(name, workers)    # every rank: a missing file fails
            if rank == 0:
                meanwhile()
                return None, None
            offset, length = ranges[rank - 1]
            return load_libsvm(name, n_features=ANY_WIDTH, zero_based=True, offset=offset,
                               length=length, n_threads=threads)
        X, y = agree(comm, part)
        width = 0 if X is None or X.nnz == 0 else int(X.indices.max()) + 1
        has_zero = X is not None and X.nnz > 0 and bool(np.any(X.indices == 0))
        width = comm.allreduce(width, op=_mpi_max())
        one_based = not comm.allreduce(has_zero, op=_mpi_lor())
        p = width - 1 if one_based else width
        if X is not None:
            X = sp.csr_matrix((X.data, X.indices - 1 if one_based else X.indices, X.indptr),
                              shape=(X.shape[0], max(p, 0)))
    n = comm.allreduce(0 if X is None else X.shape[0])
    nnz = comm.allreduce(0 if X is None else int(X.nnz))
    fewest = comm.allreduce(np.inf if X is None else X.shape[0], op=_mpi_min())

    def check():
        if n < 2:
            raise ValueError(f"{name}: need at least 2 samples, got {n}")
        if p < 1:
            raise ValueError(f"{name}: no features")
        if fewest < 1:
            raise ValueError(f"{name}: more workers ({workers}) than rows ({n}): start "
                             "fewer ranks")
    agree(comm, check)
    return X, y, name, n, p, nnz


def shard_sample_weight(comm, path, X, n, name):
    """This rank's rows' weights from --sample-weight ``path`` (None without it, and on
    the server): every rank reads the whole file (one number a row, ``read_sample_weight``,
    rescaled over all ``n`` rows) and the outcome is agreed on, so that a bad line is one
    error on every rank, printed once; worker k keeps the lines of its rows, which
    follow those of the workers before it (the byte ranges and the row blocks are in
    file order)."""
    from .common import read_sample_weight

    rows = 0 if X is None else X.shape[0]
    counts = comm.allgather(rows)
    if path is None:
        return None
    weights = agree(comm, lambda: read_sample_weight(path, n, name))
    if X is None or weights is None:
        return None
    start = sum(counts[:comm.Get_rank()])
    return weights[start:start + rows]


def labels(comm, y, loss, name):
    """y mapped for the loss (logistic: the two global classes to -1/+1); returns
    (y, classes)."""
    from asyncopt.problem import encode_binary_labels

    if loss != "logistic":
        def finite():
            if y is not None and not np.all(np.isfinite(y)):
                raise ValueError(f"{name}: targets contain NaN or infinity")
        agree(comm, finite)
        return (None if y is None else np.asarray(y, dtype=float)), None
    seen = comm.allgather(None if y is None else np.unique(y))
    union = np.unique(np.concatenate([s for s in seen if s is not None]))

    def encode():
        try:
            return encode_binary_labels(union)[1]
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    classes = agree(comm, encode)
    return (None if y is None else np.where(y == classes[1], 1.0, -1.0)), classes


def _mpi_max():
    from mpi4py import MPI
    return MPI.MAX


def _mpi_min():
    from mpi4py import MPI
    return MPI.MIN


def _mpi_lor():
    from mpi4py import MPI
    return MPI.LOR
