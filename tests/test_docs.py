"""The documentation: it builds without a warning, the README's Python examples and
command lines run as written, its links resolve, its headline table is the result
file's, every table of measurements names a result file, and the history schema it
documents is the one the solvers write."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_cli import write_libsvm

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def code_blocks(path, language):
    """The fenced blocks of ``language`` ("" for a fence without one) in the Markdown file
    ``path``, in order."""
    blocks, info, lines = [], None, []
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            if info is None:
                info, lines = line[3:].strip(), []
            else:
                if info == language:
                    blocks.append("\n".join(lines) + "\n")
                info = None
        elif info is not None:
            lines.append(line)
    return blocks


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-6000:]
    assert (tmp_path / "html" / "api.html").exists()


@pytest.mark.parametrize("path", [README, DOCS / "guide" / "estimators.md"],
                         ids=lambda p: p.name)
def test_python_examples_run_as_written(path):
    blocks = code_blocks(path, "python")
    assert blocks, f"{path.name} has no Python example"
    namespace = {}
    for block in blocks:
        exec(compile(block, str(path), "exec"), namespace)   # noqa: S102 - our own docs


def test_readme_commands_run_as_written(tmp_path):
    """The README's command lines, in a directory that holds its file names: ``.venv``
    (this checkout's), ``data.svm``, a ``hostfile.example`` of this machine, and /data and
    /shared as folders here. Each ends with a certified fit, and the mpirun one, run again
    as its text says, resumes from its checkpoint."""
    if not (ROOT / ".venv" / "bin" / "mpirun").exists():
        pytest.fail("the README's mpirun command needs mpirun in .venv: run `make install`")
    commands = [block.replace("\\\n", " ") for block in code_blocks(README, "")
                if block.startswith(".venv/bin/")]
    assert len(commands) >= 2, commands
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "hostfile.example").write_text("localhost:9\n")
    for folder in ("data", "shared"):
        (tmp_path / folder).mkdir()
    for path in (tmp_path / "data.svm", tmp_path / "data" / "big.svm",
                 tmp_path / "train.svm"):
        write_libsvm(path, n=400, p=30)
    write_libsvm(tmp_path / "test.svm", n=100, p=30, seed=1)
    for command in commands:
        here = command.replace(" /data/", f" {tmp_path}/data/") \
            .replace(" /shared/", f" {tmp_path}/shared/")
        histories = []
        for _ in (1, 2) if "--checkpoint" in command else (1,):
            run = subprocess.run(["bash", "-c", here], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=300)
            assert run.returncode == 0, (command, run.stdout[-3000:], run.stderr[-3000:])
            histories.append([json.loads(line) for line in
                              (tmp_path / ("shared" if "/shared/" in command else ".") /
                               "run.jsonl").read_text().splitlines()])
            assert histories[-1][-1]["rel_gap"] <= 1e-6, (command, histories[-1][-1])
        if len(histories) == 2:     # the rerun went on from the first run's last epoch
            first, again = histories
            assert len(again) > len(first) and again[:len(first)] == first
            assert again[len(first)]["epoch"] >= first[-1]["epoch"], again[len(first)]


@pytest.mark.parametrize("path", [README, ROOT / "benchmarks" / "README.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_of_measurements_names_its_result_file(path):
    """Each table of the README and of benchmarks/README.md names, within four lines
    before or after it, a result file that benchmarks/results/ holds."""
    lines, unnamed, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        around = " ".join(lines[max(0, i - 4):i] + lines[end:end + 4])
        if not any((ROOT / "benchmarks" / "results" / name).exists()
                   for name in re.findall(r"results/([\w.\-]+\.json)", around)):
            unnamed.append(f"line {i + 1}: {lines[i][:60]}")
        i = end
    assert not unnamed, f"{path.relative_to(ROOT)}: tables without a result file: {unnamed}"


def markdown_links(path):
    return [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)",
                                            path.read_text())
            if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("path", [README, *sorted(DOCS.rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    missing = [t for t in markdown_links(path) if not (path.parent / t).exists()]
    assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


def headline_rows():
    """(data, model, {column: cell}) for each row of the README's table of seconds."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| data (n x p)"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows, data = [], None
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        data = cells[0].split(" (")[0] or data
        rows.append((data, cells[1], dict(zip(header[2:], cells[2:]))))
    return rows


def test_headline_table_is_the_result_files():
    results = {}
    for name in ("bench_real.json", "bench_real_more.json"):
        for row in json.loads((ROOT / "benchmarks" / "results" / name).read_text())["rows"]:
            if row["ratio"] == 0.01:
                results[row["data"], row["loss"]] = row["solvers"]
    names = {"dexter": "dexter", "leukemia": "leukemia", "rcv1s": "rcv1s",
             "reuters": "reuters", "CTR": "ctr", "a9a degree 2": "a9a_d2"}
    columns = {"asyncopt": "asyncopt", "2 threads": "2 threads",
               "mpirun -n 3": "mpi -n 3", "skglm": "skglm", "celer": "celer",
               "scikit-learn": "sklearn", "glmnet": "glmnet"}
    rows = headline_rows()
    assert len(rows) == len(results)
    for data, model, cells in rows:
        solvers = results[names[data], "squared" if model == "Lasso" else "logistic"]
        for column, cell in cells.items():
            entry = solvers.get(columns[column])
            if cell in ("", "-"):
                assert entry is None or entry["seconds"] is None, (data, model, column)
            elif cell == "> cap":
                assert entry["seconds"] is None and entry["error"] is None, \
                    (data, model, column)
            else:
                assert float(cell) == pytest.approx(entry["seconds"], abs=5e-4), \
                    (data, model, column)


def test_history_schema_is_documented():
    from asyncopt import Lasso
    from asyncopt.data import load_a9a

    text = (DOCS / "guide" / "history.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| `")]
    documented = set(re.findall(r"`([a-z_]+)`", " ".join(line.split("|")[1]
                                                          for line in table)))
    X, y = load_a9a()
    record = Lasso(alpha=0.1, tol=1e-3, max_epochs=3).fit(X[:2000], y[:2000]).history_[-1]
    assert documented == set(record), (sorted(documented - set(record)),
                                       sorted(set(record) - documented))
    assert np.isfinite(record["gap"])
