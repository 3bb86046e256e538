"""The adaptive inner step of DDSS (``method="auto"``, the estimators' default).

Between two certificates of the outer loop the driver runs either the prox-SVRG epoch
(``inner="svrg"``, with the support Newton step its stall watch takes: it wins on tall,
well-conditioned data) or the working-set step (``inner="working_set"``: it wins where
there are few rows per feature or the columns are nearly collinear). ``InnerChoice``
picks one per outer iteration from what each kind has done so far in this run:

- a step's progress is ln(G_before / G_after), G the best duality gap before the step
  and at the next record (after any support Newton step), and its work the entries of
  the data it and the certificates until that record read, each weighted by what it
  costs (``WORK``), plus the fixed cost of an outer iteration;
- a kind's rate r_k is the progress over the work of its last WINDOW steps (a prox-SVRG
  epoch's rate falls as it runs on ill-conditioned data, a working set's grows with its
  size);
- each kind runs once, prox-SVRG first where it is a candidate (an epoch from x = 0
  reads every entry a few times and moves every coordinate, where the first working
  set, ten features, leaves the gap of the others), then the kind of the best rate, except that the other kind runs whenever its total work is
  below (r_other / r_best)^2 times the best kind's: it keeps being measured, and where
  the rates stay in a ratio rho the run does (1 + rho^2) / (1 + rho^3) <= 1.12 times the
  work of the best kind alone;
- prox-SVRG is a candidate only while the active set has no more features than the data
  has rows: with more, the data term is not strongly convex on them (A^T A / n is
  singular), an epoch of n row steps makes little progress, and it leaves most of the
  coordinates it touches non-zero, so that the next working set holds all of them.

Work is counted, not timed, so that one seed makes the same choices in every run.
"""
import math

KINDS = ("working_set", "svrg")

WORK = {
    "svrg": 3.0,          # an entry of a prox-SVRG step: the margin, the lazy prox, the move
    "read": 1.0,          # an entry read or updated once (coordinate descent, certificate)
    "dense": 0.1,         # an entry of a dense matrix read in order (a pass on a Gram matrix)
    "transpose": 8.0,     # an entry copied into the working set's column store
    "flop": 0.05,         # a flop of the support Newton step's dense solve (BLAS)
    "newton": 1e7,        # a support Newton step's own fixed cost (its Python)
    "step": 1e5,          # an outer iteration's fixed cost (its Python), about 0.1 ms
    "gram": 1e5,          # a working set's Gram matrix's fixed cost (its Python)
}
WINDOW = 2                # steps of a kind whose rate is its rate now
NEWTON_EPOCHS = 16        # epochs' work a support Newton step may cost (``newton_pays``)


def certificate_work(nnz, n_samples):
    """Work of one certificate: the margins and A^T rho (a read of every entry each),
    and the residuals."""
    return WORK["read"] * (2.0 * nnz + 2.0 * n_samples)


def svrg_work(steps, nnz, n_samples):
    """Work of a prox-SVRG epoch of ``steps`` row steps over data of ``nnz`` entries
    (an upper bound where blocks are frozen for the epoch)."""
    return WORK["svrg"] * steps * (nnz / n_samples + 1.0)


def newton_work(support):
    """Work of a support Newton step on ``support`` coordinates: a fixed cost and its
    dense solve, support^3 / 3 flops (its certificate is counted apart)."""
    return WORK["newton"] + WORK["flop"] * support ** 3 / 3.0


def newton_pays(support, nnz, n_samples):
    """``inner="auto"`` takes the support Newton step its stall watch asks for only
    where it costs at most NEWTON_EPOCHS prox-SVRG epochs of work: on small data its
    fixed cost is that of many epochs or working-set steps, which then do better."""
    return newton_work(support) <= NEWTON_EPOCHS * svrg_work(n_samples, nnz, n_samples)


class InnerChoice:
    """The rule of the module docstring: ``next()`` -> the kind to run; ``credit(kind,
    gap_before, gap_after, work)`` after its certificate."""

    def __init__(self, window=WINDOW):
        self.window = window
        self.steps = {kind: [] for kind in KINDS}       # (progress, work) per step
        self.work = dict.fromkeys(KINDS, 0.0)

    def rate(self, kind):
        recent = self.steps[kind][-self.window:]
        return max(sum(p for p, _ in recent), 0.0) / sum(w for _, w in recent)

    def next(self, svrg=True):
        """The kind to run; ``svrg=False`` (more active features than rows): the working
        set. A kind not run yet runs first, prox-SVRG before the working set."""
        if not svrg:
            return "working_set"
        for kind in reversed(KINDS):
            if not self.steps[kind]:
                return kind
        rate = {kind: self.rate(kind) for kind in KINDS}
        best = max(KINDS, key=lambda kind: rate[kind])      # ties: the working set
        other = KINDS[1 - KINDS.index(best)]
        share = (rate[other] / rate[best]) ** 2 if rate[best] > 0.0 else 1.0
        return other if self.work[other] < share * self.work[best] else best

    def credit(self, kind, gap_before, gap_after, work):
        work = max(work, 1.0) + WORK["step"]
        progress = math.log(gap_before / max(gap_after, 1e-300)) if gap_before > 0.0 \
            else 0.0
        self.steps[kind].append((progress, work))
        self.work[kind] += work
