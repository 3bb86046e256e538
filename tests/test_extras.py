"""A missing optional dependency names the extra that installs it (the torch bridge's:
tests/test_deep_bridge.py)."""
import sys

import numpy as np
import pytest


def test_mpi_backend_without_mpi4py_names_the_extra(monkeypatch):
    from asyncopt import Lasso

    monkeypatch.setitem(sys.modules, "mpi4py", None)      # import mpi4py -> ImportError
    X = np.eye(4)
    with pytest.raises(ImportError, match=r"pip install 'asyncopt\[mpi\]'"):
        Lasso(alpha=0.1, backend="mpi").fit(X, np.arange(4.0))

