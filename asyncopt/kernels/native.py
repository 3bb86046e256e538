"""ctypes binding of the native C + OpenMP sparse prox-SVRG epoch (native/svrg.c).

The library ``asyncopt/_native_svrg*.so`` (a plain shared library, no Python C API) is
built by setup.py when a C compiler with OpenMP is available; it is optional. Importing
this module never raises: ``available()`` says whether the library loaded and
``LOAD_ERROR`` keeps the reason when it did not.

``native_epoch_l1`` / ``native_epoch_group`` take the arguments of the tracked numba
kernels (``svrg_epoch_l1_tracked`` / ``svrg_epoch_group_tracked``: ``rows, blocks, step,
x, intercept, samples, clock``, ``kernels.workspace``) plus ``n_threads``: the
epoch's rows are split as ``numpy.array_split(samples, n_threads)``, one slice per
OpenMP thread, all threads updating the shared x lock-free (atomic per coordinate). With
one thread the results are bit-identical to the numba kernels. The intercept (length-1
array) is shared like in the tracked numba kernels: every thread steps a private copy
and adds its delta to it (atomically) every INTERCEPT_SYNC steps and at the end. The
clock's ``staleness`` is int64[2] = [sum tau, max tau] over all threads (added to the
values it holds, as the tracked numba kernels do for one thread), and the ``clock``'s
steps advance by ``len(samples)``. Both return the per-thread staleness array, shape
(n_threads, 2).
"""
import ctypes
import importlib.machinery
import pathlib

import numpy as np

__all__ = ["available", "LOAD_ERROR", "LIBRARY_PATH", "native_epoch_l1",
           "native_epoch_group"]

_lib = None
LOAD_ERROR = None
LIBRARY_PATH = None

_p_f64 = ctypes.POINTER(ctypes.c_double)
_p_i64 = ctypes.POINTER(ctypes.c_int64)
_p_i32 = ctypes.POINTER(ctypes.c_int32)
_COMMON = [_p_i64, _p_i32, _p_f64, _p_f64, ctypes.c_int,   # indptr indices data y code
           _p_f64,                                         # sample_weight (or NULL)
           _p_f64, _p_f64, ctypes.c_double,                # x intercept eta_intercept
           _p_f64, _p_f64, ctypes.c_double,                # z_snap weighted_mu mu_intercept
           _p_f64, ctypes.c_double,                        # thresholds eta
           _p_i64, ctypes.c_int64, ctypes.c_int, ctypes.c_int,  # samples n vr n_threads
           _p_i64, _p_i64]                                 # clock staleness


def _find_library():
    """asyncopt/_native_svrg<suffix>: this interpreter's extension suffix first."""
    package_dir = pathlib.Path(__file__).resolve().parent.parent  # asyncopt/
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package_dir / f"_native_svrg{suffix}"
        if path.is_file():
            return path
    candidates = sorted(package_dir.glob("_native_svrg*.so")) + \
        sorted(package_dir.glob("_native_svrg*.pyd")) + \
        sorted(package_dir.glob("_native_svrg*.dylib"))
    return candidates[0] if candidates else None


def _load():
    global _lib, LOAD_ERROR, LIBRARY_PATH
    try:
        path = _find_library()
        if path is None:
            LOAD_ERROR = ("native library asyncopt/_native_svrg*.so not found (not built: "
                          "run `pip install -e .` with a C compiler and OpenMP)")
            return
        LIBRARY_PATH = str(path)
        lib = ctypes.CDLL(LIBRARY_PATH)
        lib.asyncopt_svrg_epoch_l1.argtypes = list(_COMMON) + [ctypes.c_int,  # positive
                                                               ctypes.c_double]  # l2
        lib.asyncopt_svrg_epoch_l1.restype = ctypes.c_int
        lib.asyncopt_svrg_epoch_group.argtypes = list(_COMMON) + [
            _p_i64, _p_i64, ctypes.c_int64, ctypes.c_int64]
        lib.asyncopt_svrg_epoch_group.restype = ctypes.c_int
        _lib = lib
    except Exception as exc:  # noqa: BLE001 - OSError, AttributeError (missing symbol)
        _lib = None
        LOAD_ERROR = f"failed to load the native library {LIBRARY_PATH}: {exc!r}"


_load()


def available():
    """Whether the native kernel library is built and loaded."""
    return _lib is not None


def _require():
    if _lib is None:
        raise RuntimeError(f"asyncopt native kernels unavailable: {LOAD_ERROR}")


