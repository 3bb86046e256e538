"""Command line (asyncopt-lasso / asyncopt-logreg) and the progress line."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncopt.progress import ProgressLine, format_bytes

REPO = Path(__file__).resolve().parents[1]


# -- helpers ------------------------------------------------------------------

def write_libsvm(path, n=80, p=12, labels=(-1, 1), seed=0):
    """A small sparse LIBSVM file whose labels depend on 3 of the features."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.5)
    w = np.zeros(p)
    w[:3] = [2.0, -1.5, 1.0]
    score = X @ w + 0.1 * rng.standard_normal(n)
    if len(labels) == 2:
        y = np.where(score > 0, labels[1], labels[0])
    else:
        y = np.asarray(labels)[rng.integers(0, len(labels), n)]
    with open(path, "w") as f:
        for i in range(n):
            feats = " ".join(f"{j + 1}:{X[i, j]:.6g}" for j in np.flatnonzero(X[i]))
            f.write(f"{y[i]:g} {feats}\n".replace(" \n", "\n"))
    return path


def run_main(prog, argv, capsys):
    if prog == "asyncopt-lasso":
        from asyncopt.cli.lasso import main
    else:
        from asyncopt.cli.logreg import main
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def run_subprocess(module, argv):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run(
        [sys.executable, "-m", module, *[str(a) for a in argv]],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )


def assert_one_line_error(err, prog):
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert "Traceback" not in err


PROGS = ["asyncopt-lasso", "asyncopt-logreg"]


# -- successful runs ----------------------------------------------------------

