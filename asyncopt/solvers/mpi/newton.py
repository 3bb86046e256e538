"""The second-order step on the support over the shards (Dis-DDSS; docs/design.md §3, §5).

Every rank runs ``DistributedStep(...).run()`` at the same point of the outer loop, with
its x and b (equal on every rank: each inner epoch ends with the workers holding the
server's); the server decides (the support, the move, the candidate taken), the workers
sum their shares of the Hessian, of its products or of the trial losses. The model
solvers are ``newton.model`` / ``newton.group_model``'s, the shares ``newton.kernels``'
``SupportRows``; the single-process step is ``newton.step``.
"""
import numpy as np

from ...kernels.linalg import csr_rmatvec
from ...losses import generalized_residual, loss_of_code, mean_loss
from ...newton.group_model import (group_move, group_support_point,
                                   hessian_free_group_move)
from ...newton.kernels import (SupportRows, from_upper_triangle,
                               group_blocks_length, group_hessian_blocks,
                               lower_from_upper_triangle, quadratic_trial_sums,
                               shard_slope, trial_moves)
from ...newton.model import (LINE, STEP_GRID, best_candidate, dense_move, move_candidates,
                             preconditioner_coordinates, preconditioner_size, support_move,
                             support_point, take_candidate)
from ...newton.policy import (HESSIAN_FREE_MAX_SUPPORT, entering_coordinates,
                              entering_groups, entering_limit, group_uses_hessian_free,
                              pruned_coordinates, uses_hessian_free)
from ...runtime import touch_lower_triangle, touch_pages
from .protocol import server_vector


