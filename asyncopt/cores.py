"""The cores a process may use, and the limit on BLAS threads beside the solvers' own threads
or ranks (Sha-DDSS's threads, Dis-DDSS's ranks on one machine)."""
import contextlib
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
    MKL, BLIS: threadpoolctl) limited to ``limit`` threads each, then put them back;
    ``limit`` None leaves them as they are.

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
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=max(1, int(limit)), user_api="blas"):
        yield
