"""SPMD check run by tests/test_mpi.py under mpirun: every rank makes the same data, the
workers take contiguous row shards, solve_mpi runs, and rank 0 writes the result (and the
shard sizes every rank held) as JSON to argv[1].

    solve_shards.py OUT LOSS METHOD GROUPS [no-newton] [hessian-free] [a9a2] [screens]
                    [positive] [enet]

no-newton: run without the support Newton step; hessian-free: the step's direction (the
group step's target) from Hessian-vector products the workers answer, on every support
(otherwise only across machines above |S| = 398, for groups above MAX_SUPPORT), with a
product budget for nearly equal columns; a9a2: the first 3,000 rows of a9a's degree-2
features (nearly equal columns) instead of the random data; screens: rank 0 records, for
the Dis-DDSS run and the serial one, every screening test of the DDSS driver (the
features it removes, whether it had the best dual point's sphere) and the records'
keys; positive: the L1 penalty with coef >= 0 (``L1(positive=True)``), in both runs;
enet: the elastic net at l1_ratio 0.5 (``L1(l2=1.0)``, lam = alpha / 2), in both runs."""
import json
import sys

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

from asyncopt.solvers.methods import solver_flags
from asyncopt.penalties import L1, GroupL1
from asyncopt.problem import Problem
from asyncopt.solvers import solve_ddss
from asyncopt.solvers.mpi import solve_mpi
from asyncopt.cli.common import freeze_at_exit


def main(out, loss, method, groups, options=(), batch=None, seed=0, n=400, p=150):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(seed)
    if "a9a2" in options:
        from asyncopt.data.embedded import load_a9a
        X, y = load_a9a(degree=2)
        X, y = X[:3000], y[:3000]
        X = X[:, np.flatnonzero(np.diff(X.tocsc().indptr))].tocsr()
        n, p = X.shape
    else:
        X = sp.random(n, p, density=0.08, random_state=seed, format="csr")
        w = np.r_[rng.standard_normal(8), np.zeros(p - 8)]
        y = X @ w + 0.05 * rng.standard_normal(n)
        if loss == "logistic":
            y = np.where(y > np.median(y), 1.0, -1.0)
    penalty = L1(p, positive="positive" in options, l2=1.0 if "enet" in options else 0.0) \
        if groups == 1 else GroupL1(p, groups)
    full = Problem(X, y, loss, penalty, 1.0, True)
    lam = (0.01 if "a9a2" in options else 0.05 if loss == "squared" else 0.2) \
        * full.lam_max()
    shard = None
    rows = 0
    if rank > 0:
        part = np.array_split(np.arange(n), size - 1)[rank - 1]
        rows = len(part)
        shard = Problem(X[part], y[part], loss, penalty, lam, True)
    del X
    flags = solver_flags(method)
    if "no-newton" in options:
        flags["support_newton"] = False
    if "hessian-free" in options:
        import asyncopt.newton.group_model as group_model
        import asyncopt.newton.policy as newton_policy
        import asyncopt.solvers.mpi.newton as mpi_newton
        mpi_newton.cg_products_from_shares = lambda wire, support_size: True
        mpi_newton.group_uses_hessian_free = lambda support_size: True
        newton_policy.MIN_PRODUCTS = group_model.HESSIAN_FREE_PRODUCTS = 2000
    screens = record_screens() if "screens" in options and rank == 0 else None
    result = solve_mpi(comm, shard, penalty, p, full.loss.code, lam, True, tol=1e-8,
                       max_epochs=100 if method == "ddss_naive" else 3000, **flags,
                       batch=batch, random_state=0)
    held = comm.gather(rows, root=0)
    if rank == 0:
        full = full.with_lam(lam)
        objective = full.objective(result.coef, result.intercept)
        mpi_screens = None if screens is None else list(screens)
        if screens is not None:
            screens.clear()
            checked = solve_ddss(full, tol=1e-8, max_epochs=20000, random_state=0)
        serial = solve_ddss(full, tol=1e-11, max_epochs=20000, random_state=0)
        extra = {} if screens is None else {
            "mpi_screens": mpi_screens, "serial_screens": list(screens),
            "serial_history": checked.history, "solution": serial.coef.tolist()}
        with open(out, "w") as f:
            json.dump({**extra, "objective": objective, "serial_objective": serial.primal,
                       "gap": result.gap, "epochs": result.n_iter,
                       "coef_nnz": int(np.count_nonzero(result.coef)),
                       "coef_min": float(result.coef.min()),
                       "converged": result.converged, "shard_rows": held,
                       "history": result.history, "p0": full.null_objective()}, f)


def record_screens():
    """Wrap the DDSS driver's screening (``Driver._screen``, every backend's) so that each
    test appends {"backend", "spheres", "removed"} to the returned list: the backend's
    class, 2 where the best dual point's sphere took part, the original ids of the
    features the test removes (before the compaction rule)."""
    from asyncopt.solvers import ddss
    log, plain = [], ddss.Driver._screen

    def recording(self, cert, final=False):
        backend = self.backend
        keep = ddss.screen_blocks(cert, self.best, backend.block_column_norms(),
                                  backend.n_samples, backend.lipschitz, backend.lam,
                                  backend.weights, backend.penalty.l2)
        log.append({"backend": type(backend).__name__,
                    "spheres": 1 + (self.best.block_correlation is not None),
                    "removed": backend.features()[~keep].tolist()})
        return plain(self, cert, final)
    ddss.Driver._screen = recording
    return log


if __name__ == "__main__":
    freeze_at_exit()     # as the command lines: their exit, not numba's last collection
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
