"""The scikit-learn style front end: input validation with clear messages, sklearn's
estimator checks, label handling, lasso_path and warm starts."""
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.utils.estimator_checks import (check_classifiers_train,
                                            parametrize_with_checks)

from asyncopt import (GroupLasso, Lasso, Problem, SparseLogisticRegression, lam_max,
                      lasso_path)
from asyncopt.penalties import GroupL1

ESTIMATORS = [Lasso, GroupLasso, SparseLogisticRegression]


def _data(n=40, p=8, seed=0, binary=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = X[:, 0] - 2 * X[:, 1] + 0.1 * rng.standard_normal(n)
    if binary:
        y = (y > 0).astype(int)
    return X, y


def _make(cls, **kw):
    return cls(alpha=kw.pop("alpha", 0.01), **kw)


# ---------------------------------------------------------------------------------------
# 8. bad input -> clear ValueError
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_X_rejected(cls, sparse, bad):
    X, y = _data(binary=cls is SparseLogisticRegression)
    X[3, 2] = bad
    X = sp.csr_matrix(X) if sparse else X
    with pytest.raises(ValueError, match=r"(?i)nan|inf"):
        _make(cls).fit(X, y)


@pytest.mark.parametrize("cls", [Lasso, GroupLasso])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_y_rejected(cls, bad):
    X, y = _data()
    y = y.astype(float)
    y[5] = bad
    with pytest.raises(ValueError, match=r"(?i)nan|inf"):
        _make(cls).fit(X, y)


def test_non_finite_logistic_labels_rejected():
    X, y = _data(binary=True)
    y = y.astype(float)
    y[5] = np.nan
    with pytest.raises(ValueError, match=r"(?i)nan|inf|two values|class"):
        _make(SparseLogisticRegression).fit(X, y)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_mismatched_shapes_rejected(cls):
    X, y = _data(binary=cls is SparseLogisticRegression)
    with pytest.raises(ValueError, match=r"(?i)inconsistent|samples|rows"):
        _make(cls).fit(X, y[:-1])
    with pytest.raises(ValueError, match=r"(?i)1d|1-dimensional|shape|column"):
        _make(cls).fit(X, np.column_stack([y, y]))


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("alpha", [0.0, -1.0, np.nan, np.inf])
def test_bad_alpha_rejected(cls, alpha):
    X, y = _data(binary=cls is SparseLogisticRegression)
    with pytest.raises(ValueError, match="alpha"):
        cls(alpha=alpha).fit(X, y)


@pytest.mark.parametrize("labels", [[1] * 40, [0, 1, 2] * 13 + [0]])
def test_logistic_label_count_rejected(labels):
    X, _ = _data()
    with pytest.raises(ValueError, match=r"(?i)two values|binary|class"):
        SparseLogisticRegression(alpha=0.01).fit(X, np.array(labels))
    with pytest.raises(ValueError, match=r"(?i)two values|binary|class"):
        lam_max(X, np.array(labels), loss="logistic")


def test_problem_rejects_labels_not_pm1():
    X, y = _data(binary=True)
    with pytest.raises(ValueError, match=r"\{-1, \+1\}"):
        Problem(X, y, "logistic")


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("shape", [(0, 5), (5, 0)])
def test_empty_data_rejected(cls, shape):
    X = np.zeros(shape)
    y = np.zeros(shape[0]) if cls is not SparseLogisticRegression else \
        np.arange(shape[0]) % 2
    with pytest.raises(ValueError, match=r"(?i)0 sample|0 feature|empty"):
        _make(cls).fit(X, y)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0)])
def test_problem_rejects_empty_data(shape):
    with pytest.raises(ValueError, match="empty"):
        Problem(np.zeros(shape), np.zeros(shape[0]))
    with pytest.raises(ValueError, match="empty"):
        Problem(sp.csr_matrix(shape), np.zeros(shape[0]))


