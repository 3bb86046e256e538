"""One Dis-DDSS (or baseline) run under mpirun, for bench_distributed.py and
bench_speedup.py. SPMD: every rank runs this file.

    mpirun -n K+1 python benchmarks/_mpi_run.py --data ctr_small --loss squared \\
        --lam-ratio 1e-3 --fit-intercept --method ddss --tol 1e-6 --max-time 30 --out r.json

The workers (ranks 1..K) each hold a contiguous block of rows (np.array_split order, as
tests/mpi/solve_shards.py) and the server (rank 0) none: with ``--shards`` (what the
benchmarks pass, written once by ``prepare_shards``) each worker loads only its own block;
without it every rank builds the whole data with bench_serial.load_data (a deterministic
generator or the embedded a9a file) and keeps its block. lam = lam_ratio *
distributed_lam_max. Before the timed solve every rank runs the same
method on a tiny problem (numba kernels loaded or compiled, MPI connections opened) and
builds its shard's shuffled CSR copy, then a barrier; the history's clock (solve_mpi's
own) starts inside the solve. Rank 0 writes the JSON: the history, the result, the shard
sizes and each rank's load / warm-up / solve seconds.

The driver side (``launch``) lives here too, so that both benchmarks start runs the same
way; importing this module does not import mpi4py (only ``main`` does).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.abspath(__file__)
METHODS = ("ddss", "ddss_naive", "prox_asaga", "prox_asvrg")     # what --method takes
# one thread per rank: the ranks are the parallelism (numba kernels here are serial)
RANK_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "NUMBA_NUM_THREADS": "1"}


# --------------------------------------------------------------------------- driver side

def find_mpirun(explicit=None):
    """mpirun next to the interpreter (the PyPI mpich wheel puts it there), else on PATH."""
    if explicit:
        return explicit
    here = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return here if os.path.exists(here) else shutil.which("mpirun")


def rank_environment(root=None):
    """os.environ with the repository root appended to PYTHONPATH and RANK_ENV's one
    thread per rank (unless set): the environment of every benchmark mpirun. ``root``:
    another source tree, put first on PYTHONPATH instead (its asyncopt is imported)."""
    path = os.environ.get("PYTHONPATH")
    if root is None:
        path = (path + os.pathsep if path else "") + ROOT
    else:
        path = os.path.abspath(root) + (os.pathsep + path if path else "")
    env = dict(os.environ, PYTHONPATH=path)
    for key, value in RANK_ENV.items():
        env.setdefault(key, value)
    return env


def worker_rows(n, n_workers, worker):
    """(lo, hi): the contiguous rows lo..hi-1 of worker ``worker`` (0-based), the blocks of
    np.array_split(range(n), n_workers)."""
    size, extra = divmod(n, n_workers)
    lo = worker * size + min(worker, extra)
    return lo, lo + size + (worker < extra)


def prepare_shards(data, n_workers, root):
    """Write the workers' contiguous row blocks of ``data`` (np.array_split order) once, as
    root/<data>_<k>/shard_<i>.npz (the CSR arrays and y) plus meta.json, and return that
    folder. Each rank then reads only its own rows, as the CLI's workers read their byte
    range of a LIBSVM file: when every rank built the whole 200,000 x 100,000 matrix
    (0.8 s CPU, nine times over on 2 cores) that was most of the -n 9 start-up."""
    import numpy as np
    folder = os.path.join(root, f"{data}_{n_workers}")
    meta_path = os.path.join(folder, "meta.json")
    if os.path.exists(meta_path):
        return folder
    if ROOT not in sys.path:
        sys.path.append(ROOT)
    from benchmarks.bench_serial import load_data
    X, y = load_data(data)
    n, p = X.shape
    os.makedirs(folder, exist_ok=True)
    for i in range(n_workers):
        lo, hi = worker_rows(n, n_workers, i)
        block = X[lo:hi]
        np.savez(os.path.join(folder, f"shard_{i}.npz"), indptr=block.indptr,
                 indices=block.indices, data=block.data, y=y[lo:hi])
    with open(meta_path + ".tmp", "w") as f:
        json.dump({"n_samples": n, "n_features": p, "nnz": int(X.nnz),
                   "n_workers": n_workers}, f)
    os.replace(meta_path + ".tmp", meta_path)
    return folder


def add_solve_arguments(parser):
    """The problem and solve flags of the scripts that launch single solves and read their
    payloads (bench_paired, bench_timeline); ``solve_options`` turns them into
    ``launch``'s keyword arguments."""
    from benchmarks.bench_serial import DATA_DESCRIPTION
    parser.add_argument("--data", default="ctr", choices=sorted(DATA_DESCRIPTION))
    parser.add_argument("--loss", default="squared", choices=["squared", "logistic"])
    parser.add_argument("--lam-ratio", type=float, default=1e-3)
    parser.add_argument("--no-intercept", action="store_true")
    parser.add_argument("--method", default="ddss", choices=METHODS)
    parser.add_argument("--tol", type=float, default=1e-6,
                        help="relative duality gap to reach (default 1e-6)")
    parser.add_argument("--time-cap", type=float, default=60.0, help="seconds per solve")
    parser.add_argument("--mpirun", default=None)
    parser.add_argument("--shards", default=None, metavar="DIR",
                        help="where the shards are written (default: a temporary folder)")
    parser.add_argument("--output", default=None)
    parser.add_argument("--newton-products", action="store_true",
                        help="the Newton step's CG asks the workers for every product, as "
                        "across machines")