class DistributedStep:
    """The support Newton step over the shards, run by every rank with its x and b (equal on
    every rank) and its margins z at them: ``run()`` returns (x, b, t, products), the same
    x, b and t on every rank (products: the Hessian-vector products the server's solve
    took; 0 on the workers and where the Hessian was reduced).
    
    S = the non-zeros of x and the zeros that most violate the optimality condition
    (``newton.policy.entering_coordinates``; where the Hessian is summed for the squared
    loss also the zeros among the largest columns: ``server_entering_coordinates``), chosen
    by the server and broadcast. When x has more than MAX_SUPPORT non-zeros (for a group
    penalty, always) those outside its firm support are first set to zero
    (``pruned_coordinates``); the sums [f, rho, A_S^T rho] at the pruned x then replace the
    certificate's, and a candidate is taken only below P of the unpruned x. Each worker
    forms its share of the Hessian on S from its rows (``SupportRows``); then, by what a
    message costs (``cg_products_from_shares``), either
      - the workers reduce their shares' upper triangles (for the squared loss, once most
        of S was in the last step's, only their rows of the coordinates new to S:
        ``ReducedHessian``) and the server broadcasts the move (``newton.model.dense_move``:
        the end point of the orthant Newton path or the projected direction); for the
        squared loss the server sums the losses at the candidates itself
        (``quadratic_trial_sums``, exact), so there is no round of trial losses;
      - or the workers reduce the diagonal and the preconditioner block, then answer each
        product the server's CG asks for (``newton.model.support_move``);
      - for a group penalty above MAX_SUPPORT coordinates, the diagonal group blocks and
        the intercept's column, then products from the rows
        (``newton.group_model.hessian_free_group_move``); below, the summed Hessian and
        ``newton.group_model.group_move``;
    every rank forms the same candidates, the workers reduce their losses at them (but
    above) and the server broadcasts the one taken (-1: none).
    
    ``correlation`` (A^T rho) and ``rho_sum`` (sum rho) are this rank's: the server's over
    all rows, a worker's over its own (the slope of its trial losses, ``shard_slope``);
    ``firm`` (x's firm support), ``loss_sum`` (sum f at x) and ``column_sq`` (||A_:j||^2
    over the active features) are the server's; ``reduced``: the run's ReducedHessian on
    every rank (squared loss) or None; ``features``: the active features' original ids."""

    def __init__(self, wire, active, x, b, z, code, lam, n, penalty, intercept,
                 correlation, rho_sum, firm, loss_sum, column_sq, reduced, features):
        self.wire, self.server = wire, wire.rank == 0
        self.active, self.x, self.b, self.z, self.code = active, x, b, z, code
        self.lam, self.n, self.penalty, self.intercept = lam, n, penalty, intercept
        self.correlation, self.rho_sum, self.firm = correlation, rho_sum, firm
        self.loss_sum, self.column_sq, self.reduced = loss_sum, column_sq, reduced
        self.features = features
        self.groups = penalty.group_indptr is not None
        self.quadratic = loss_of_code(code).quadratic
        self.products = 0      # Hessian-vector products the server's solve asked for
        self.hessian = None    # the summed Hessian (server), where it was reduced
        self.server_trials = False

    def run(self):
        """(x, b, t, products): the step taken (x as it was, t = 0, where none was)."""
        self._prune()
        self._choose_support()
        if self.groups and group_uses_hessian_free(self.k):
            candidates = self._group_products()
        elif not self.groups and cg_products_from_shares(self.wire, self.k):
            candidates = self._cg_products()
        else:
            candidates = self._summed()
        index = -1 if candidates is None else self._choose(candidates)
        x = self.x
        if index < 0:
            x[self.pruned] = self.saved
            return x, self.b, 0.0, self.products
        return x, take_candidate(x, self.b, self.support, candidates[index],
                                 self.intercept), float(STEP_GRID[index]), self.products

    def _prune(self):
        """x's non-zeros outside its firm support set to zero (``pruned_coordinates``,
        chosen by the server)."""
        x, server = self.x, self.server
        self.pruned = server_vector(self.wire, pruned_coordinates(
            x, self.firm, always=self.groups).astype(np.float64) if server
            else None).astype(np.int64)
        self.saved = x[self.pruned].copy()
        x[self.pruned] = 0.0
        if self.pruned.shape[0] and not server:
            self.z = self.active.margins(x, self.b)

    def _choose_support(self):
        """S, the point on it and, where x was pruned, the sums at the pruned x."""
        wire, server, x, b = self.wire, self.server, self.x, self.b
        weights, block_indptr = self.penalty.weights, self.penalty.group_indptr
        n, lam, intercept = self.n, self.lam, self.intercept
        if self.groups:
            entering = server_vector(wire, entering_groups(
                x, self.correlation, n, lam, weights, block_indptr,
                HESSIAN_FREE_MAX_SUPPORT) if server else None)
            self.support, self.point, self.starts, chosen = group_support_point(
                x, b, intercept, block_indptr, entering)
            self.signs, self.weights_S = None, weights[chosen]
        else:
            entering = server_vector(wire, server_entering_coordinates(
                wire, x, self.correlation, n, lam, weights,
                self.column_sq if self.quadratic else None, self.penalty.positive)
                if server else None)
            self.support, self.point, self.signs = support_point(x, b, intercept, entering)
            self.starts, self.weights_S = None, weights[self.support]
        self.k, self.dim = self.support.shape[0], self.point.shape[0]
        self.offset = 0.0                 # P(x) - P(the pruned x)
        self.loss_at_point = self.loss_sum     # the server's sum f at the point
        if self.pruned.shape[0]:
            self._sums_at_pruned()
        else:
            self.correlation_S = self.correlation[self.support]
        self.rows = None if server else SupportRows(
            self.active, self.code, self.z, self.support, intercept,
            shard_slope(self.correlation_S, self.rho_sum, intercept))

    def _sums_at_pruned(self):
        """[sum c f, sum rho, A_S^T rho] at the pruned x replace the certificate's."""
        active, code, z = self.active, self.code, self.z
        local = np.zeros(2 + self.k)
        if not self.server:
            weights = active.sample_weight
            rho = generalized_residual(code, z, active.y, weights, np.empty_like(z))
            local[0] = mean_loss(code, z, active.y, weights) * z.shape[0]
            local[1] = np.sum(rho)
            local[2:] = csr_rmatvec(active.indptr, active.indices, active.data, rho,
                                    active.n_features)[self.support]
        total = self.wire.reduce(local, root_blank=True)
        if self.server:
            # the pruned coordinates make up whole blocks (the firm support is one of
            # blocks): their share of the penalty is the penalty of them alone
            alone = np.zeros_like(self.x)
            alone[self.pruned] = self.saved
            self.offset = (self.loss_sum - total[0]) / self.n + \
                self.lam * self.penalty.value(alone)
            local, self.loss_at_point = total, float(total[0])
        self.rho_sum, self.correlation_S = float(local[1]), local[2:]

    def _slope(self):
        return shard_slope(self.correlation_S, self.rho_sum, self.intercept)

    def _group_products(self):
        """Group step above MAX_SUPPORT: the diagonal blocks and the intercept's column,
        then products from the workers' rows; the server broadcasts the target."""
        wire, rows = self.wire, self.rows
        solve = None
        if self.server:
            block_sums = wire.reduce(np.empty(group_blocks_length(self.starts,
                                                                  self.intercept)),
                                     root_blank=True)

            def solve(hessian_times):
                target, self.products = hessian_free_group_move(
                    block_sums, hessian_times, self._slope(), self.point, self.starts,
                    self.lam * self.weights_S, self.n, self.intercept)
                return target
        else:
            wire.reduce(group_hessian_blocks(rows, self.starts))
        target = product_loop(wire, self.dim, solve,
                              None if self.server else rows.hessian_times_from_rows)
        return None if target is None else move_candidates(LINE, target, self.point,
                                                           self.k)

    def _cg_products(self):
        """L1 step across machines: the preconditioner block's and the diagonal's sums,
        then the CG's products answered by the workers; [kind, orthant] after."""
        wire, server, k, dim = self.wire, self.server, self.k, self.dim
        positions = wire.bcast(
            preconditioner_coordinates(self.column_sq[self.support],
                                       self.intercept).astype(np.float64)
            if server else np.empty(preconditioner_size(k, self.intercept))
        ).astype(np.int64)
        block_size = positions.shape[0] * (positions.shape[0] + 1) // 2
        solve, ending = None, {}
        if server:
            sums = wire.reduce(np.empty(dim + block_size), root_blank=True)
            diagonal = sums[:dim]
            block = (positions, from_upper_triangle(sums[dim:], positions.shape[0]))

            def solve(hessian_times):
                def counted(v):
                    self.products += 1
                    return hessian_times(v)

                kind, vector, _, ending["signs"] = support_move(
                    counted, diagonal, block, self.correlation_S, self.rho_sum,
                    self.point, self.weights_S, self.lam, self.n, self.intercept,
                    self.signs, positive=self.penalty.positive)
                ending["kind"] = kind
                return vector
        else:
            wire.reduce(np.concatenate((self.rows.hessian_diagonal(),
                                        self.rows.hessian_block(positions))))
        vector = product_loop(wire, dim, solve,
                              None if server else self.rows.hessian_times)
        if vector is None:
            return None
        # the move's kind and the orthant its candidates keep
        tail = wire.bcast(np.append(float(ending["kind"]), ending["signs"]) if server
                          else np.empty(1 + k))
        return move_candidates(int(tail[0]), vector, self.point, k, tail[1:])

    def _summed(self):
        """The Hessian's shares reduced (or, for the squared loss, the rows new to S
        since the last step's, ``ReducedHessian``); the server broadcasts
        [kind (-1: none), vector, the orthant of S (L1)]."""
        wire, server, k, dim, groups = self.wire, self.server, self.k, self.dim, \
            self.groups
        reduced, intercept = self.reduced, self.intercept
        move = np.full(1 + dim + (0 if groups else k), -1.0)
        self.server_trials = self.quadratic
        self.hessian = reduce_support_hessian(wire, self.rows, reduced,
                                              self.features[self.support], intercept, dim,
                                              lower_only=not groups)
        if server:
            if groups:
                kind, vector = LINE, group_move(
                    self.hessian, self._slope(), self.point, self.starts,
                    self.lam * self.weights_S, self.n, intercept)
            else:
                kind, vector, _, signs = dense_move(
                    self.hessian, self.correlation_S, self.rho_sum, self.point,
                    self.weights_S, self.lam, self.n, intercept, self.signs,
                    self.penalty.positive)
            if kind is not None and vector is not None:
                move[0], move[1:1 + dim] = kind, vector
                if not groups:
                    move[1 + dim:] = signs
        move = wire.bcast(move)
        if move[0] < 0:
            return None
        signs = None if groups else move[1 + dim:]
        return move_candidates(int(move[0]), move[1:1 + dim], self.point, k, signs)

    def _choose(self, candidates):
        """The candidate the server takes (-1: none), on every rank: the trial losses
        the workers reduce, or for the squared loss the server's exact sums from the
        reduced Hessian (``quadratic_trial_sums``: no round)."""
        wire, server, k = self.wire, self.server, self.k
        if self.server_trials:
            sums = None if not server else quadratic_trial_sums(
                self.loss_at_point, self._slope(), self.hessian,
                trial_moves(self.point, candidates))
        else:
            sums = wire.reduce(np.empty(candidates.shape[0] + 1) if server else
                               self.rows.trial_sums(self.point, candidates),
                               root_blank=True)
        chosen = np.full(1, -1.0)
        if server:
            chosen[0] = best_candidate(sums, self.n, self.lam, self.weights_S,
                                       self.point[:k], candidates[:, :k], self.offset,
                                       self.starts)[0]
        return int(wire.bcast(chosen)[0])


