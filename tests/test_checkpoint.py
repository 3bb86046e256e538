"""Long runs checkpoint: a stopped solve resumes where its checkpoint left it."""
import numpy as np
import pytest
import scipy.sparse as sp

from asyncopt import Lasso
from asyncopt.problem import Problem
from asyncopt.solvers import solve_ddss
from asyncopt.solvers.checkpoint import load_checkpoint


def _problem():
    rng = np.random.default_rng(0)
    X = sp.random(400, 300, density=0.05, random_state=1, format="csr")
    y = X @ np.r_[rng.standard_normal(15), np.zeros(285)] + 0.05 * rng.standard_normal(400)
    problem = Problem(X, y, "squared", None, 1.0, True)
    return X, y, problem.with_lam(0.05 * problem.lam_max())


def test_interrupted_solve_resumes_from_its_checkpoint(tmp_path):
    _, _, problem = _problem()
    path = str(tmp_path / "run.npz")
    # prox-SVRG epochs only: with the support Newton step this problem converges within 8
    first = solve_ddss(problem, tol=1e-10, max_epochs=8, random_state=0, checkpoint=path,
                       support_newton=False)
    assert not first.converged
    coef, intercept, lam, history = load_checkpoint(path, problem.n_features)
    np.testing.assert_array_equal(coef, first.coef)
    assert intercept == first.intercept and lam == problem.lam
    assert [h["epoch"] for h in history] == list(range(9))

    resumed = solve_ddss(problem, tol=1e-10, max_epochs=5000, random_state=0,
                         checkpoint=path, support_newton=False)
    fresh = solve_ddss(problem, tol=1e-10, max_epochs=5000, random_state=0,
                       support_newton=False)
    assert resumed.converged
    assert resumed.history[:9] == history
    assert resumed.history[9]["epoch"] == 9
    # the resumed run starts from the checkpoint's gap, not from P(0)
    assert resumed.history[9]["rel_gap"] <= history[-1]["rel_gap"] * 1.0001
    assert resumed.n_iter < fresh.n_iter
    assert resumed.primal == pytest.approx(fresh.primal, rel=1e-9)


def test_estimator_checkpoint_and_bad_checkpoint_file(tmp_path):
    X, y, problem = _problem()
    path = tmp_path / "fit.npz"
    est = Lasso(alpha=problem.lam, tol=1e-8, max_epochs=5000, checkpoint=str(path))
    est.fit(X, y)
    assert path.exists()
    again = Lasso(alpha=problem.lam, tol=1e-8, max_epochs=5000, checkpoint=str(path))
    assert again.fit(X, y).n_iter_ == 0
    np.testing.assert_allclose(again.coef_, est.coef_)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable asyncopt checkpoint"):
        Lasso(alpha=problem.lam, checkpoint=str(bad)).fit(X, y)
    with pytest.raises(ValueError, match="has 299 features"):
        load_checkpoint(str(path), 299)
    # a run at another alpha refuses the checkpoint instead of resuming another problem
    with pytest.raises(ValueError, match="checkpoint of a run at alpha = "):
        Lasso(alpha=0.5 * problem.lam, checkpoint=str(path)).fit(X, y)
    assert load_checkpoint(str(path), X.shape[1], problem.lam)[2] == problem.lam


def test_callback_and_max_time_stop_the_solve():
    _, _, problem = _problem()
    seen = []
    # prox-SVRG epochs only: with the support Newton step this problem converges at the
    # second epoch
    res = solve_ddss(problem, tol=1e-12, max_epochs=5000, support_newton=False,
                     callback=lambda rec: seen.append(rec["epoch"]) or rec["epoch"] >= 3)
    assert seen == [0, 1, 2, 3] and res.n_iter == 3 and not res.converged
    res = solve_ddss(problem, tol=1e-12, max_epochs=10 ** 6, max_time=0.0)
    assert not res.converged and res.n_iter == 0