def solve_options(args, extra_args=()):
    """``launch``'s keyword arguments from ``add_solve_arguments``' flags (a run gets
    2 minutes beyond its time cap before it is killed), with ``extra_args`` for the
    rank script."""
    return dict(data=args.data, loss=args.loss, lam_ratio=args.lam_ratio,
                fit_intercept=not args.no_intercept, method=args.method, tol=args.tol,
                max_time=args.time_cap, timeout=args.time_cap + 120, mpirun=args.mpirun,
                extra_args=list(extra_args) +
                (["--newton-products"] if args.newton_products else []))


def launch(n_ranks, out, *, data, loss, lam_ratio, fit_intercept, method, tol, max_time,
           seed=0, timeout=None, mpirun=None, extra_args=(), shard_root=None, root=None,
           script=None):
    """Run ``mpirun -n n_ranks python _mpi_run.py ...`` and return
    (payload dict or None, wall seconds of the whole mpirun, error text or None).
    A run past ``timeout`` seconds has its process group killed. With ``shard_root`` the
    workers' shards are written there first (prepare_shards, not timed) and each rank
    loads only its own. ``root``: run another source tree's _mpi_run.py and asyncopt
    (``rank_environment``; bench_paired's base), this checkout's by default. ``script``:
    a script run instead that takes these arguments and calls ``main`` with them
    (bench_timeline's rank side)."""
    mpirun = find_mpirun(mpirun)
    if mpirun is None:
        return None, 0.0, "no mpirun found (pip install mpich)"
    if shard_root is not None:
        extra_args = list(extra_args) + [
            "--shards", prepare_shards(data, n_ranks - 1, shard_root)]
    if script is None:
        script = SCRIPT if root is None else os.path.join(
            os.path.abspath(root), "benchmarks", os.path.basename(SCRIPT))
    cmd = [mpirun, "-n", str(n_ranks), sys.executable, script, "--out", out,
           "--data", data, "--loss", loss, "--lam-ratio", repr(float(lam_ratio)),
           "--method", method, "--tol", repr(float(tol)), "--max-time", repr(float(max_time)),
           "--seed", str(seed)] + (["--fit-intercept"] if fit_intercept else []) + \
        list(extra_args)
    wall, error = run_job(cmd, out, timeout, rank_environment(root))
    if error:
        return None, wall, error
    with open(out) as f:
        return json.load(f), wall, None


def run_job(cmd, out, timeout=None, env=None):
    """Run the mpirun command line ``cmd``, which writes the file ``out`` (removed first),
    in a session of its own with ``env`` (``rank_environment()`` by default): (wall
    seconds, error text or None). A run past ``timeout`` seconds has its process group
    killed (mpirun and the ranks it started); one that exits non-zero or writes no ``out``
    gives the tail of its output."""
    if os.path.exists(out):
        os.remove(out)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=rank_environment() if env is None else env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return time.perf_counter() - t0, f"killed after {timeout:.0f} s (timeout)"
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not os.path.exists(out):
        tail = (stderr or stdout or "").strip().splitlines()[-6:]
        return wall, f"mpirun exit {proc.returncode}: " + " | ".join(tail)
    return wall, None


# --------------------------------------------------------------------------- SPMD side

