"""The support Newton step: a second-order move on the non-zero coordinates of x (for
group penalties, its non-zero groups), taken between DDSS epochs when the gap stalls, on
every backend. What the step is for: where columns are nearly equal, the Lasso moves
weight from one column of a pair to the other along a direction of almost no curvature,
which first-order steps (prox-SVRG) follow at constant speed and a Newton step crosses at
once; and in a run's tail, one step on the right support ends the run. Why its rules
and constants are what they are: benchmarks/notes/newton.md.

The package, by layer (a module imports only those listed above it):
  kernels      the shard layer: numba passes over a shard's rows that form the loss's
               Hessian sums on S (the packed triangle, some of its rows, the group
               step's diagonal blocks), Hessian products from the rows and the losses at
               candidate points; the packed-triangle and symmetric-matrix helpers;
               ``SupportRows`` (a shard's rows restricted to S, what forms its Hessian
               share) and the caches of a previous step's sum (``HessianCache``,
               ``ReducedHessian``)
  policy       when the step is tried (``StallWatch``), on which coordinates (the firm
               support, the entering zeros, the pruned non-zeros) and within which
               limits (MAX_SUPPORT, HESSIAN_FREE_MAX_SUPPORT, ``uses_hessian_free``,
               ``product_budget``)
  model        the L1 model's solvers: the orthant Newton path, the projected Newton
               direction by preconditioned CG, the move between them (``dense_move``,
               ``support_move``), its candidates and the best one
  group_model  the group model's solvers: the proximal Newton model's minimiser from the
               Hessian (``group_model_minimum``) or from products
               (``hessian_free_group_minimum``)
  step         the step on one process (``support_newton_step``,
               ``group_support_newton_step``); under MPI ``solvers.mpi`` puts the same
               layers together over the shards

The L1 step (S the non-zero coordinates of x and the entering zeros, sigma their signs, b
the intercept when it is fitted). On the orthant of x the objective is smooth:
    P(x_S, b) = (1/n) sum_i f(a_iS^T x_S + b) + lam sum_{j in S} w_j sigma_j x_j,
with gradient g = [-(A_S^T rho) / n + lam w sigma, -sum(rho) / n] and Hessian
    H = (1/n) [A_S, 1]^T diag(f''(z)) [A_S, 1]
(``kernels.support_hessian_sums`` forms the sum, one shard at a time). The quadratic model
q(d) = g^T d + d^T H d / 2 is minimised over the orthant of x (``model.dense_move``):
  - ``model.orthant_newton_target``: the Newton direction on the free coordinates,
    followed up to the first coordinate that reaches zero, which is then fixed at zero,
    and again (the path of active-set methods for quadratic programs, Nocedal & Wright
    ch. 16.5); candidates x + t (target - x);
  - ``model.hessian_free_direction``: the projected Newton direction by CG on products
    with H (the coordinates it takes across zero fixed, those the model wants back
    freed, and solved again); candidates the projections of x + t d onto the orthant;
for the t of STEP_GRID, the move whose full step models lower kept (the path only up to
398 coordinates, ``policy.uses_hessian_free``). For the squared loss q is exact, so the
end point lowers P by exactly -q; for the logistic loss it is a model. The step taken is
the candidate with the smallest exact P (``kernels.SupportRows.trial_sums``: one pass over
the rows for all candidates, or for the squared loss the exact quadratic expansion), when
that P is lower than P(x).

Under MPI across machines, where sending the Hessian would cost more bytes than products
with it (``policy.uses_hessian_free``: (|S| + 1)(|S| + 2) / 2 numbers per worker against
MIN_PRODUCTS products of 2 (|S| + 1) numbers), the workers keep their shares and the
server forms the same move from their products (``model.support_move``).

Which coordinates (``policy``): S is x's non-zeros plus the zeros of x that most violate
the optimality condition |A_j^T rho| <= n lam w_j (``entering_coordinates``; at most
ENTERING_SHARE |S|), which start at zero in the orthant of sign(A_j^T rho): a step on the
non-zeros alone cannot certify while a coordinate of the solution is zero in x. When x
has more than MAX_SUPPORT non-zeros, those outside its firm support (its non-zeros that
are not ``settled_zeros``) are first set to zero (``pruned_coordinates``) and the
candidates are compared with P of the unpruned x.

When (``policy.StallWatch``): after an epoch that cut the gap by less than 1 /
STALL_RATIO, or that left it more than TRY_EPOCHS epochs from the goal at its rate, once
at most SUPPORT_CHURN of x's firm support changed in it. A full step (t = 1) after which
zeros of x violate the optimality condition is followed at once by another that lets
them in (``StallWatch.should_chain``); for the squared loss it reuses the Hessian sum of
the step before (``kernels.HessianCache``, ``kernels.ReducedHessian``).

The group step. G the groups with x_g != 0 and the zero groups that most violate
||A_g^T rho|| <= n lam w_g (``policy.entering_groups``); S their coordinates, H and g as
above. The target minimises the proximal Newton model
    m(u) = g^T (u - x) + (u - x)^T H (u - x) / 2 + lam sum_{k in G} w_k ||u_k||
(exact for the squared loss: m(u) = P(u) - P(x) on S; the model of skglm's
GroupProxNewton), by ``group_model.group_model_minimum``:
  - the intercept is eliminated first (its exact minimiser for each u_S: the Schur
    complement H_SS - h h^T / h_bb), the model's stiff direction;
  - block coordinate descent (a prox-gradient step of 1/L_k on each group, L_k the
    largest eigenvalue of H_kk) finds the groups that end at zero;
  - on the others m is smooth, and Newton's method on them (with the penalty's Hessian
    lam w_k (I - u_k u_k^T / ||u_k||^2) / ||u_k||, a line search on m) reaches the
    minimum;
  - repeated (descent, Newton) while a zero group violates the model's optimality or
    Newton's line search fails (a group shrinking to zero: m is not smooth there).
Above MAX_SUPPORT coordinates (``policy.group_uses_hessian_free``; up to
HESSIAN_FREE_MAX_SUPPORT) no Hessian is formed: its diagonal group blocks and its column
on the intercept come from one pass over the rows restricted to S
(``kernels.group_hessian_blocks``), each product from another such pass, and the target
from ``group_model.hessian_free_group_minimum`` (block moves, then Newton-CG with the
blocks' inverses as preconditioner). Under MPI the workers reduce their shares of H (or
of its blocks, and answer the products) and the server broadcasts the target. The
candidates are x + t (target - x) for t in STEP_GRID, judged by their exact P
(``model.best_candidate`` with the groups' norms), as for L1.

Any x is a valid iterate: the gap and the screening are computed at whatever x the step
leaves, so the step changes how fast DDSS converges, never what it certifies.
"""
