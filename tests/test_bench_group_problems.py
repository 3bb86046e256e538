"""The group problems of bench_serial.py and bench_distributed.py (--group-size): the same
penalty for every solver, and the peers that have none left out."""
import os
import sys

import numpy as np
import scipy.sparse as sp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_serial import (group_lists, make_penalty, not_offered,  # noqa: E402
                                     problem_specs)

from asyncopt.problem import Problem  # noqa: E402


def test_group_problems_are_named_and_partition_the_features():
    specs = problem_specs(True, 5)
    assert [s["name"] for s in specs] == ["ctr_lasso_1e-3_group5", "ctr_lasso_1e-4_group5",
                                         "a9a_d2_lasso_group5", "a9a_d2_logreg_group5"]
    assert all(s["group_size"] == 5 for s in specs)
    assert all(s["group_size"] == 1 and "group" not in s["name"]
               for s in problem_specs(True))
    penalty = make_penalty(12, 5)
    assert group_lists(penalty) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    np.testing.assert_allclose(penalty.weights, np.sqrt([5, 5, 2]))
    assert make_penalty(12, 1).is_l1


def test_peers_without_the_group_penalty_are_not_run():
    lasso, logistic = problem_specs(True, 5)[0], problem_specs(True, 5)[3]
    assert not_offered("sklearn", lasso) and not_offered("copt_saga", logistic)
    assert not_offered("celer", logistic) and not not_offered("celer", lasso)
    assert not not_offered("skglm", logistic) and not not_offered("ddss", logistic)
    assert not any(not_offered(s, problem_specs(True)[3])
                   for s in ("sklearn", "celer", "skglm", "copt_saga"))


def test_celers_group_lasso_on_the_lists_solves_our_problem():
    """celer.GroupLasso given group_lists and the sqrt(|g|) weights minimises the same
    objective as our GroupL1 problem: at its solution our gap is small."""
    import celer
    rng = np.random.default_rng(0)
    X = sp.random(120, 23, density=0.4, random_state=0, format="csr")
    y = X @ rng.standard_normal(23) + 0.1 * rng.standard_normal(120)
    penalty = make_penalty(23, 5)
    base = Problem(X, y, "squared", penalty, 1.0, True)
    problem = base.with_lam(0.1 * base.lam_max())
    model = celer.GroupLasso(groups=group_lists(penalty), alpha=problem.lam,
                             weights=penalty.weights, tol=1e-12, max_iter=1000,
                             max_epochs=100_000).fit(X, y)
    gap = problem.certificate(model.coef_, model.intercept_).gap
    assert gap <= 1e-8 * problem.null_objective()
    wrong = celer.GroupLasso(groups=group_lists(penalty), alpha=problem.lam, tol=1e-12,
                             max_iter=1000, max_epochs=100_000).fit(X, y)   # weights 1
    assert problem.certificate(wrong.coef_, wrong.intercept_).gap > \
        1e-4 * problem.null_objective()