def make_penalty(n_features, group_size):
    """L1 for group_size 1, else the group Lasso on consecutive groups of that size
    (weights sqrt(|g|), the last group possibly smaller); bench_serial's too."""
    from asyncopt.penalties import L1, GroupL1
    return L1(n_features) if group_size == 1 else GroupL1(n_features, group_size)


def _warm_up(comm, method_flags, loss, fit_intercept, group_size=1):
    """The same method on a tiny CTR problem (every rank): kernels compiled or loaded from
    numba's cache, MPI connections set up, before anything is timed."""
    import numpy as np
    from asyncopt.data import make_ctr
    from asyncopt.losses import get_loss
    from asyncopt.problem import Problem
    from asyncopt.solvers.mpi import distributed_lam_max, solve_mpi

    rank, size = comm.Get_rank(), comm.Get_size()
    n, p = 60 * (size - 1), 120
    X, y, _ = make_ctr(n, p, nnz_per_row=5, random_state=1)
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    penalty = make_penalty(p, group_size)
    shard = None
    if rank > 0:
        lo, hi = worker_rows(n, size - 1, rank - 1)
        shard = Problem(X[lo:hi], y[lo:hi], loss, penalty, 1.0, fit_intercept,
                        overwrite_X=True)
    code = get_loss(loss).code
    lam = 0.1 * distributed_lam_max(comm, shard, penalty, n, code, fit_intercept)
    solve_mpi(comm, shard if shard is None else shard.with_lam(lam), penalty, p, code, lam,
              fit_intercept, tol=1e-5, max_epochs=3, random_state=0, **method_flags)
    if method_flags.get("support_newton") and penalty.is_l1:
        # three epochs seldom take the step: load its kernels here, not in the timed solve
        # (a chained step reduces the rows of the coordinates new to its support)
        from asyncopt.newton.kernels import SupportRows
        from asyncopt.newton.model import STEP_GRID
        active = Problem(X, y, loss, penalty, 1.0, fit_intercept).full_active_set()
        point = np.zeros(p + int(fit_intercept))
        rows = SupportRows(active, code, np.zeros(n), np.arange(p), fit_intercept, point)
        rows.hessian_triangle()
        rows.hessian_rows(np.arange(1))
        rows.hessian_diagonal()
        rows.hessian_times(point)
        rows.trial_sums(point, np.zeros((STEP_GRID.shape[0], point.shape[0])))


def _load_rows(args, rank, size):
    """(X, y) of this worker's contiguous row block (None, None on the server) and the
    whole problem's (n, p, nnz): from its --shards file, else by building the data."""
    import numpy as np
    import scipy.sparse as sp
    if args.shards:
        with open(os.path.join(args.shards, "meta.json")) as f:
            meta = json.load(f)
        if meta["n_workers"] != size - 1:
            raise SystemExit(f"{args.shards} holds shards for {meta['n_workers']} workers, "
                             f"not {size - 1}")
        n, p, nnz = meta["n_samples"], meta["n_features"], meta["nnz"]
        if rank == 0:
            return None, None, n, p, nnz
        with np.load(os.path.join(args.shards, f"shard_{rank - 1}.npz")) as f:
            y = f["y"]
            X = sp.csr_matrix((f["data"], f["indices"], f["indptr"]), shape=(y.shape[0], p))
        return X, y, n, p, nnz
    from benchmarks.bench_serial import load_data
    X, y = load_data(args.data)
    n, p = X.shape
    if rank == 0:
        return None, None, n, p, int(X.nnz)
    lo, hi = worker_rows(n, size - 1, rank - 1)
    return X[lo:hi], y[lo:hi], n, p, int(X.nnz)