@pytest.mark.parametrize("cls", [GroupLasso, SparseLogisticRegression])
def test_bad_groups_rejected(cls):
    X, y = _data(p=6, binary=cls is SparseLogisticRegression)
    with pytest.raises(ValueError, match="out of range"):
        cls(alpha=0.01, groups=[[0, 1, 2], [3, 4, 6]]).fit(X, y)
    with pytest.raises(ValueError, match="out of range"):
        cls(alpha=0.01, groups=[[0, 1, 2], [-1, 3, 4, 5]]).fit(X, y)
    with pytest.raises(ValueError, match="more than one group"):
        cls(alpha=0.01, groups=[[0, 1, 2], [2, 3, 4, 5]]).fit(X, y)
    with pytest.raises(ValueError, match="no group"):
        cls(alpha=0.01, groups=[[0, 1, 2], [3, 4]]).fit(X, y)
    with pytest.raises(ValueError, match="group size"):
        cls(alpha=0.01, groups=0).fit(X, y)
    with pytest.raises(ValueError, match="weights"):
        cls(alpha=0.01, groups=3, weights=[1.0, -1.0]).fit(X, y)


def test_problem_level_validation():
    X, y = _data()
    with pytest.raises(ValueError, match="NaN"):
        Problem(np.where(X > 2, np.nan, X), y)
    with pytest.raises(ValueError, match="y contains"):
        Problem(X, np.where(y > 1, np.inf, y))
    with pytest.raises(ValueError, match="rows"):
        Problem(X, y[:-2])
    with pytest.raises(ValueError, match="alpha"):
        Problem(X, y, lam=0.0)
    with pytest.raises(ValueError, match="unknown loss"):
        Problem(X, y, "hinge")
    with pytest.raises(ValueError, match="covers"):
        Problem(X, y, penalty=GroupL1(X.shape[1] + 1, 3))
    with pytest.raises(ValueError, match=r"(?i)nan|inf"):
        lasso_path(np.where(X > 2, np.inf, X), y)


# ---------------------------------------------------------------------------------------
# 9. scikit-learn conventions
# ---------------------------------------------------------------------------------------

def _expected_failed_checks(estimator):
    if isinstance(estimator, SparseLogisticRegression):
        return {
            # Legitimate: with the default alpha=1.0 (>= lam_max on the check's data) the
            # model is all-zero and predicts one class, so the 0.83 accuracy threshold
            # cannot be met. test_classifiers_train_passes_with_small_alpha shows it passes
            # once alpha is below lam_max.
            "check_classifiers_train": "default alpha=1.0 >= lam_max gives an all-zero "
                                       "model (see test_classifiers_train_passes_with_"
                                       "small_alpha)",
        }
    return {}


@parametrize_with_checks([Lasso(), GroupLasso(groups=1), SparseLogisticRegression()],
                         expected_failed_checks=_expected_failed_checks)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def test_classifiers_train_passes_with_small_alpha():
    check_classifiers_train("SparseLogisticRegression",
                            SparseLogisticRegression(alpha=0.01, random_state=0))


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_fit_returns_self_and_params_round_trip(cls):
    X, y = _data(binary=cls is SparseLogisticRegression)
    est = _make(cls, tol=1e-4, max_epochs=5000, random_state=3)
    assert est.fit(X, y) is est
    params = est.get_params()
    other = clone(est)
    assert other.get_params() == params
    other.set_params(alpha=0.5, max_epochs=7)
    assert other.get_params()["alpha"] == 0.5 and other.get_params()["max_epochs"] == 7
    assert cls(**params).get_params() == params
    pred = est.predict(X)
    assert pred.shape == (X.shape[0],)
    assert est.predict(X[:3]).shape == (3,)
    # deterministic given random_state
    again = clone(est).fit(X, y)
    np.testing.assert_array_equal(np.ravel(again.coef_), np.ravel(est.coef_))


