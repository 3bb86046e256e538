"""Start-up of an MPI rank: what it imports and what data it reads."""
import ast
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._mpi_run import _load_rows, prepare_shards  # noqa: E402
from benchmarks.bench_serial import load_data  # noqa: E402


def test_a_solver_rank_does_not_import_scikit_learn():
    code = ("import sys\n"
            "from asyncopt.solvers.methods import solver_flags\n"
            "from asyncopt.solvers.mpi import solve_mpi\n"
            "from asyncopt.problem import Problem\n"
            "from asyncopt.data import make_ctr\n"
            "import asyncopt\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn')\n"
            "assert not loaded, loaded\n"
            "assert asyncopt.Lasso.__module__ == 'asyncopt.estimators'\n"
            "assert 'sklearn' in sys.modules\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


CLI_RANK = """
import importlib
import sys
main = importlib.import_module(sys.argv[1]).main
code = main(["--quiet", "--max-epochs", "2"] + sys.argv[2:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "sklearn")
assert not loaded, loaded[:5]
sys.exit(code)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("cli", ["asyncopt.cli.lasso", "asyncopt.cli.logreg"])
@pytest.mark.parametrize("data", ["embedded", "file"])
def test_cli_ranks_under_mpirun_do_not_import_scikit_learn(tmp_path, cli, data):
    """Each rank of mpirun -n K asyncopt-lasso / -logreg, on the embedded data or on its
    byte range of a LIBSVM file, runs solve_mpi without the estimators, parses its rows
    and encodes its labels without scikit-learn: its import (with scipy.stats) cost every
    rank ~5 s of start-up at -n 9 on 2 cores (0.6 s on one idle core)."""
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    extra = []
    if data == "file":
        rng = np.random.default_rng(0)
        lines = [f"{rng.choice([-1, 1])} " + " ".join(
            f"{j + 1}:{rng.standard_normal():.6g}" for j in sorted(rng.choice(30, 4, False)))
            for _ in range(200)]
        (tmp_path / "d.svm").write_text("\n".join(lines) + "\n")
        extra = ["--data", str(tmp_path / "d.svm")]
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([mpirun, "-n", "3", sys.executable, "-c", CLI_RANK, cli] + extra,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-1000:] + run.stderr[-2000:]


@pytest.mark.parametrize("cli", ["asyncopt.cli.lasso", "asyncopt.cli.logreg"])
def test_the_command_without_mpirun_does_not_import_scikit_learn(cli):
    """asyncopt-lasso / -logreg in one process (the threads backend) solve with
    solve_method, not the estimators: scikit-learn's import was 0.6 s of a 2.3 s run on
    CTR 200,000 x 100,000."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", CLI_RANK, cli], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-1000:] + run.stderr[-2000:]
    assert "auto, threads (" in run.stdout


def test_each_worker_reads_exactly_its_rows_from_the_shard_files(tmp_path):
    X, y = load_data("ctr_small")
    folder = prepare_shards("ctr_small", 3, str(tmp_path))
    assert prepare_shards("ctr_small", 3, str(tmp_path)) == folder    # written once
    args = SimpleNamespace(shards=folder, data="ctr_small")
    blocks = []
    for rank in range(4):
        Xr, yr, n, p, nnz = _load_rows(args, rank, 4)
        assert (n, p, nnz) == (X.shape[0], X.shape[1], X.nnz)
        if rank == 0:
            assert Xr is None and yr is None
            continue
        blocks.append((Xr, yr))
    assert [b[0].shape[0] for b in blocks] == [len(part) for part in
                                              np.array_split(np.arange(X.shape[0]), 3)]
    assert (sp.vstack([b[0] for b in blocks]) != X).nnz == 0
    np.testing.assert_array_equal(np.concatenate([b[1] for b in blocks]), y)
    # the same rows as building the data on every rank
    Xs, ys, *_ = _load_rows(SimpleNamespace(shards=None, data="ctr_small"), 2, 4)
    assert (Xs != blocks[1][0]).nnz == 0
    np.testing.assert_array_equal(ys, blocks[1][1])