def _check(name, a, dtype, writable=False, length=None):
    if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != 1 \
            or not a.flags.c_contiguous:
        raise TypeError(f"{name} must be a C-contiguous 1-d {np.dtype(dtype).name} ndarray, "
                        f"got {type(a).__name__} "
                        f"{getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} must be writable")
    if length is not None and a.shape[0] < length:
        raise ValueError(f"{name} must have length >= {length}, got {a.shape[0]}")
    return a


def _ptr(a, ptype):
    return a.ctypes.data_as(ptype)


def _common_args(rows, step, x, intercept, samples, clock, n_threads, n_thresholds):
    indptr, indices, data, y, code, sample_weight = rows
    z_snap, weighted_mu, mu_intercept, thresholds, eta, eta_intercept, \
        variance_reduced = step
    n_threads = int(n_threads)
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    n_rows = indptr.shape[0] - 1 if isinstance(indptr, np.ndarray) else 0
    _check("indptr", indptr, np.int64, length=1)
    _check("indices", indices, np.int32, length=int(indptr[-1]))
    _check("data", data, np.float64, length=int(indptr[-1]))
    _check("y", y, np.float64, length=n_rows)
    _check("sample_weight", sample_weight, np.float64)
    if sample_weight.shape[0] not in (0, n_rows):
        raise ValueError(f"sample_weight must be empty or have {n_rows} entries, got "
                         f"{sample_weight.shape[0]}")
    _check("x", x, np.float64, writable=True)
    _check("intercept", intercept, np.float64, writable=True, length=1)
    _check("z_snap", z_snap, np.float64, length=n_rows)
    _check("weighted_mu", weighted_mu, np.float64, length=x.shape[0])
    _check("thresholds", thresholds, np.float64, length=n_thresholds)
    _check("samples", samples, np.int64)
    _check("clock", clock.steps, np.int64, writable=True, length=1)
    _check("staleness", clock.staleness, np.int64, writable=True, length=2)
    per_thread = np.zeros((n_threads, 2), dtype=np.int64)
    args = [_ptr(indptr, _p_i64), _ptr(indices, _p_i32), _ptr(data, _p_f64),
            _ptr(y, _p_f64), int(code),
            _ptr(sample_weight, _p_f64) if sample_weight.shape[0] else None,
            _ptr(x, _p_f64), _ptr(intercept, _p_f64),
            float(eta_intercept), _ptr(z_snap, _p_f64), _ptr(weighted_mu, _p_f64),
            float(mu_intercept), _ptr(thresholds, _p_f64), float(eta),
            _ptr(samples, _p_i64), int(samples.shape[0]), int(bool(variance_reduced)),
            n_threads, _ptr(clock.steps, _p_i64), _ptr(per_thread, _p_i64)]
    return args, per_thread


def _finish(rc, per_thread, staleness):
    if rc == 1:
        raise MemoryError("native kernel could not allocate its per-thread buffers")
    if rc != 0:
        raise ValueError(f"native kernel rejected its arguments (code {rc})")
    staleness[0] += per_thread[:, 0].sum()
    staleness[1] = max(staleness[1], per_thread[:, 1].max())
    return per_thread


def native_epoch_l1(rows, blocks, step, x, intercept, samples, clock, n_threads=1):
    """Native twin of ``svrg_epoch_l1_tracked`` on ``n_threads`` OpenMP threads (of
    ``blocks``, only ``positive`` and ``l2`` are read: the prox then keeps x >= 0, and
    shrinks by 1 / (1 + threshold l2) for the elastic net)."""
    _require()
    args, per_thread = _common_args(rows, step, x, intercept, samples, clock, n_threads,
                                    x.shape[0] if isinstance(x, np.ndarray) else 0)
    rc = _lib.asyncopt_svrg_epoch_l1(*args, int(bool(blocks.positive)),
                                     float(blocks.l2))
    return _finish(rc, per_thread, clock.staleness)


def native_epoch_group(rows, blocks, step, x, intercept, samples, clock, n_threads=1):
    """Native twin of ``svrg_epoch_group_tracked`` on ``n_threads`` OpenMP threads."""
    _require()
    block_indptr, feature_block = blocks.indptr, blocks.feature_block
    _check("block_indptr", block_indptr, np.int64, length=1)
    n_blocks = block_indptr.shape[0] - 1
    args, per_thread = _common_args(rows, step, x, intercept, samples, clock, n_threads,
                                    n_blocks)
    _check("feature_block", feature_block, np.int64, length=x.shape[0])
    if int(block_indptr[-1]) > x.shape[0]:
        raise ValueError("block_indptr[-1] exceeds the number of features")
    args += [_ptr(block_indptr, _p_i64), _ptr(feature_block, _p_i64), n_blocks, x.shape[0]]
    rc = _lib.asyncopt_svrg_epoch_group(*args)
    return _finish(rc, per_thread, clock.staleness)