@pytest.mark.parametrize("cls", [Lasso, GroupLasso])
def test_regressor_dense_and_sparse_agree(cls):
    X, y = _data(n=60, p=10)
    kw = dict(alpha=0.05, tol=1e-12, max_epochs=5000, random_state=0)
    dense = cls(**kw).fit(X, y)
    for fmt in (sp.csr_matrix, sp.csc_matrix):
        sparse = cls(**kw).fit(fmt(X), y)
        np.testing.assert_allclose(sparse.coef_, dense.coef_, atol=1e-8)
        np.testing.assert_allclose(sparse.predict(fmt(X)), dense.predict(X), atol=1e-8)
    np.testing.assert_allclose(dense.predict(X), X @ dense.coef_ + dense.intercept_)


@pytest.mark.parametrize("labels", [("ham", "spam"), (0, 1), (-1, 1), (2, 5)])
def test_logistic_labels_round_trip(labels):
    X, y01 = _data(n=80, binary=True)
    y = np.array(labels, dtype=object if isinstance(labels[0], str) else None)[y01]
    est = SparseLogisticRegression(alpha=0.01, tol=1e-10, max_epochs=5000,
                                   random_state=0).fit(X, y)
    np.testing.assert_array_equal(est.classes_, np.sort(np.array(labels)))
    pred = est.predict(X)
    assert pred.shape == (80,)
    assert set(np.unique(pred)) <= set(labels)
    assert np.mean(pred == y) > 0.9
    proba = est.predict_proba(X)
    assert proba.shape == (80, 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-14)
    assert np.all((proba >= 0) & (proba <= 1))
    np.testing.assert_array_equal(est.classes_[np.argmax(proba, axis=1)], pred)
    np.testing.assert_allclose(np.exp(est.predict_log_proba(X)), proba, rtol=1e-12)
    # the coefficients do not depend on how the two classes are spelled
    ref = SparseLogisticRegression(alpha=0.01, tol=1e-10, max_epochs=5000,
                                   random_state=0).fit(X, y01)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-8)
    assert est.coef_.shape == (1, X.shape[1]) and est.intercept_.shape == (1,)


def test_lasso_path_matches_independent_fits():
    X, y = _data(n=60, p=15, seed=4)
    alphas, coefs, gaps = lasso_path(X, y, n_alphas=8, eps=1e-2, tol=1e-10,
                                     max_epochs=5000, random_state=0)
    assert alphas.shape == (8,) and coefs.shape == (15, 8) and gaps.shape == (8,)
    assert np.all(np.diff(alphas) < 0)
    assert alphas[0] == pytest.approx(lam_max(X, y), rel=1e-12)
    assert np.all(coefs[:, 0] == 0.0)
    assert np.count_nonzero(coefs[:, -1]) > 0
    for k, alpha in enumerate(alphas):
        problem = Problem(X, y, "squared", None, alpha, True)
        est = Lasso(alpha=alpha, tol=1e-10, max_epochs=5000, random_state=0).fit(X, y)
        p_fit = problem.objective(est.coef_, est.intercept_)
        # the path returns no intercept: evaluate with the optimal one
        p_path = problem.certificate(coefs[:, k]).primal
        assert p_path == pytest.approx(p_fit, rel=1e-6), (k, p_path, p_fit)
        assert 0.0 <= gaps[k] <= 1e-10 * problem.zero_certificate().primal