def test_shards_for_another_worker_count_are_refused(tmp_path):
    folder = prepare_shards("ctr_small", 2, str(tmp_path))
    with pytest.raises(SystemExit, match="2 workers, not 3"):
        _load_rows(SimpleNamespace(shards=folder, data="ctr_small"), 1, 4)


EPOCH_KERNELS_FROM_CACHE = """
import numpy as np
from asyncopt.kernels import svrg
from asyncopt.kernels.workspace import Clock, SvrgStep
from asyncopt.data import make_ctr
from asyncopt.penalties import GroupL1, L1
from asyncopt.problem import Problem
X, y, _ = make_ctr(50, 12, nnz_per_row=3, random_state=0)
counts = []
for penalty, names in ((L1(12), ("svrg_epoch_l1", "svrg_epoch_l1_tracked")),
                       (GroupL1(12, 4), ("svrg_epoch_group", "svrg_epoch_group_tracked"))):
    a = Problem(X, y, "squared", penalty, 0.1, True).full_active_set()
    step = SvrgStep(np.zeros(50), np.zeros(12), 0.0, np.full(a.penalty.n_blocks, 0.01), 0.1,
                    0.1)
    for name in names:
        kernel = getattr(svrg, name)
        kernel(a.kernel_rows(), a.kernel_blocks(), step, np.zeros(12), np.zeros(1),
               np.arange(50), Clock.fresh())
        counts.append((sum(kernel.stats.cache_hits.values()),
                       sum(kernel.stats.cache_misses.values())))
print(counts)
"""


def test_a_new_process_loads_the_epoch_kernels_from_numbas_cache(tmp_path):
    """The four SVRG epoch kernels (made by a closure factory) are loaded from numba's
    on-disk cache by a second process, not compiled again: when the closures captured
    other dispatchers, whose pickled form differs per process, every rank spent ~1 s of
    CPU compiling them and left one more cache file (thousands had piled up)."""
    env = dict(os.environ, PYTHONPATH=ROOT, NUMBA_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", EPOCH_KERNELS_FROM_CACHE], env=env,
                           capture_output=True, text=True) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    first, second = (ast.literal_eval(run.stdout.strip().splitlines()[-1])
                     for run in runs)
    assert first == [(0, 1)] * 4              # compiled into the empty cache
    assert second == [(1, 0)] * 4             # then loaded, nothing compiled
    assert len(list(tmp_path.rglob("*epoch_l1*.nbc"))) == 2    # serial and tracked


@pytest.mark.mpi
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_server_kernels_loaded_before_a_solve_are_the_ones_it_runs(tmp_path, loss):
    """load_server_kernels (what the command line's server runs while the workers parse)
    loads each server kernel with the overloads solve_mpi's server then calls: the solve
    adds none. An overload of other types would leave numba's load (and, first in the
    process, its 0.2 s context) inside the first certificate."""
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    out = tmp_path / "kernels.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([mpirun, "-n", "3", sys.executable,
                          os.path.join(ROOT, "tests", "mpi", "server_kernels.py"),
                          str(out), loss], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-1000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["converged"]
    assert all(result["warmed"].values()), result["warmed"]
    assert result["added"] == {name: [] for name in result["warmed"]}, result["added"]


def test_the_command_freezes_its_objects_before_the_last_collection(tmp_path):
    """run_main registers gc.freeze at exit (freeze_at_exit): the interpreter's final
    collection then skips what numba built, 0.27 s a process. A handler registered
    before main runs after the command's (atexit runs them last in, first out) and sees
    the frozen objects."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
            "from asyncopt.cli.lasso import main\n"
            "sys.exit(main(['--quiet', '--max-epochs', '1']))\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    frozen = int(run.stdout.split("frozen")[-1])
    assert frozen > 10_000, run.stdout[-500:]