@pytest.mark.parametrize("prog", PROGS)
def test_cli_success_prints_summary(prog, tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm", labels=(0, 1))
    hist = tmp_path / "hist.json"
    coef = tmp_path / "coef.npz"
    status, out, err = run_main(
        prog,
        [data, "--alpha-ratio", "0.05", "--max-epochs", "50", "--tol", "1e-6",
         "--seed", "1", "--quiet", "--history-json", hist, "--save-coef", coef],
        capsys,
    )
    assert status == 0, err
    assert f"{prog} summary" in out
    for key in ("data", "alpha", "objective", "duality gap", "kept by screening",
                "non-zero coef", "outer iterations", "wall time"):
        assert key in out, (key, out)
    assert "80 x 12" in out
    assert "Traceback" not in err

    history = json.loads(hist.read_text())
    assert isinstance(history, list) and len(history) >= 1
    assert {"epoch", "gap", "n_active"} <= set(history[-1])
    saved = np.load(coef)
    assert saved["coef"].shape == (12,)


def test_cli_progress_goes_to_stderr(tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm")
    status, out, err = run_main(
        "asyncopt-lasso", [data, "--alpha-ratio", "0.1", "--max-epochs", "20"], capsys)
    assert status == 0, err
    assert "epoch" in err and "gap" in err
    assert "epoch" not in out.split("summary")[0]


def test_cli_explicit_alpha_and_options(tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm")
    status, out, err = run_main(
        "asyncopt-lasso",
        [data, "--alpha", "0.05", "--no-screening", "--no-intercept",
         "--method", "ddss_naive", "--max-epochs", "5", "--quiet"],
        capsys,
    )
    assert status == 0, err
    assert "5.0000e-02" in out
    assert "screening off" in out


def test_cli_threads_backend_and_baseline_method(tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm")
    status, out, err = run_main(
        "asyncopt-lasso", [data, "--backend", "threads", "--n-jobs", "2", "--quiet"], capsys)
    assert status == 0, err
    assert "threads (2 threads), screening on" in out
    status, out, err = run_main(
        "asyncopt-logreg", [data, "--method", "prox_asaga"], capsys)
    assert status == 0, err
    assert "prox_asaga, threads (" in out and "screening off" in out
    assert "started without mpirun: running the threads backend" in err
    status, out, err = run_main(
        "asyncopt-lasso", [data, "--method", "pse_strong", "--backend", "threads",
                           "--n-jobs", "2", "--quiet"], capsys)
    assert status == 0, err
    assert "pse_strong, threads (2 threads), screening static" in out


def test_cli_checkpoint_resumes(tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm")
    ckpt = tmp_path / "run.npz"
    # ddss: one prox-SVRG epoch leaves it unsolved (a working set may solve 12 features)
    argv = [data, "--alpha-ratio", "0.05", "--tol", "1e-9", "--max-epochs", "1", "--quiet",
            "--method", "ddss", "--checkpoint", ckpt]
    status, out, err = run_main("asyncopt-lasso", argv, capsys)
    assert status == 0, err
    assert ckpt.exists() and "NOT reached" in out
    first = json.loads(str(np.load(ckpt)["history"]))
    assert [h["epoch"] for h in first] == [0, 1]
    argv[argv.index("1")] = "5000"
    status, out, err = run_main("asyncopt-lasso", argv, capsys)
    assert status == 0, err
    assert "NOT reached" not in out
    second = json.loads(str(np.load(ckpt)["history"]))
    assert second[:2] == first and second[2]["epoch"] == 2   # continued, not restarted


@pytest.mark.slow
@pytest.mark.parametrize("prog", PROGS)
def test_cli_default_a9a(prog, capsys):
    status, out, err = run_main(prog, ["--quiet"], capsys)
    assert status == 0, err
    assert "a9a" in out and "123" in out


def test_cli_data_flag_is_the_positional_data(tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm")
    runs = {}
    for name, argv in {"positional": [data], "flag": ["--data", data],
                       "both": [data, "--data", data]}.items():
        status, out, err = run_main("asyncopt-lasso", [*argv, "--quiet", "--backend",
                                                       "serial", "--tol", "1e-10"], capsys)
        assert status == 0, err
        runs[name] = [line for line in out.splitlines() if "objective" in line
                      or "data " in line]
    assert "small.svm: 80 x 12" in runs["flag"][0]
    assert runs["flag"] == runs["positional"] == runs["both"]


def test_cli_two_data_files_is_a_usage_error(tmp_path, capsys):
    first = write_libsvm(tmp_path / "first.svm")
    second = write_libsvm(tmp_path / "second.svm", seed=1)
    status, out, err = run_main("asyncopt-lasso", [first, "--data", second], capsys)
    assert status == 2
    assert_one_line_error(err, "asyncopt-lasso")
    assert "first.svm" in err and "second.svm" in err


# -- user errors: one line, no traceback ----------------------------------------

@pytest.mark.parametrize("prog", PROGS)
def test_missing_file(prog, tmp_path, capsys):
    missing = tmp_path / "does-not-exist.svm"
    status, out, err = run_main(prog, [missing], capsys)
    assert status == 1
    assert_one_line_error(err, prog)
    assert "does-not-exist.svm" in err


@pytest.mark.parametrize("prog", PROGS)
def test_malformed_line_names_file_and_line(prog, tmp_path, capsys):
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5 2:1.0\n-1 2:0.25\n1 3:abc\n-1 1:1\n")
    status, out, err = run_main(prog, [bad], capsys)
    assert status == 1
    assert_one_line_error(err, prog)
    assert "bad.svm" in err
    assert "line 3" in err or "bad.svm:3" in err, err


@pytest.mark.parametrize("flag", ["--output", "--save-coef", "--history", "--history-json",
                                  "--checkpoint"])
def test_an_output_path_without_its_folder_fails_before_the_solve(flag, tmp_path, capsys,
                                                                  monkeypatch):
    """A file the run would write at its end (or on the way, the checkpoint) in a folder
    that does not exist, or under a file: one line naming the path, before any data is
    read, not after the solve."""
    import asyncopt.cli.common as common
    data = write_libsvm(tmp_path / "small.svm")
    monkeypatch.setattr(common, "load_data", lambda *a: pytest.fail("data read first"))
    cases = [(str(tmp_path / "none" / "out.npz"), "No such file or directory"),
             (str(data / "out.npz"), "Not a directory"),
             (str(tmp_path / "new") + os.sep, "No such file or directory")]
    if flag != "--checkpoint":      # a checkpoint may be a folder (checkpoint.npz in it)
        cases.append((str(tmp_path), "Is a directory"))
    for path, reason in cases:
        status, out, err = run_main("asyncopt-lasso", [data, flag, path], capsys)
        assert status == 1
        assert_one_line_error(err, "asyncopt-lasso")
        assert reason in err and path in err


@pytest.mark.parametrize("prog", PROGS)
@pytest.mark.parametrize("argv", [["--alpha", "0"], ["--alpha=-1"], ["--alpha-ratio", "0"],
                                  ["--tol", "-1e-3"], ["--max-epochs", "0"],
                                  ["--method", "nope"], ["--alpha", "abc"]])
def test_bad_argument_values(prog, argv, tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm")
    status, out, err = run_main(prog, [data, *argv], capsys)
    assert status == 2
    assert_one_line_error(err, prog)


def test_three_class_labels_for_logreg(tmp_path, capsys):
    data = write_libsvm(tmp_path / "three.svm", labels=(0, 1, 2))
    status, out, err = run_main("asyncopt-logreg", [data], capsys)
    assert status == 1
    assert_one_line_error(err, "asyncopt-logreg")
    assert "binary" in err and "3" in err


@pytest.mark.parametrize("module,prog,case", [
    ("asyncopt.cli.lasso", "asyncopt-lasso", "missing"),
    ("asyncopt.cli.lasso", "asyncopt-lasso", "malformed"),
    ("asyncopt.cli.logreg", "asyncopt-logreg", "three-class"),
    ("asyncopt.cli.logreg", "asyncopt-logreg", "alpha"),
])
def test_errors_in_a_real_process(module, prog, case, tmp_path):
    """Same checks in a fresh interpreter: exit status and a one-line stderr."""
    if case == "missing":
        argv, want = [tmp_path / "nope.svm"], 1
    elif case == "malformed":
        bad = tmp_path / "bad.svm"
        bad.write_text("1 1:0.5\n1 x:1\n")
        argv, want = [bad], 1
    elif case == "three-class":
        argv, want = [write_libsvm(tmp_path / "three.svm", labels=(0, 1, 2))], 1
    else:
        argv, want = [write_libsvm(tmp_path / "ok.svm"), "--alpha", "-2"], 2
    proc = run_subprocess(module, argv)
    assert proc.returncode == want, proc.stderr
    assert_one_line_error(proc.stderr, prog)


# -- progress line --------------------------------------------------------------

class TTYStringIO(io.StringIO):
    def isatty(self):
        return True


def record(epoch, gap=1e-3):
    return dict(epoch=epoch, time=0.1 * epoch, primal=1.0 + gap, dual=1.0, gap=gap,
                rel_gap=gap / 2.0, n_active=1234 - epoch, n_features=100_000,
                active_nnz=5000, inner_steps=100, bytes_sent=0, bytes_recv=0)


def test_progress_silent_at_verbose_0():
    s = io.StringIO()
    with ProgressLine(verbose=0, stream=s) as pl:
        for k in range(5):
            pl.update(record(k))
    assert s.getvalue() == ""


def test_progress_non_tty_is_plain_and_throttled():
    s = io.StringIO()
    with ProgressLine(verbose=1, stream=s, label="ddss") as pl:
        for k in range(1, 6):
            pl.update(record(k, gap=10.0 ** -k))
    text = s.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    # first update printed at once, the rest throttled; the last one on close
    assert len(lines) == 2, lines
    assert "epoch" in lines[0] and "gap" in lines[0]
    assert "epoch   5" in lines[-1] and "1.0e-05" in lines[-1]
    assert "1,229/100,000" in lines[-1]


def test_progress_verbose_2_prints_every_update():
    s = io.StringIO()
    with ProgressLine(verbose=2, stream=s) as pl:
        for k in range(4):
            pl.update(record(k))
    assert len(s.getvalue().splitlines()) == 4


def test_progress_tty_rewrites_in_place():
    s = TTYStringIO()
    pl = ProgressLine(verbose=1, stream=s, label="ddss")
    for k in range(3):
        pl.update(record(k))
    text = s.getvalue()
    assert text.count("\r") == 3
    assert "\n" not in text
    pl.close()
    assert s.getvalue().endswith("\n")
    assert "ddss | epoch   2 | gap" in s.getvalue()
    pl.close()  # idempotent
    assert s.getvalue().count("\n") == 1


def test_progress_line_marks_a_newton_step():
    from asyncopt.progress import format_record
    assert "Newton" not in format_record(record(3))
    assert "Newton step t=0.5 |" in format_record(dict(record(3), newton_step=0.5))


def test_progress_line_shows_the_non_zeros_of_x():
    from asyncopt.progress import format_record
    line = format_record(dict(record(3), coef_nnz=46_000))
    assert "active 1,231/100,000 | nnz(x) 46,000 | sent" in line
    assert "nnz(x)" not in format_record(record(3))


def test_history_counts_the_non_zeros_of_x():
    from sklearn.datasets import make_regression
    from asyncopt import Lasso, lam_max
    X, y = make_regression(n_samples=60, n_features=30, n_informative=5, random_state=0)
    est = Lasso(alpha=0.1 * lam_max(X, y), tol=1e-8, random_state=0).fit(X, y)
    last = est.history_[-1]
    assert last["coef_nnz"] == np.count_nonzero(est.coef_) > 0
    assert all(0 <= h["coef_nnz"] <= h["n_active"] for h in est.history_)


def test_progress_bytes_human_readable():
    assert format_bytes(0) == "0 B"
    assert format_bytes(999) == "999 B"
    assert format_bytes(1500) == "1.5 kB"
    assert format_bytes(2_500_000) == "2.5 MB"
    assert format_bytes(3.2e9) == "3.2 GB"
    s = io.StringIO()
    with ProgressLine(verbose=2, stream=s) as pl:
        rec = record(1)
        rec.update(bytes_sent=1_200_000, bytes_recv=3000)
        pl.update(rec)
    assert "sent 1.2 MB" in s.getvalue() and "recv 3.0 kB" in s.getvalue()


def test_cli_output_history_lines_and_resume(tmp_path, capsys):
    data = write_libsvm(tmp_path / "small.svm")
    status, out, err = run_main("asyncopt-lasso", [data, "--quiet", "--resume",
                                                   "--checkpoint", str(tmp_path)], capsys)
    assert status == 2 and "--resume needs an existing --checkpoint file" in err
    argv = [data, "--quiet", "--checkpoint", str(tmp_path), "--max-epochs", "2",
            "--tol", "1e-12", "--method", "ddss", "--output", str(tmp_path / "model.npz"),
            "--history", str(tmp_path / "run.jsonl")]
    status, out, err = run_main("asyncopt-lasso", argv, capsys)
    assert status == 0, err
    assert (tmp_path / "checkpoint.npz").exists()
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0, 1, 2]
    model = np.load(tmp_path / "model.npz")
    assert {"coef", "intercept", "alpha", "format", "loss", "n_features"} == set(model.files)
    status, out, err = run_main("asyncopt-lasso", argv + ["--resume"], capsys)
    assert status == 0, err
    resumed = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in resumed] == [0, 1, 2, 3, 4, 5]


def test_an_interrupt_lost_in_a_finalizer_still_ends_an_mpi_rank():
    """Under mpirun a Ctrl-C that lands inside a ``__del__`` (as while numba compiles) is
    dropped by Python; the rank must end anyway, with status 130 and the leader's one
    "interrupted" line, instead of running on while the other ranks wait for it."""
    script = (
        "import os, signal, sys, time\n"
        "from asyncopt.cli.common import _end_on_interrupt\n"
        "_end_on_interrupt('prog', leader=True, grace=0.5)\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.05)\n"          # the handler runs here, in the finalizer
        "Finalized()\n"
        "time.sleep(30)\n"
        "sys.exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=20)
    assert "Exception ignored" in done.stderr          # the interrupt was dropped ...
    assert done.returncode == 130, done.stderr          # ... and the process ended
    assert done.stderr.count("prog: interrupted") == 1, done.stderr
