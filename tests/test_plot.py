"""plot_history and asyncopt-plot: the figure of a run (issue 48, item 6)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from asyncopt.cli.common import write_history, write_history_lines  # noqa: E402
from asyncopt.cli.plot import main  # noqa: E402
from asyncopt.plot import plot_history, read_history  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROG = "asyncopt-plot"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def records():
    """A made-up history: the gap falls, screening drops features, a working-set step at
    epochs 1 and 2 only, and one record without coef_nnz."""
    return [
        {"epoch": 0, "time": 0.01, "gap": 2.0, "rel_gap": 0.5, "n_active": 500,
         "coef_nnz": 0, "working_set": None},
        {"epoch": 1, "time": 0.25, "gap": 0.2, "rel_gap": 0.05, "n_active": 400,
         "coef_nnz": 12, "working_set": 20},
        {"epoch": 2, "time": 0.5, "gap": 2e-4, "rel_gap": 5e-5, "n_active": 90,
         "coef_nnz": None, "working_set": 40},
        {"epoch": 3, "time": 1.5, "gap": 4e-9, "rel_gap": 1e-9, "n_active": 30,
         "coef_nnz": 25, "working_set": None},
    ]


def column(history, key):
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in history])


def assert_line(line, x, y):
    np.testing.assert_array_equal(line.get_xydata(), np.column_stack([x, y]))


@pytest.fixture(scope="module")
def fitted():
    """A real quick fit: a Lasso on 2,000 rows of a9a."""
    from asyncopt import Lasso
    from asyncopt.data import load_a9a

    X, y = load_a9a()
    return Lasso(alpha=0.005, tol=1e-6, max_epochs=30).fit(X[:2000], y[:2000])


# -- the figure ---------------------------------------------------------------

def test_the_lines_hold_the_records_values():
    history = records()
    fig = plot_history(history)
    time, epoch, rel = (column(history, k) for k in ("time", "epoch", "rel_gap"))
    by_time, by_epoch, counts = fig.axes
    assert len(fig.axes) == 3 and len(by_time.lines) == len(by_epoch.lines) == 1
    assert_line(by_time.lines[0], time, rel)
    assert_line(by_epoch.lines[0], epoch, rel)
    assert [line.get_label() for line in counts.lines] == [
        "active (left by screening)", "non-zero coefficients", "working set"]
    for line, key in zip(counts.lines, ("n_active", "coef_nnz", "working_set")):
        assert_line(line, epoch, column(history, key))
    assert by_time.get_yscale() == by_epoch.get_yscale() == "log"
    assert counts.get_yscale() == "symlog"            # 500 features: more than 100
    assert by_time.get_xlabel() == "wall time (s)"
    assert by_epoch.get_ylabel() == "relative duality gap"
    assert [t.get_text() for t in counts.get_legend().get_texts()] == [
        line.get_label() for line in counts.lines]


def test_absolute_gap_and_the_fallback_without_rel_gap():
    history = records()
    fig = plot_history(history, gap="gap")
    assert_line(fig.axes[0].lines[0], column(history, "time"), column(history, "gap"))
    assert fig.axes[0].get_ylabel() == "duality gap"
    bare = [{k: v for k, v in r.items() if k != "rel_gap"} for r in history]
    fig = plot_history(bare)
    assert_line(fig.axes[1].lines[0], column(history, "epoch"), column(history, "gap"))
    with pytest.raises(ValueError, match="gap must be one of"):
        plot_history(history, gap="primal")


def test_small_counts_stay_linear_and_absent_series_are_not_drawn():
    history = [{"epoch": e, "time": 0.1 * e, "gap": 10.0 ** -e, "n_active": 12 - e}
               for e in range(4)]
    counts = plot_history(history).axes[2]
    assert [line.get_label() for line in counts.lines] == ["active (left by screening)"]
    assert counts.get_yscale() == "linear"


def test_gaps_that_are_not_positive_leave_the_axis_linear():
    fig = plot_history([{"epoch": 0, "time": 0.0, "gap": 0.0, "rel_gap": 0.0}])
    assert fig.axes[0].get_yscale() == "linear"
    assert_line(fig.axes[0].lines[0], [0.0], [0.0])


def test_draws_on_given_axes_with_a_title():
    fig, axes = plt.subplots(2, 3)
    out = plot_history(records(), ax=axes[1], title="a run")
    assert out is fig and len(axes[1, 0].lines) == 1 and not axes[0, 0].lines
    assert fig.get_suptitle() == "a run"
    with pytest.raises(ValueError, match="3 Axes"):
        plot_history(records(), ax=axes[0, :2])


def test_a_fitted_estimator_plots(fitted):
    history = fitted.history_
    fig = plot_history(fitted)
    assert_line(fig.axes[0].lines[0], column(history, "time"), column(history, "rel_gap"))
    assert_line(fig.axes[2].lines[1], column(history, "epoch"), column(history, "coef_nnz"))
    assert fig.axes[1].get_yscale() == "log"


def test_a_history_file_plots_as_its_records(fitted, tmp_path):
    lines, whole = tmp_path / "run.jsonl", tmp_path / "run.json"
    write_history_lines(lines, fitted.history_)
    write_history(whole, fitted.history_)
    assert read_history(lines) == read_history(whole) == json.loads(whole.read_text())
    for path in (lines, str(whole)):
        fig = plot_history(path)
        assert_line(fig.axes[1].lines[0], column(fitted.history_, "epoch"),
                    column(fitted.history_, "rel_gap"))


def test_infinities_written_as_strings_read_back(tmp_path):
    history = records()
    history[0]["gap"] = history[0]["rel_gap"] = float("inf")
    path = tmp_path / "run.jsonl"
    write_history_lines(path, history)
    assert '"inf"' in path.read_text()
    y = plot_history(path).axes[0].lines[0].get_xydata()[:, 1]
    np.testing.assert_array_equal(y, column(history, "rel_gap"))


@pytest.mark.parametrize("bad, error, match", [
    ([], ValueError, "no records"),
    ([{"epoch": 0, "primal": 1.0}], ValueError, "no record has a 'gap' field"),
    ([{"gap": "small"}], ValueError, "record 1: gap is not a number"),
    ({"gap": 1.0}, TypeError, "list of records"),
    ([[1.0, 2.0]], TypeError, "record 1 is a list"),
])
def test_bad_histories_are_refused(bad, error, match):
    with pytest.raises(error, match=match):
        plot_history(bad)


def test_an_unfitted_estimator_is_refused():
    from asyncopt import Lasso

    with pytest.raises(ValueError, match="not fitted"):
        plot_history(Lasso(alpha=0.1))


def test_without_matplotlib_the_error_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot_history(records())
    path = tmp_path / "run.jsonl"
    write_history_lines(path, records())
    status, err = cli([path], capsys)
    assert status == 1 and "pip install matplotlib" in err
    assert_one_line_error(err)


def test_importing_asyncopt_does_not_import_matplotlib():
    code = ("import sys, asyncopt\n"
            "assert callable(asyncopt.plot_history)\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert run.returncode == 0, run.stderr


# -- the command line ---------------------------------------------------------

def cli(argv, capsys):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, err


def assert_one_line_error(err):
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith(f"{PROG}: error: "), lines[0]
    assert "Traceback" not in err


def test_cli_writes_a_png_of_the_figure_size(fitted, tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    write_history_lines(path, fitted.history_)
    status = main([str(path), "-o", str(tmp_path / "small.png"), "--dpi", "50",
                   "--title", "a9a"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "small.png" in out and err == ""
    image = mpimg.imread(tmp_path / "small.png")
    assert image.shape == (190, 650, 4)               # 13 x 3.8 inches at 50 dpi
    assert image[..., :3].std() > 0.05                 # something was drawn
    assert main([str(path)]) == 0                      # default: run.png beside it
    assert mpimg.imread(tmp_path / "run.png").shape == (380, 1300, 4)


def test_cli_in_a_real_process(fitted, tmp_path):
    path = tmp_path / "run.jsonl"
    write_history_lines(path, fitted.history_)
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    ok = subprocess.run([sys.executable, "-m", "asyncopt.cli.plot", str(path), "-o",
                         str(tmp_path / "run.svg")], capture_output=True, text=True,
                        env=env)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "run.svg").read_text().lstrip().startswith("<?xml")
    bad = subprocess.run([sys.executable, "-m", "asyncopt.cli.plot",
                          str(tmp_path / "missing.jsonl")], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 1
    assert_one_line_error(bad.stderr)


def good_line():
    return json.dumps(records()[0]) + "\n"


@pytest.mark.parametrize("case, content, status, match", [
    ("missing", None, 1, r"No such file or directory: \S*missing\.jsonl"),
    ("empty", "", 1, r"empty\.jsonl: empty file"),
    ("blank", "\n  \n", 1, r"blank\.jsonl: empty file"),
    ("bad-json", good_line() + '{"epoch": 1, "gap": \n' + good_line(), 1,
     r"bad-json\.jsonl, line 2: not JSON"),
    ("not-a-record", good_line() + "[1, 2]\n", 1, r"not-a-record\.jsonl, line 2: not a "
                                                   r"history record"),
    ("no-gap", '{"epoch": 0, "time": 0.1}\n{"epoch": 1, "time": 0.2}\n', 1,
     r"no-gap\.jsonl: no record has a 'gap' field"),
    ("binary", "\x89PNG\r\n", 1, r"binary\.jsonl, line 1: not JSON"),
    ("bad-format", good_line(), 1, r"Format 'xyz' is not supported"),
    ("no-folder", good_line(), 1, r"No such file or directory: \S*nowhere"),
])
def test_cli_bad_input_is_one_line(case, content, status, match, tmp_path, capsys):
    path = tmp_path / f"{case}.jsonl"
    if content is not None:
        path.write_bytes(content.encode("latin-1"))
    output = {"bad-format": tmp_path / "run.xyz",
              "no-folder": tmp_path / "nowhere" / "run.png"}.get(case, tmp_path / "out.png")
    got, err = cli([path, "-o", output], capsys)
    assert got == status, err
    assert_one_line_error(err)
    assert re.search(match, err), err
    assert not (tmp_path / "out.png").exists()


def test_cli_usage_errors_exit_2(capsys):
    status, err = cli([], capsys)
    assert status == 2
    assert_one_line_error(err)
    status, err = cli(["run.jsonl", "--dpi", "0"], capsys)
    assert status == 2 and "--dpi" in err
