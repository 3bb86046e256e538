"""The model file that ``--output`` writes, and what ``asyncopt-predict`` and ``--test``
compute from it.

The model file is an ``.npz`` (``numpy.savez``, no pickled objects) with

============  =========================================================================
key           value
============  =========================================================================
coef          float64 array of shape (n_features,): the coefficients w
intercept     float64 scalar: the intercept b (0.0 when fitted without one)
alpha         float64 scalar: the regularization strength of the fit
format        int64 scalar: ``MODEL_FORMAT``, the version of this layout
loss          string scalar: "squared" (asyncopt-lasso) or "logistic" (asyncopt-logreg)
n_features    int64 scalar: the training data's number of features
classes       float64 array of shape (2,), logistic only: the labels coded -1 and +1
============  =========================================================================

coef, intercept and alpha are the keys of the files written before the format had a
version; such a file (and a ``--save-coef`` .npz, or a checkpoint) has no ``format`` key
and does not record the loss, so :func:`load_model` refuses it: the model must be
re-trained with ``--output``. Nothing is inferred from a file without a ``format``.

Nothing here imports scikit-learn at module level: the training tools import it only for
``--test`` (:func:`metric_rows`), on the process that prints.
"""

from __future__ import annotations

import zipfile
from typing import NamedTuple

import numpy as np

from asyncopt.cli.common import read_libsvm

__all__ = ["MODEL_FORMAT", "Model", "EvalData", "save_model", "load_model",
           "load_eval_data", "decision_values", "predictions", "metric_rows"]

MODEL_FORMAT = 1
LOSSES = ("squared", "logistic")


class Model(NamedTuple):
    """A fitted linear model, as a model file holds it.

    Attributes
    ----------
    coef : ndarray of shape (n_features,)
        The coefficients w.
    intercept : float
        The intercept b.
    alpha : float
        The regularization strength it was fitted at.
    loss : str
        "squared" or "logistic".
    classes : ndarray of shape (2,) or None
        Logistic: the original labels coded -1 and +1, sorted; None for "squared".
    """

    coef: np.ndarray
    intercept: float
    alpha: float
    loss: str
    classes: np.ndarray | None

    @property
    def n_features(self):
        """int: The number of features the model was trained on."""
        return int(self.coef.shape[0])


class EvalData(NamedTuple):
    """LIBSVM data read for a model: ``X`` has the model's width, ``y`` the metrics'
    targets (squared: the labels; logistic: 1.0 for the model's +1 class, else 0.0),
    ``description`` is the summary's data row."""

    X: object
    y: np.ndarray
    description: str