def main(argv=None):
    parser = argparse.ArgumentParser(description="one solve_mpi run (run under mpirun)")
    parser.add_argument("--out", required=True, help="JSON written by rank 0")
    parser.add_argument("--data", required=True, help="a bench_serial.load_data key")
    parser.add_argument("--loss", default="squared", choices=("squared", "logistic"))
    parser.add_argument("--lam-ratio", type=float, required=True)
    parser.add_argument("--fit-intercept", action="store_true")
    parser.add_argument("--method", default="ddss", choices=METHODS)
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--max-time", type=float, default=None)
    parser.add_argument("--max-epochs", type=int, default=10 ** 7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=None,
                        help="local steps per message (solve_mpi's default_batch: "
                             "n / (m workers), m = 2.5 workers up to 4, else 10, or 25 "
                             "on an oversubscribed node)")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages per worker per epoch: batch = n / (M workers) "
                             "(instead of default_batch's M; --batch wins)")
    parser.add_argument("--no-support-newton", action="store_true",
                        help="Dis-DDSS without the support Newton step (an ablation)")
    parser.add_argument("--newton-products", action="store_true",
                        help="the L1 step's CG asks the workers for each Hessian-vector "
                             "product, as across machines, instead of reducing their "
                             "Hessian shares to the server as on one node (an ablation)")
    parser.add_argument("--no-warm-up", action="store_true")
    parser.add_argument("--group-size", type=int, default=1,
                        help="1: L1 (default); G > 1: the group Lasso on consecutive "
                             "groups of G features")
    parser.add_argument("--shards", default=None,
                        help="a prepare_shards folder: each worker loads only its shard")
    args = parser.parse_args(argv)

    t_process = time.perf_counter()
    from mpi4py import MPI

    sys.path.append(ROOT)
    import numpy as np
    import asyncopt
    from asyncopt.solvers.methods import solver_flags
    from asyncopt.losses import get_loss
    from asyncopt.problem import Problem
    from asyncopt.solvers.mpi import distributed_lam_max, solve_mpi
    from asyncopt.cli.common import freeze_at_exit

    freeze_at_exit()        # as the command lines: the mpirun's wall time is theirs
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("_mpi_run.py needs mpirun -n 2 or more (1 server + workers)")
    flags = solver_flags(args.method)
    if args.no_support_newton:
        flags["support_newton"] = False
    if args.newton_products:
        import asyncopt.solvers.mpi.newton as mpi_newton
        mpi_newton.cg_products_from_shares = \
            lambda wire, size: mpi_newton.uses_hessian_free(size)
    t0 = time.perf_counter()
    X, y, n, p, nnz = _load_rows(args, rank, size)
    penalty = make_penalty(p, args.group_size)
    shard, rows = None, 0
    if rank > 0:
        # as the command line's workers: the shard's arrays serve as the first view
        shard = Problem(X, y, args.loss, penalty, 1.0, args.fit_intercept,
                        overwrite_X=True)
        rows = X.shape[0]
    code = get_loss(args.loss).code
    del X, y
    # also builds each shard's shuffled CSR copy (cached, shared by with_lam): untimed
    lam_max = distributed_lam_max(comm, shard, penalty, n, code, args.fit_intercept)
    lam = args.lam_ratio * lam_max
    shard = None if shard is None else shard.with_lam(lam)
    t_load = time.perf_counter() - t0

    t0 = time.perf_counter()
    if not args.no_warm_up:
        _warm_up(comm, flags, args.loss, args.fit_intercept, args.group_size)
    comm.Barrier()
    t_warm = time.perf_counter() - t0

    batch = args.batch
    if batch is None and args.messages:
        batch = max(1, n // (args.messages * (size - 1)))
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = solve_mpi(comm, shard, penalty, p, code, lam, args.fit_intercept,
                       tol=args.tol, max_epochs=args.max_epochs, random_state=args.seed,
                       max_time=args.max_time, batch=batch, label=args.method,
                       **flags)
    t_solve, cpu_solve = time.perf_counter() - t0, time.process_time() - cpu0
    timings = comm.gather({"rank": rank, "rows": rows, "load_s": t_load,
                           "warm_up_s": t_warm, "solve_s": t_solve,
                           "solve_cpu_s": cpu_solve,
                           "process_s": time.perf_counter() - t_process}, root=0)
    if rank == 0:
        payload = {
            "method": args.method, "flags": flags, "n_ranks": size, "workers": size - 1,
            "data": args.data, "loss": args.loss, "fit_intercept": args.fit_intercept,
            "lam_ratio": args.lam_ratio, "lam_max": lam_max, "lam": lam,
            "group_size": args.group_size,
            "n_samples": n, "n_features": p, "nnz": nnz, "tol": args.tol,
            "max_time": args.max_time, "seed": args.seed,
            "batch": result.history[-1]["batch"],
            "messages": args.messages,
            "converged": bool(result.converged), "epochs": int(result.n_iter),
            "gap": float(result.gap), "primal": float(result.primal),
            "support": int(np.count_nonzero(result.coef)), "intercept": float(result.intercept),
            "ranks": timings, "history": result.history,
            "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
            "source": os.path.dirname(os.path.abspath(asyncopt.__file__)),
        }
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
