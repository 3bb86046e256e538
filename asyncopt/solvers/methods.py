"""The method names every front end accepts and the solver flags each one stands for.

Kept apart from the estimators so that the MPI ranks of the command line tools and the
benchmarks can map a method to solve_mpi's flags without importing scikit-learn, whose
start-up every rank would pay."""

METHODS = {
    "ddss": {"screening": True, "variance_reduced": True, "saga": False, "dense": False,
             "support_newton": True},
    "ddss_naive": {"screening": True, "variance_reduced": False, "saga": False,
                   "dense": False, "support_newton": False},
    "prox_asaga": {"screening": False, "variance_reduced": True, "saga": True,
                   "dense": False, "support_newton": False},
    "prox_asvrg": {"screening": False, "variance_reduced": True, "saga": False,
                   "dense": True, "support_newton": False},
    "working_set": {"screening": True, "variance_reduced": True, "saga": False,
                    "dense": False, "support_newton": False, "inner": "working_set"},
    "auto": {"screening": True, "variance_reduced": True, "saga": False, "dense": False,
             "support_newton": True, "inner": "auto"},
    "pse_safe": {"pse": "safe"},
    "pse_strong": {"pse": "strong"}}
BACKENDS = ("serial", "threads", "mpi")
# the methods that solve the elastic net (``penalties.L1`` with l2 > 0, l1_ratio < 1)
ELASTIC_NET_METHODS = ("auto", "ddss", "ddss_naive", "working_set")


def check_elastic_net(label, penalty):
    """ValueError (one line, naming the method) where ``penalty`` has an L2 part (the
    elastic net, l1_ratio < 1) and the method ``label`` is a baseline: ProxASAGA's and
    ProxASVRG's kernels and PSE's block coordinate descent apply the L1 prox alone."""
    if penalty.l2 and label not in ELASTIC_NET_METHODS:
        raise ValueError(f"method {label!r} (a baseline) has no elastic net: l1_ratio < 1 "
                         f"needs one of {ELASTIC_NET_METHODS}")


MPI_METHODS = ("auto", "ddss", "ddss_naive", "prox_asaga", "prox_asvrg", "working_set")


def solver_flags(method, screening=True):
    """The method arguments solve_ddss and solve_mpi share (screening, variance_reduced,
    saga, dense, support_newton, inner) for one of MPI_METHODS."""
    spec = METHODS[method]
    return dict(screening=screening and spec["screening"],
                variance_reduced=spec["variance_reduced"], saga=spec["saga"],
                dense=spec["dense"], support_newton=spec["support_newton"],
                inner=spec.get("inner", "svrg"))


def solve_method(problem, method, *, screening=True, checkpoint=None, step_scale=1.0,
                 **common):
    """Solve ``problem`` with one of METHODS: the PSE baselines by solve_pse, the others by
    solve_ddss with the method's flags. ``common``: the arguments both solvers take. What
    the estimators and the command line tools (without mpirun) call."""
    from .ddss import solve_ddss
    from .pse import solve_pse
    spec = METHODS[method]
    check_elastic_net(method, problem.penalty)
    if "pse" in spec:
        if checkpoint is not None:
            raise ValueError(f"method {method!r} does not write checkpoints")
        return solve_pse(problem, spec["pse"], label=method, **common)
    return solve_ddss(problem, **solver_flags(method, screening), checkpoint=checkpoint,
                      step_scale=step_scale, label=method, **common)
