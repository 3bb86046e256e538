"""The adaptive inner step (``method="auto"``, ``solvers.choice``): the rule's cost
bound where the rates stay put, its return to a kind whose rate grows, its determinism
for a seed, and its solutions on the threads backend."""
import numpy as np
import pytest
import scipy.sparse as sp

import asyncopt
from asyncopt.penalties import L1
from asyncopt.problem import Problem
from asyncopt.solvers.choice import WORK, InnerChoice
from asyncopt.solvers.ddss import solve_ddss
from test_working_set import correlated_data, objective, sklearn_solution


def run_rule(rate_of, work_of, goal):
    """Drive InnerChoice with step k of each kind making rate_of(kind, k) * work progress
    for work_of[kind] work (plus an outer iteration's fixed cost, as the rule counts
    it), until the progress reaches ``goal``; returns (the total work, the kinds in
    order)."""
    choice, done, total, kinds = InnerChoice(), 0.0, 0.0, []
    while done < goal:
        kind = choice.next()
        k = kinds.count(kind)
        work = work_of[kind] + WORK["step"]
        progress = rate_of(kind, k) * work
        choice.credit(kind, 1.0, np.exp(-progress), work_of[kind])
        done += progress
        total += work
        kinds.append(kind)
    return total, kinds


@pytest.mark.parametrize("rho", [0.02, 0.3, 0.6, 0.9, 1.5, 4.0])
def test_steady_rates_cost_at_most_twelve_percent_over_the_best_kind(rho):
    """Rates in a ratio rho (working set / prox-SVRG): the work to a given progress is at
    most 1.12 times the better kind's alone, plus the first step of each kind."""
    rates = {"working_set": rho * 1e-6, "svrg": 1e-6}
    work = {"working_set": 3e5, "svrg": 7e5}
    goal = 2000 * max(rates.values()) * max(work.values())
    total, kinds = run_rule(lambda kind, k: rates[kind], work, goal)
    alone = goal / max(rates.values())
    assert total <= 1.12 * alone + sum(work.values()) + 2 * WORK["step"]
    assert {"working_set", "svrg"} <= set(kinds)        # both measured


def test_a_kind_whose_rate_grows_is_taken_up():
    """A prox-SVRG rate that falls as 1/k against a steady working set: the working set,
    worse at first, takes over; prox-SVRG is still measured now and then, less and
    less often."""
    rates = {"working_set": lambda k: 1e-6, "svrg": lambda k: 2e-5 / (1 + k)}
    total, kinds = run_rule(lambda kind, k: rates[kind](k),
                            {"working_set": 5e5, "svrg": 5e5}, goal=300.0)
    assert kinds[:3] == ["svrg", "working_set", "svrg"]
    late = kinds[len(kinds) // 2:]
    assert 0 < late.count("svrg") <= 0.1 * len(late)


def mixed_problem():
    X, y = correlated_data(n=300, p=120, seed=21, density=0.5)
    problem = Problem(sp.csr_matrix(X), y, "squared", L1(120), 1.0, True)
    return X, y, problem.with_lam(0.01 * problem.lam_max())


def test_auto_is_deterministic_for_a_seed():
    """The same seed gives the same steps (which kind, working-set sizes) and the same
    solution bit for bit; the run holds both kinds of step."""
    _, _, problem = mixed_problem()
    runs = [solve_ddss(problem, tol=1e-10, max_epochs=2000, inner="auto",
                       random_state=5) for _ in range(2)]
    steps = [[record["working_set"] for record in run.history] for run in runs]
    assert steps[0] == steps[1]
    np.testing.assert_array_equal(runs[0].coef, runs[1].coef)
    assert runs[0].converged
    kinds = {size is None for size in steps[0][1:]}
    assert kinds == {True, False}       # prox-SVRG epochs and working-set steps


def test_auto_on_threads_reaches_sklearns_objective():
    X, y, problem = mixed_problem()
    est = asyncopt.Lasso(alpha=problem.lam, tol=1e-10, backend="threads", n_jobs=2,
                         max_epochs=2000).fit(X, y)
    coef, b = sklearn_solution(X, y, problem.lam, True)
    theirs = objective(X, y, coef, b, problem.lam)
    ours = objective(X, y, est.coef_, est.intercept_, problem.lam)
    assert abs(ours - theirs) <= 1e-6 * theirs
    assert ours - theirs <= est.dual_gap_ + 1e-12 * theirs


def test_auto_is_the_default_and_runs_the_epoch_only_where_no_working_set_solves():
    assert asyncopt.Lasso().method == "auto"
    assert asyncopt.SparseLogisticRegression().method == "auto"
    _, _, problem = mixed_problem()
    result = solve_ddss(problem, tol=1e-8, max_epochs=2000, inner="auto", random_state=0)
    assert any(record["working_set"] for record in result.history)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_auto_takes_no_epoch_while_features_outnumber_rows(loss):
    """n = 40 rows, p = 400 features: every step taken while the active set holds more
    features than rows is a working-set step, and the run still reaches scikit-learn's
    objective (the squared loss) or certifies 1e-10 (both)."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((40, 400))
    y = X[:, :5] @ rng.standard_normal(5) + 0.1 * rng.standard_normal(40)
    if loss == "logistic":
        y = np.where(y > 0, 1.0, -1.0)
    problem = Problem(sp.csr_matrix(X), y, loss, L1(400), 1.0, True)
    problem = problem.with_lam(0.01 * problem.lam_max())
    result = solve_ddss(problem, tol=1e-10, max_epochs=5000, inner="auto", random_state=0)
    assert result.converged
    # a record's n_active: the active set its step ran on (screened at the record before)
    wide = [record["working_set"] for record in result.history[1:]
            if record["n_active"] > 40]
    assert wide and all(size is not None for size in wide), wide
    if loss == "squared":
        coef, b = sklearn_solution(X, y, problem.lam, True)
        theirs = objective(X, y, coef, b, problem.lam)
        ours = objective(X, y, result.coef, result.intercept, problem.lam)
        assert abs(ours - theirs) <= 1e-6 * theirs


def test_a_shared_choice_goes_on_across_solves_and_a_path_tries_the_epoch_once():
    """inner_choice: two solves given one InnerChoice credit every step of both to it
    (one step per outer iteration), the second starting from what the first learned;
    lasso_path's solves share one, so that the prox-SVRG epoch a new choice tries first
    does not start every solve, and each solve is still certified (G <= tol P(0))."""
    _, _, problem = mixed_problem()
    choice = InnerChoice()
    runs = [solve_ddss(problem.with_lam(problem.lam * scale), tol=1e-6, max_epochs=2000,
                       inner="auto", random_state=0, inner_choice=choice)
            for scale in (2.0, 1.0)]
    credited = sum(len(steps) for steps in choice.steps.values())
    assert credited == sum(run.n_iter for run in runs)
    X, y, _ = mixed_problem()
    # on the threads: the serial backend's path solves are compiled (solvers.path)
    alphas, _, gaps, results = asyncopt.lasso_path(X, y, n_alphas=8, eps=1e-2, tol=1e-6,
                                                   backend="threads", n_jobs=2,
                                                   random_state=0, return_results=True)
    # the epoch's first step on a new choice (p <= n: a candidate); here some solves
    # start with the working set instead, which a choice of their own never does
    first_is_epoch = [result.history[1]["working_set"] is None for result in results
                      if len(result.history) > 1]
    assert len(first_is_epoch) >= 3 and not all(first_is_epoch)
    null = Problem(sp.csr_matrix(X), y, "squared").null_objective()
    assert np.all(gaps <= 1e-6 * null)
