"""Train on one file, predict on another: the model file of --output, asyncopt-predict and
--test (issue 48). References: the estimators fitted on the same data, the coefficients
read back from the model file, and sklearn.metrics on the same arrays."""

import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import expit
from sklearn import metrics

from asyncopt import Lasso, SparseLogisticRegression
from asyncopt.data import load_libsvm, save_libsvm
from test_cli import assert_one_line_error, run_main, write_libsvm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREDICT = "asyncopt-predict"
# serial: the same solve as the estimators' default backend, bit for bit
FIT = ["--backend", "serial", "--quiet", "--tol", "1e-10", "--seed", "0"]


def regression_data(n, p, seed, zero_tail=0):
    """Sparse X with a linear target in 3 features; the last ``zero_tail`` columns are 0,
    so that its LIBSVM file has fewer features."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.5)
    if zero_tail:
        X[:, p - zero_tail:] = 0.0
    w = np.zeros(p)
    w[:3] = [2.0, -1.5, 1.0]
    return X, X @ w + 0.3 * rng.standard_normal(n)


def classification_data(n, p, seed, classes=(3, 7), zero_tail=0):
    X, score = regression_data(n, p, seed, zero_tail)
    return X, np.where(score > 0, classes[1], classes[0]).astype(float)


def predict(argv, capsys):
    from asyncopt.cli.predict import main
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def rows(summary):
    """{name: value} of a summary table (names are separated from values by 2 spaces)."""
    table = {}
    for line in summary.splitlines():
        if line.startswith("  "):
            name, _, value = line.strip().partition("  ")
            table[name] = value.strip()
    return table


def number(text):
    return float(text.split()[0])


def train(prog, tmp_path, capsys, X, y, extra=()):
    """Fit ``prog`` on (X, y) written as LIBSVM in tmp_path/prog; returns (model path,
    summary rows)."""
    folder = tmp_path / prog
    folder.mkdir()
    data = folder / "train.svm"
    save_libsvm(data, X, y)
    model = folder / "model.npz"
    status, out, err = run_main(prog, [data, *FIT, "--output", model, *extra], capsys)
    assert status == 0, err
    return model, rows(out)


@pytest.fixture
def lasso_model(tmp_path, capsys):
    X, y = regression_data(120, 12, seed=0)
    model, _ = train("asyncopt-lasso", tmp_path, capsys, X, y)
    return model, X, y


@pytest.fixture
def logreg_model(tmp_path, capsys):
    X, y = classification_data(120, 12, seed=0)
    model, _ = train("asyncopt-logreg", tmp_path, capsys, X, y)
    return model, X, y


def predict_on(model, Xt, yt, tmp_path, capsys):
    """asyncopt-predict MODEL test.svm --output pred.txt on (Xt, yt); returns (the
    predictions written, the summary rows, the --output path)."""
    save_libsvm(tmp_path / "test.svm", Xt, yt)
    pred = tmp_path / "pred.txt"
    status, out, err = predict([model, tmp_path / "test.svm", "--output", pred], capsys)
    assert status == 0, err
    return np.loadtxt(pred), rows(out), pred


# -- the model file --------------------------------------------------------------

def test_the_model_file_records_what_predicting_needs(lasso_model, logreg_model):
    squared, logistic = np.load(lasso_model[0]), np.load(logreg_model[0])
    assert set(squared.files) == {"coef", "intercept", "alpha", "format", "loss",
                                  "n_features"}
    assert set(logistic.files) == set(squared.files) | {"classes"}
    for f in (squared, logistic):
        assert int(f["format"]) == 1 and int(f["n_features"]) == 12
        assert f["coef"].shape == (12,) and float(f["alpha"]) > 0
    assert str(squared["loss"]) == "squared" and str(logistic["loss"]) == "logistic"
    np.testing.assert_array_equal(logistic["classes"], [3.0, 7.0])


# -- asyncopt-predict: predictions and metrics ---------------------------------------

def test_lasso_predictions_and_metrics(lasso_model, tmp_path, capsys):
    model, X, y = lasso_model
    Xt, yt = regression_data(50, 12, seed=1)
    written, table, pred = predict_on(model, Xt, yt, tmp_path, capsys)
    saved = np.load(model)
    np.testing.assert_allclose(written, Xt @ saved["coef"] + float(saved["intercept"]),
                               rtol=1e-13, atol=1e-14)     # dense Xt: other rounding
    est = Lasso(alpha=float(saved["alpha"]), tol=1e-10, random_state=0).fit(X, y)
    np.testing.assert_allclose(written, est.predict(Xt), rtol=1e-12, atol=1e-12)
    assert number(table["MSE"]) == pytest.approx(metrics.mean_squared_error(yt, written),
                                                 rel=1e-5)
    assert number(table["R^2"]) == pytest.approx(metrics.r2_score(yt, written), rel=1e-5)
    assert 0.5 < number(table["R^2"]) < 1.0
    assert table["data"].endswith("50 x 12, nnz " + f"{np.count_nonzero(Xt):,}")
    assert table["predictions"] == str(pred) and "classes" not in table


def test_logreg_predictions_and_metrics(logreg_model, tmp_path, capsys):
    model, X, y = logreg_model
    Xt, yt = classification_data(60, 12, seed=1)
    written, table, _ = predict_on(model, Xt, yt, tmp_path, capsys)
    est = SparseLogisticRegression(alpha=float(np.load(model)["alpha"]), tol=1e-10,
                                   random_state=0).fit(X, y)
    np.testing.assert_array_equal(est.classes_, [3.0, 7.0])
    np.testing.assert_allclose(written, est.predict_proba(Xt)[:, 1], rtol=1e-12, atol=1e-15)
    assert table["classes"] == "3 -> -1, 7 -> +1"
    assert number(table["accuracy"]) == pytest.approx(
        metrics.accuracy_score(yt, est.predict(Xt)), rel=1e-5)
    assert f"/ {len(yt)})" in table["accuracy"]
    assert number(table["log-loss"]) == pytest.approx(
        metrics.log_loss(yt == 7, written), rel=1e-5)
    assert number(table["ROC AUC"]) == pytest.approx(
        metrics.roc_auc_score(yt == 7, est.decision_function(Xt)), rel=1e-5)
    assert 0.7 < number(table["accuracy"]) <= 1.0


@pytest.mark.parametrize("which", ["lasso", "logreg"])
def test_unlabeled_data_with_no_metrics(which, lasso_model, logreg_model, tmp_path,
                                        capsys):
    """Placeholder labels (0, not a class of the logistic model): without --no-metrics
    the file is refused; with it, the predictions are the estimator's and no metric is
    printed."""
    model, X, _ = lasso_model if which == "lasso" else logreg_model
    Xt, _ = regression_data(40, 12, seed=3)
    save_libsvm(tmp_path / "unlabeled.svm", Xt, np.zeros(40))
    pred = tmp_path / "pred.txt"
    argv = [model, tmp_path / "unlabeled.svm", "--output", pred]
    if which == "logreg":
        status, out, err = predict(argv, capsys)
        assert status != 0 and "not the model's classes" in err
        assert not pred.exists()
    status, out, err = predict(argv + ["--no-metrics"], capsys)
    assert status == 0, err
    table = rows(out)
    assert not {"MSE", "R^2", "accuracy", "log-loss", "ROC AUC"} & set(table)
    assert table["predictions"] == str(pred)
    saved = np.load(model)
    decision = Xt @ saved["coef"] + float(saved["intercept"])
    expected = decision if which == "lasso" else expit(decision)
    np.testing.assert_allclose(np.loadtxt(pred), expected, rtol=1e-12, atol=1e-15)


def test_a_compressed_file_and_stdout_give_the_same_predictions(lasso_model, tmp_path,
                                                               capsys):
    model = lasso_model[0]
    Xt, yt = regression_data(30, 12, seed=2)
    save_libsvm(tmp_path / "test.svm", Xt, yt)
    save_libsvm(tmp_path / "test.svm.gz", Xt, yt)
    status, plain_out, err = predict([model, tmp_path / "test.svm", "--output",
                                      tmp_path / "pred.txt"], capsys)
    assert status == 0, err
    status, out, err = predict([model, tmp_path / "test.svm.gz", "--output", "-"], capsys)
    assert status == 0, err
    assert out == (tmp_path / "pred.txt").read_text() and len(out.splitlines()) == 30
    assert "asyncopt-predict summary" in err             # the summary left stdout to them
    assert rows(err)["MSE"] == rows(plain_out)["MSE"]
    status, out, err = predict([model, tmp_path / "test.svm", "--quiet"], capsys)
    assert status == 0 and out == "" and err == ""


def test_a_file_with_fewer_features_reads_them_as_zero(lasso_model, logreg_model,
                                                       tmp_path, capsys):
    for model, make in ((lasso_model[0], regression_data),
                        (logreg_model[0], classification_data)):
        Xt, yt = make(40, 12, seed=3, zero_tail=3)
        save_libsvm(tmp_path / "narrow.svm", Xt, yt)
        assert load_libsvm(tmp_path / "narrow.svm")[0].shape[1] <= 9
        status, out, err = predict([model, tmp_path / "narrow.svm", "--output",
                                    tmp_path / "pred.txt"], capsys)
        assert status == 0, err
        saved = np.load(model)
        decision = Xt @ saved["coef"] + float(saved["intercept"])
        want = decision if make is regression_data else expit(decision)
        np.testing.assert_allclose(np.loadtxt(tmp_path / "pred.txt"), want, rtol=1e-13,
                                   atol=1e-15)
        assert "read as 0" in rows(out)["data"] and "to 12" in rows(out)["data"]


# -- asyncopt-predict: one-line errors ----------------------------------------------

def test_errors_are_one_line_and_write_nothing(lasso_model, logreg_model, tmp_path,
                                               capsys):
    good = tmp_path / "good.svm"
    save_libsvm(good, *regression_data(20, 12, seed=4))
    np.savez(tmp_path / "other.npz", weights=np.ones(12))
    status, out, err = run_main("asyncopt-lasso", [good, "--quiet", "--save-coef",
                                                   tmp_path / "coef.npz"], capsys)
    assert status == 0, err
    wide = tmp_path / "wide.svm"
    save_libsvm(wide, np.ones((3, 14)), np.ones(3))
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5 2:1.0\n-1 2:0.25\n1 3:abc\n")
    labels = tmp_path / "labels.svm"
    save_libsvm(labels, *classification_data(20, 12, seed=4, classes=(0, 1)))
    lasso, logreg = lasso_model[0], logreg_model[0]
    cases = [
        ([tmp_path / "missing.npz", good], ["No such file or directory", "missing.npz"]),
        ([good, good], ["good.svm: not an asyncopt model"]),
        ([tmp_path / "other.npz", good], ["other.npz: not an asyncopt model"]),
        ([tmp_path / "coef.npz", good], ["coef.npz: an .npz without a model format",
                                         "re-train with --output"]),
        ([lasso, tmp_path / "missing.svm"], ["No such file or directory", "missing.svm"]),
        ([lasso, wide], ["wide.svm: 14 features, more than the model's 12"]),
        ([logreg, bad], ["bad.svm:3:"]),
        ([logreg, labels], ["labels.svm: labels 0, 1 are not the model's classes 3 and 7"]),
        ([lasso, good, "--output", tmp_path / "none" / "p.txt"], ["No such file"]),
    ]
    for argv, wanted in cases:
        pred = tmp_path / "pred.txt"
        status, out, err = predict(argv + ([] if "--output" in argv else
                                           ["--output", pred]), capsys)
        assert status == 1, (argv, err)
        assert_one_line_error(err, PREDICT)
        for text in wanted:
            assert text in err, (text, err)
        assert out == "" and not pred.exists(), argv


def test_a_model_of_a_newer_format_is_refused(lasso_model, tmp_path, capsys):
    arrays = dict(np.load(lasso_model[0]))
    arrays["format"] = np.int64(2)
    np.savez(tmp_path / "newer.npz", **arrays)
    good = tmp_path / "good.svm"
    save_libsvm(good, *regression_data(20, 12, seed=4))
    status, out, err = predict([tmp_path / "newer.npz", good], capsys)
    assert status == 1
    assert_one_line_error(err, PREDICT)
    assert "model format 2, written by a newer asyncopt" in err


def test_errors_in_a_real_process(tmp_path):
    """The console module in a fresh interpreter: status 1, one line, no traceback."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-m", "asyncopt.cli.predict",
                          str(tmp_path / "nope.npz"),
                          str(write_libsvm(tmp_path / "d.svm"))],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert_one_line_error(run.stderr, PREDICT)
    assert "nope.npz" in run.stderr