def reduce_support_hessian(wire, rows, reduced, ids, intercept, dim, lower_only=False):
    """The Hessian sum on S (original ids ``ids``, the intercept last where it is fitted)
    on the server, None on the workers, whose ``rows`` (``SupportRows``; None on the
    server) give their shares: their upper triangles (``summed_hessian``), or with
    ``reduced`` (squared loss: the run's ReducedHessian on every rank), once most of S was
    in the last sum, only their rows of the coordinates new to S (no round where none
    is). ``lower_only``: the server may get the lower triangle alone."""
    server = wire.rank == 0
    plan = None if reduced is None else reduced.fresh(ids, intercept)
    fresh_numbers = 0 if plan is None else plan[0].shape[0] * dim
    hessian = None
    if server:
        if plan is None:
            hessian = summed_hessian(wire, dim, lower_only=lower_only)
        else:
            hessian = reduced.assemble(plan, wire.reduce(
                np.empty(fresh_numbers), root_blank=True) if fresh_numbers else np.zeros(0))
    elif plan is None:
        wire.reduce(rows.hessian_triangle())
    elif fresh_numbers:
        wire.reduce(rows.hessian_rows(plan[0]).ravel())
    if reduced is not None:
        reduced.keep(ids, intercept, hessian)
    return hessian


