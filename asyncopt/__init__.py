"""asyncopt: distributed-memory asynchronous optimization with dynamic safe screening.

    from asyncopt import Lasso
    model = Lasso(alpha=0.01).fit(X, y)     # coef_, intercept_, dual_gap_, active_set_
"""
from .estimators import GroupLasso, Lasso, SparseLogisticRegression, lasso_path
from .problem import Problem, lam_max

__version__ = "0.1.0"
__all__ = ["Lasso", "GroupLasso", "SparseLogisticRegression", "lasso_path", "lam_max",
           "Problem", "__version__"]