def save_model(path, coef, intercept, alpha, loss, classes=None):
    """Write the model file (layout in the module docstring) to ``path``.

    Parameters
    ----------
    path : str
        The file to write (written as given; no suffix is added).
    coef : array-like of shape (n_features,)
        The coefficients.
    intercept : float
        The intercept.
    alpha : float
        The regularization strength.
    loss : {"squared", "logistic"}
        The loss the model was fitted with.
    classes : array-like of shape (2,), optional
        Logistic: the labels coded -1 and +1; required for it, ignored otherwise.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    coef = np.asarray(coef, dtype=np.float64).ravel()
    arrays = dict(coef=coef, intercept=float(intercept), alpha=float(alpha),
                  format=np.int64(MODEL_FORMAT), loss=np.str_(loss),
                  n_features=np.int64(coef.shape[0]))
    if loss == "logistic":
        arrays["classes"] = np.asarray(classes, dtype=np.float64).reshape(2)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_model(path):
    """Read a model file written by ``--output``.

    Parameters
    ----------
    path : str
        The model file.

    Returns
    -------
    Model
        Its coefficients, intercept, alpha, loss and classes.

    Raises
    ------
    OSError
        The file is missing or cannot be read.
    ValueError
        It is not a model file of a format this asyncopt reads; the message is one line
        that starts with ``path``.
    """
    arrays = None
    with open(path, "rb") as f:      # a missing file or a folder: the OSError naming it
        try:
            loaded = np.load(f, allow_pickle=False)
            if isinstance(loaded, np.lib.npyio.NpzFile):        # not an .npy array
                with loaded:
                    arrays = {key: loaded[key] for key in loaded.files}
        except (ValueError, EOFError, zipfile.BadZipFile):
            pass    # not an .npy / .npz, or one holding pickled objects
    if arrays is None or "coef" not in arrays:
        raise ValueError(f"{path}: not an asyncopt model (the .npz that asyncopt-lasso / "
                         "asyncopt-logreg --output writes)")
    if "format" not in arrays:
        raise ValueError(f"{path}: an .npz without a model format (written by --save-coef, "
                         "a checkpoint, or an asyncopt older than asyncopt-predict): it "
                         "does not record the loss; re-train with --output to get a model "
                         "file")
    version = int(arrays["format"])
    if version > MODEL_FORMAT:
        raise ValueError(f"{path}: model format {version}, written by a newer asyncopt "
                         f"(this one reads format {MODEL_FORMAT}): upgrade asyncopt")
    coef = np.asarray(arrays["coef"], dtype=np.float64)
    loss = str(arrays.get("loss", ""))
    classes = arrays.get("classes")
    problem = None
    if loss not in LOSSES:
        problem = f"unknown loss {loss!r}"
    elif coef.ndim != 1 or int(arrays.get("n_features", -1)) != coef.shape[0]:
        problem = "coef does not have n_features entries"
    elif loss == "logistic" and (classes is None or np.shape(classes) != (2,)):
        problem = "a logistic model without its two classes"
    if problem is not None:
        raise ValueError(f"{path}: not a valid asyncopt model file: {problem}")
    return Model(coef, float(arrays["intercept"]), float(arrays["alpha"]), loss,
                 None if loss == "squared" else np.asarray(classes, dtype=np.float64))


def load_eval_data(path, loss, n_features, classes=None, n_threads=None):
    """Read a LIBSVM file to evaluate a model of ``n_features`` features on.

    Parameters
    ----------
    path : str
        The LIBSVM file (plain, .gz, .bz2 or .xz), read as the training tools read theirs.
    loss : {"squared", "logistic"}
        The model's loss.
    n_features : int
        The model's number of features. A file with fewer has its missing (trailing)
        features read as 0; one with more is an error.
    classes : array-like of shape (2,), optional
        Logistic: the model's classes; every label must be one of them. None: the
        labels are taken as they are, unchecked (placeholders of unlabeled data).
    n_threads : int, optional
        Threads that parse the file (the loader's default: every core).

    Returns
    -------
    EvalData
        X of shape (n_samples, n_features), the metrics' targets and the summary's
        data row.

    Raises
    ------
    OSError
        The file is missing or cannot be read.
    ValueError
        A malformed line (``file:line: problem``), more features than the model, or a
        label that is not one of ``classes``.
    """
    import scipy.sparse as sp

    X, y = read_libsvm(path, n_threads)
    n, width = X.shape
    if width > n_features:
        raise ValueError(f"{path}: {width:,} features, more than the model's "
                         f"{n_features:,} (a file may have fewer features than the model, "
                         "not more)")
    description = f"{path}: {n:,} x {width:,}, nnz {X.nnz:,}"
    if width < n_features:
        X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(n, n_features))
        description += f" (features {width + 1:,} to {n_features:,} read as 0)"
    if loss == "logistic" and classes is not None:
        classes = np.asarray(classes, dtype=np.float64)
        other = np.setdiff1d(np.unique(y), classes)
        if other.size:
            shown = ", ".join(f"{v:g}" for v in other[:5]) + (", ..." if other.size > 5
                                                              else "")
            raise ValueError(f"{path}: labels {shown} are not the model's classes "
                             f"{classes[0]:g} and {classes[1]:g}")
        y = (y == classes[1]).astype(np.float64)
    return EvalData(X, np.asarray(y, dtype=np.float64), description)


def decision_values(X, coef, intercept):
    """The decision values X w + b.

    Parameters
    ----------
    X : sparse matrix or ndarray of shape (n_samples, n_features)
        The samples.
    coef : ndarray of shape (n_features,)
        The coefficients w.
    intercept : float
        The intercept b.

    Returns
    -------
    ndarray of shape (n_samples,)
        X w + b, as the estimators' ``decision_function`` / ``predict`` compute it.
    """
    return np.asarray(X @ np.asarray(coef, dtype=np.float64)).ravel() + float(intercept)


def predictions(loss, decision):
    """What asyncopt-predict writes for the decision values.

    Parameters
    ----------
    loss : {"squared", "logistic"}
        The model's loss.
    decision : ndarray of shape (n_samples,)
        X w + b.

    Returns
    -------
    ndarray of shape (n_samples,)
        Squared: the decision values; logistic: the probability of the +1 class,
        expit(X w + b), as ``SparseLogisticRegression.predict_proba(X)[:, 1]``.
    """
    if loss == "squared":
        return decision
    from scipy.special import expit

    return expit(decision)


def metric_rows(loss, y, decision):
    """The summary rows of the metrics of a model on labelled data.

    Parameters
    ----------
    loss : {"squared", "logistic"}
        The model's loss.
    y : ndarray of shape (n_samples,)
        The targets as :func:`load_eval_data` gives them.
    decision : ndarray of shape (n_samples,)
        X w + b.

    Returns
    -------
    list of (str, str)
        Squared: "MSE" and "R^2"; logistic: "accuracy" (the +1 class where X w + b > 0,
        as the estimator predicts), "log-loss" (of the probabilities ``predictions``
        gives) and "ROC AUC" (of the decision values). Each value is printed with 6
        significant digits; R^2 on fewer than 2 samples and ROC AUC on labels of one
        class are "n/a" with the reason.
    """
    from sklearn import metrics

    n = y.shape[0]
    if loss == "squared":
        r2 = "n/a (fewer than 2 samples)" if n < 2 else \
            f"{metrics.r2_score(y, decision):.6g}"
        return [("MSE", f"{metrics.mean_squared_error(y, decision):.6g}"), ("R^2", r2)]
    predicted = (decision > 0).astype(np.float64)
    right = int(np.count_nonzero(predicted == y))
    loss_value = metrics.log_loss(y, predictions(loss, decision), labels=[0.0, 1.0])
    auc = "n/a (the labels hold one class)" if np.unique(y).size < 2 else \
        f"{metrics.roc_auc_score(y, decision):.6g}"
    return [("accuracy", f"{metrics.accuracy_score(y, predicted):.6g}  "
                         f"({right:,} / {n:,})"),
            ("log-loss", f"{loss_value:.6g}"), ("ROC AUC", auc)]