def summed_hessian(wire, dim, lower_only=False):
    """The server's sum of the workers' Hessian shares (their ``upper_triangle``s, summed
    in place) as the symmetric dim x dim matrix, or with ``lower_only`` its lower
    triangle alone (``lower_from_upper_triangle``: all the L1 step reads, fewer pages).
    Where each rank of the node has a core, the server's is idle while the workers form
    their shares, and it first maps the pages of the sum and of the matrix
    (``runtime.touch_pages``) so that the reduction and the unpacking write into mapped
    memory."""
    total, square = np.empty(dim * (dim + 1) // 2), np.empty((dim, dim))
    if wire.local_ranks <= wire.node_cores:
        touch_pages(total.view(np.uint8))
        memory = square.reshape(-1).view(np.uint8)
        if lower_only:
            touch_lower_triangle(memory, dim)
        else:
            touch_pages(memory)
    unpack = lower_from_upper_triangle if lower_only else from_upper_triangle
    return unpack(wire.reduce(total, root_blank=True), dim, out=square)


def server_entering_coordinates(wire, x, correlation, n, lam, weights, column_sq,
                                positive=False):
    """The server's ``entering_coordinates`` for the L1 step (``positive``: the positive
    L1 penalty's): with the popular zeros (``column_sq``; None: none) where the step
    would still reduce the Hessian, not ask for products (``cg_products_from_shares``)."""
    limit = entering_limit(int(np.count_nonzero(x)))
    entering = entering_coordinates(x, correlation, n, lam, weights, limit, column_sq,
                                    positive)
    if column_sq is not None and cg_products_from_shares(
            wire, int(np.count_nonzero(x)) + entering.shape[0]):
        entering = entering_coordinates(x, correlation, n, lam, weights, limit,
                                        positive=positive)
    return entering


def cg_products_from_shares(wire, support_size):
    """Whether the L1 step's CG asks the workers for Hessian-vector products
    (``SupportRows.hessian_times``) instead of reducing their Hessian shares once: only
    across machines (not ``Wire.one_node``), and there where products send fewer bytes
    than the shares' (|S| + 1)(|S| + 2) / 2 numbers a worker (``uses_hessian_free``). On
    one node a product's round (a broadcast and a reduction every worker must wake for)
    costs more than the bytes."""
    return not wire.one_node and uses_hessian_free(support_size)


def product_loop(wire, dim, solve, answer):
    """The server's ``solve(hessian_times)`` (None on the workers), the workers answering
    the products it asks for: for each, the server broadcasts [1, v] and they reduce
    their shares ``answer(v)`` (H_shard v); [0, vector] ends the loop with the vector
    ``solve`` returned, [-1, ...] with None. Returns that vector, or None, on every
    rank."""
    if solve is not None:
        def hessian_times(v):
            wire.bcast(np.concatenate(([1.0], v)))
            return wire.reduce(np.empty(dim), root_blank=True)

        result = solve(hessian_times)
        found = result is not None
        wire.bcast(np.concatenate(([0.0 if found else -1.0],
                                   result if found else np.zeros(dim))))
        return result
    while True:
        message = wire.bcast(np.empty(1 + dim))
        if message[0] != 1.0:
            return message[1:] if message[0] == 0.0 else None
        wire.reduce(answer(message[1:]))