def test_lasso_path_explicit_alphas_logistic_and_groups():
    X, y = _data(n=60, p=12, seed=5, binary=True)
    top = lam_max(X, y, loss="logistic")
    grid = [0.2 * top, 2 * top, 0.5 * top]
    alphas, coefs, _ = lasso_path(X, y, alphas=grid, loss="logistic", tol=1e-10,
                                  max_epochs=5000, random_state=0)
    np.testing.assert_allclose(alphas, sorted(grid, reverse=True))
    assert np.all(coefs[:, 0] == 0.0)
    for k, alpha in enumerate(alphas):
        est = SparseLogisticRegression(alpha=alpha, tol=1e-10, max_epochs=5000,
                                       random_state=0).fit(X, y)
        problem = Problem(X, 2.0 * y - 1, "logistic", None, alpha, True)
        assert problem.certificate(coefs[:, k]).primal == pytest.approx(
            problem.objective(est.coef_.ravel(), est.intercept_[0]), rel=1e-6)
    Xg, yg = _data(n=60, p=12, seed=6)
    _, coefs_g, _ = lasso_path(Xg, yg, groups=3, n_alphas=4, tol=1e-10, max_epochs=5000)
    blocks = coefs_g.reshape(4, 3, 4)             # (group, member, alpha)
    for g in range(4):
        for k in range(4):
            nz = np.count_nonzero(blocks[g, :, k])
            assert nz in (0, 3)                    # groups enter the model whole


def test_group_lasso_with_singleton_groups_is_lasso():
    X, y = _data(n=50, p=9, seed=2)
    kw = dict(alpha=0.03, tol=1e-12, max_epochs=5000, random_state=0)
    a = Lasso(**kw).fit(X, y)
    b = GroupLasso(groups=1, **kw).fit(X, y)
    c = GroupLasso(groups=[[j] for j in range(9)], **kw).fit(X, y)
    for other in (b, c):
        np.testing.assert_allclose(other.coef_, a.coef_, atol=1e-8)
        assert other.intercept_ == pytest.approx(a.intercept_, abs=1e-8)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_warm_start_reduces_iterations(cls):
    X, y = _data(n=120, p=30, seed=8, binary=cls is SparseLogisticRegression)
    # ddss: a working set solves these 30 features in one outer iteration
    kw = dict(tol=1e-10, max_epochs=5000, random_state=0, method="ddss")
    est = cls(alpha=0.02, warm_start=True, **kw).fit(X, y)
    cold_iters = est.n_iter_
    assert cold_iters > 3
    est.fit(X, y)                                  # same problem, warm: converged already
    assert est.n_iter_ <= 1
    est.set_params(alpha=0.019).fit(X, y)          # nearby problem
    cold = cls(alpha=0.019, **kw).fit(X, y)
    assert est.n_iter_ < cold.n_iter_, (est.n_iter_, cold.n_iter_)
    np.testing.assert_allclose(np.ravel(est.coef_), np.ravel(cold.coef_), atol=1e-6)
    # without warm_start the refit starts from scratch
    plain = cls(alpha=0.02, **kw).fit(X, y)
    assert plain.fit(X, y).n_iter_ == cold_iters


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_binary_labels_are_encoded_as_scikit_learns_type_of_target_sees_them():
    """Two finite integral numbers are encoded without scikit-learn (what every rank of
    the MPI command line does); everything else goes through type_of_target."""
    from sklearn.utils.multiclass import type_of_target

    from asyncopt.problem import encode_binary_labels
    for y in ([0, 1, 1, 0], [-1.0, 1.0, 1.0], [3, 7, 7], np.array([2.0, 5.0]),
              np.array([0, 1], dtype=np.uint8), ["a", "b", "a"]):
        assert type_of_target(y) == "binary"
        encoded, classes = encode_binary_labels(y)
        np.testing.assert_array_equal(classes, np.unique(y))
        np.testing.assert_array_equal(encoded, np.where(np.asarray(y) == classes[1], 1.0, -1.0))
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        encode_binary_labels([0.5, 1.5, 0.5])
    with pytest.raises(ValueError, match="Only binary classification"):
        encode_binary_labels([1, 2, 3])
    with pytest.raises(ValueError, match="got 1 class"):
        encode_binary_labels([1, 1])
    with pytest.raises(ValueError, match="NaN"):
        encode_binary_labels([0.0, np.nan, 1.0])
