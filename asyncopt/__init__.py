"""asyncopt: distributed-memory asynchronous optimization with dynamic safe screening.

    from asyncopt import Lasso
    model = Lasso(alpha=0.01).fit(X, y)     # coef_, intercept_, dual_gap_, active_set_

The estimators load on first use (PEP 562): a process that only runs a solver, such as
each rank of ``mpirun -n K asyncopt-lasso``, does not pay for importing scikit-learn, and
matplotlib is imported only when ``plot_history`` draws.
"""
import importlib

__version__ = "0.1.0"
__all__ = ["Lasso", "ElasticNet", "GroupLasso", "SparseLogisticRegression", "LassoCV",
           "ElasticNetCV", "SparseLogisticRegressionCV", "lasso_path", "lam_max",
           "Problem", "plot_history", "__version__"]
_HOMES = {"Lasso": "estimators", "ElasticNet": "estimators", "GroupLasso": "estimators",
          "SparseLogisticRegression": "estimators", "LassoCV": "cv",
          "ElasticNetCV": "cv", "SparseLogisticRegressionCV": "cv",
          "lasso_path": "estimators",
          "lam_max": "problem", "Problem": "problem", "plot_history": "plot"}


def __getattr__(name):
    if name in _HOMES:
        value = getattr(importlib.import_module("." + _HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