# -- --test on the training tools -----------------------------------------------------

@pytest.mark.parametrize("prog,make", [("asyncopt-lasso", regression_data),
                                       ("asyncopt-logreg", classification_data)])
def test_test_rows_are_asyncopt_predicts_metrics(prog, make, tmp_path, capsys):
    held = tmp_path / "held.svm"
    save_libsvm(held, *make(50, 12, seed=5, zero_tail=2))
    model, summary = train(prog, tmp_path, capsys, *make(120, 12, seed=0),
                           extra=["--test", held])
    status, out, err = predict([model, held], capsys)
    assert status == 0, err
    predicted = rows(out)
    names = ["MSE", "R^2"] if prog == "asyncopt-lasso" else \
        ["accuracy", "log-loss", "ROC AUC"]
    assert [k for k in summary if k.startswith("test ")] == \
        ["test data"] + [f"test {k}" for k in names]
    assert summary["test data"] == predicted["data"]
    for name in names:
        assert summary[f"test {name}"] == predicted[name], name
        assert 0 < number(predicted[name]) < 1.5
    assert summary["output"] == str(model)


@pytest.mark.parametrize("case", ["wide", "labels", "bad"])
def test_a_bad_test_file_fails_before_the_solve(case, tmp_path, capsys, monkeypatch):
    held = tmp_path / "held.svm"
    if case == "wide":
        save_libsvm(held, np.ones((3, 14)), np.ones(3))
        wanted = "held.svm: 14 features, more than the model's 12"
    elif case == "labels":
        save_libsvm(held, *classification_data(20, 12, seed=4, classes=(0, 1)))
        wanted = "not the model's classes 3 and 7"
    else:
        held.write_text("3 1:0.5\n7 1:x\n")
        wanted = "held.svm:2:"
    X, y = classification_data(60, 12, seed=0)
    save_libsvm(tmp_path / "train.svm", X, y)
    # fit_and_report imports solve_method when called: this one stands in for the solve
    monkeypatch.setattr("asyncopt.solvers.methods.solve_method",
                        lambda *a, **k: pytest.fail("solved before reading --test"))
    status, out, err = run_main("asyncopt-logreg", [tmp_path / "train.svm", *FIT, "--test",
                                                    held, "--output", tmp_path / "m.npz"],
                                capsys)
    assert status == 1
    assert_one_line_error(err, "asyncopt-logreg")
    assert wanted in err and not (tmp_path / "m.npz").exists()


@pytest.mark.mpi
def test_test_rows_under_mpirun_are_printed_once(tmp_path, capsys):
    """mpirun -n 3: the server reads --test and prints its rows once, as asyncopt-predict
    computes them from the model file."""
    X, y = regression_data(120, 12, seed=0)
    save_libsvm(tmp_path / "train.svm", X, y)
    save_libsvm(tmp_path / "held.svm", *regression_data(50, 12, seed=5))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    run = subprocess.run([mpirun, "-n", "3", sys.executable, "-m", "asyncopt.cli.lasso",
                          "train.svm", "--test", "held.svm", "--output", "m.npz",
                          "--quiet"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("asyncopt-lasso summary") == 1
    summary = rows(run.stdout)
    assert summary["method"].startswith("auto, mpi (1 server + 2 workers)")
    status, out, err = predict([tmp_path / "m.npz", tmp_path / "held.svm"], capsys)
    assert status == 0, err
    for name in ("MSE", "R^2"):
        assert summary[f"test {name}"] == rows(out)[name]
