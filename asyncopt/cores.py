"""The cores a process may use, and the limit on BLAS threads beside the solvers' own threads
or ranks (Sha-DDSS's threads, Dis-DDSS's ranks on one machine)."""
import contextlib
import functools
import os


def available_cores():
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def blas_threads_beside(workers, cores=None):
    """The BLAS threads each of ``workers`` threads or processes of this machine may use
    so that together they do not exceed its cores: cores // workers, at least 1; None
    (no limit) for a single worker. ``cores``: this process's (``available_cores``) by
    default."""
    if workers <= 1:
        return None
    return max(1, int(available_cores() if cores is None else cores) // int(workers))


@contextlib.contextmanager
def blas_threads(limit):
    """Run the block with the BLAS libraries' thread pools (numpy's and scipy's OpenBLAS,
    MKL, BLIS: threadpoolctl) limited to ``limit`` threads each, or to the fewest any of
    them had, then put them back; ``limit`` None leaves them as they are.

    The solvers that compute on several threads or ranks of one machine run inside it.
    After each call that used several threads, OpenBLAS's worker threads keep spinning
    for a while on the cores where the solver's own threads or ranks compute. Measured on
    2 cores (CTR 200,000 x 100,000, 1e-3 lam_max, to 1e-6):
      - Dis-DDSS at mpirun -n 3 took 1.06-1.62 s with each rank's default pools, against
        0.26-0.34 s with one BLAS thread per rank;
      - Sha-DDSS on 2 threads took 0.52-0.67 s, against 0.25-0.27 s with one BLAS
        thread (and 0.30-0.33 s on 1 thread).
    scikit-learn limits BLAS around its OpenMP loops the same way."""
    if limit is None:
        yield
        return
    from threadpoolctl import ThreadpoolController
    pools = ThreadpoolController().select(user_api="blas")    # one scan of the libraries
    # a cap, never a raise: the pools keep fewer threads where the user asked for fewer
    # (OPENBLAS_NUM_THREADS=1 in a rank's environment)
    counts = [pool.num_threads for pool in pools.lib_controllers]
    with pools.limit(limits=max(1, min([int(limit)] + counts))):
        yield


@contextlib.contextmanager
def small_pages():
    """Run the block with numpy asking the kernel for no huge pages on the large arrays it
    allocates (``madvise(MADV_HUGEPAGE)`` above 4 MB, numpy's default on Linux), then
    restore numpy's setting. Where transparent huge pages are granted on request
    (``/sys/kernel/mm/transparent_hugepage/enabled`` = madvise, defrag = madvise), the
    first touch of such an array can stall in the kernel's compaction for tens of ms: a
    Dis-DDSS worker's first epoch view took 38-95 ms against 8-16 ms, and the server's
    unpacking of an 8.8 MB Hessian 12.5 ms against 2. The arrays made before the block
    (the shards' rows) keep theirs. Dis-DDSS (``solve_mpi``) on CTR 200,000 x 100,000 at
    1e-3 lam_max on the 2-core VM, 3 blocks of 6-8 paired solves (benchmarks/README.md):
    mean solve at -n 2 0.306 -> 0.306, 0.382 -> 0.344, 0.343 -> 0.339 s; -n 3 0.270 ->
    0.264, 0.296 -> 0.256, 0.244 -> 0.240 s; -n 9 0.474 -> 0.412, 0.445 -> 0.409, 0.410
    -> 0.413 s; the spread of -n 2 and -n 3 2-5x narrower. Serial DDSS, which allocates
    the same arrays again and again in one process, gained nothing (1e-4 lam_max: 3%
    slower), so it runs without."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:          # pragma: no cover - another numpy layout
        yield
        return
    before = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(before)


def in_small_pages(solver):
    """``solver`` run inside ``small_pages`` (a decorator for the solvers' entry points)."""
    @functools.wraps(solver)
    def run(*args, **kwargs):
        with small_pages():
            return solver(*args, **kwargs)
    return run
