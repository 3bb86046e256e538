"""Dis-DDSS under mpirun (1 server + workers): the serial optimum, shards only, messages
that shrink with screening. Each case starts `mpirun -n K` on tests/mpi/solve_shards.py."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
SCRIPT = os.path.join(os.path.dirname(__file__), "mpi", "solve_shards.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rank_env(**extra):
    """The environment of the ranks these tests start: this checkout first on
    PYTHONPATH, plus ``extra``."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **extra)


def run_spmd(tmp_path, n_ranks, loss, method, groups, transport="auto", options=()):
    out = tmp_path / "result.json"
    env = rank_env(ASYNCOPT_MPI_TRANSPORT=transport)
    proc = subprocess.run([MPIRUN, "-n", str(n_ranks), sys.executable, SCRIPT, str(out), loss,
                           method, str(groups), *options], env=env, capture_output=True,
                          text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.mpi
@pytest.mark.parametrize("method,n_ranks,loss,groups,transport", [
    ("ddss", 3, "squared", 1, "auto"), ("ddss", 5, "squared", 3, "messages"),
    ("ddss", 3, "logistic", 3, "messages"), ("ddss", 5, "logistic", 1, "auto"),
    ("prox_asaga", 3, "squared", 1, "auto"), ("prox_asaga", 5, "logistic", 3, "messages"),
    ("prox_asvrg", 5, "squared", 3, "auto"), ("prox_asvrg", 3, "logistic", 1, "messages"),
    ("working_set", 3, "squared", 1, "auto"), ("working_set", 5, "squared", 1, "messages"),
    ("working_set", 3, "logistic", 1, "auto"), ("working_set", 5, "logistic", 1, "messages"),
    ("auto", 3, "squared", 1, "auto"), ("auto", 5, "logistic", 1, "messages"),
    ("auto", 3, "squared", 3, "auto")])
def test_every_method_reaches_the_serial_objective(tmp_path, method, n_ranks, loss, groups,
                                                   transport):
    result = run_spmd(tmp_path, n_ranks, loss, method, groups, transport)
    # every rank of these runs is on this machine: auto picks the shared-memory window
    assert {h["transport"] for h in result["history"]} == \
        {"shared" if transport == "auto" else transport}
    assert result["converged"]
    assert abs(result["objective"] - result["serial_objective"]) <= \
        1e-6 * abs(result["serial_objective"])
    # the working-set step runs under mpirun for the L1 penalty (auto: beside the epochs)
    steps = {h["working_set"] is not None for h in result["history"][1:]}
    assert steps == ({True} if method == "working_set" else {True, False}
                     if method == "auto" and groups == 1 else {False})
    # the last certificate's P came from the workers' margins, with no broadcast of x
    # since the first epoch: it is the P of the server's x only if the inner loops' final
    # replies left every worker holding exactly the server's x and b
    assert abs(result["history"][-1]["primal"] - result["objective"]) <= \
        1e-13 * abs(result["objective"])
    # rank 0 holds no rows, the workers a contiguous shard each, together every row once
    rows = result["shard_rows"]
    assert rows[0] == 0 and sum(rows) == 400 and max(rows[1:]) - min(rows[1:]) <= 1
    history = result["history"]
    # tau = the server's version at a delta's arrival - the version its batch started
    # from, and the version counts the epoch's messages from 0: no delta can be staler
    # than the messages applied before it in its epoch (a record holds its last epoch's
    # staleness and messages; none before the first epoch)
    assert all(h["staleness_mean"] <= h["staleness_max"] <= max(h["messages"] - 1, 0)
               for h in history)
    assert history[0]["staleness_max"] == history[0]["messages"] == 0
    # the live line's nnz(x): the non-zeros of x at each record, the last one the result's
    assert history[-1]["coef_nnz"] == result["coef_nnz"] > 0
    # the certified gap is P - the largest D so far (test_core has a run where it matters)
    assert all(h["dual"] >= h["dual_at_x"] for h in history)
    assert all(b["dual"] == max(a["dual"], b["dual_at_x"])
               for a, b in zip(history, history[1:]))
    # the staleness damping power rises only at an epoch that ended with a larger gap than
    # it started from (the gap at x's own dual point, what the server adapts it on; the
    # certified gap, at the best dual point so far, can fall in the same epoch), and once
    # risen stays within 2..MAX_DAMPING_POWER
    from asyncopt.solvers.mpi.inner import MAX_DAMPING_POWER
    powers = [h["damping_power"] for h in history]
    assert set(powers) <= set(np.arange(1.0, MAX_DAMPING_POWER + 1.0))
    at_x = [h["primal"] - h["dual_at_x"] for h in history]
    for k in range(1, len(history)):
        if powers[k] > powers[k - 1]:
            assert powers[k] == powers[k - 1] + 1 and at_x[k] > at_x[k - 1]
        elif powers[k] < powers[k - 1]:
            assert powers[k] == powers[k - 1] - 1 >= 2


def test_the_working_set_under_mpirun_is_bounded_and_holds_the_best_scores():
    from asyncopt.solvers.mpi.working_set import MAX_SIZE, bounded_working_set
    from asyncopt.solvers.working_set import working_set
    rng = np.random.default_rng(0)
    x = np.where(rng.random(3 * MAX_SIZE) < 0.5, rng.standard_normal(3 * MAX_SIZE), 0.0)
    scores = rng.random(3 * MAX_SIZE)
    # few non-zeros: the serial step's set
    sparse_x = np.where(np.arange(x.shape[0]) < 20, 1.0, 0.0)
    np.testing.assert_array_equal(bounded_working_set(sparse_x, scores, 30),
                                  working_set(np.abs(sparse_x), scores))
    for last, most in ((None, MAX_SIZE), (100, 200)):
        chosen = bounded_working_set(x, scores, last)
        assert chosen.shape[0] == most and np.all(np.diff(chosen) > 0)
        assert scores[chosen].min() >= np.delete(scores, chosen).max()


def test_the_working_set_step_under_mpirun_is_the_l1_penalty_only():
    from asyncopt.losses import SQUARED
    from asyncopt.penalties import GroupL1
    from asyncopt.solvers.mpi import solve_mpi
    with pytest.raises(ValueError, match="under mpirun solves the L1 penalty only"):
        solve_mpi(None, None, GroupL1(6, 3), 6, SQUARED, 0.1, True, inner="working_set")


class _QueueChannel:
    """The inner loop's channel in one process (threads and queues), with the
    MessageChannel's calls: ``worker(w)`` is worker w's end, the object itself the
    server's."""

    def __init__(self, n_workers, capacity, header, reply_header):
        import queue
        self.inbox = queue.Queue()
        self.replies = [queue.Queue() for _ in range(n_workers + 1)]
        self.capacity, self.header, self.reply_header = capacity, header, reply_header

    def wait_delta(self):
        return self.inbox.get(timeout=30)

    def reply_buffers(self, worker, n_index, n_values):
        return np.empty(n_index, dtype=np.int32), np.empty(self.reply_header + n_values)

    def post_reply(self, worker, index, values):
        self.replies[worker].put((index, values))

    def flush(self):
        pass

    def worker(self, rank):
        channel = self

        class End:
            index = np.empty(channel.capacity, dtype=np.int32)
            values = np.empty(channel.header + channel.capacity)

            def delta_buffers(self):
                return self.index, self.values

            def post_delta(self, n_index, n_values):
                channel.inbox.put((rank, self.index[:n_index].copy(),
                                   self.values[:channel.header + n_values].copy()))

            def wait_reply(self):
                return channel.replies[rank].get(timeout=30)
        return End()


@pytest.mark.mpi
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_serial_and_mpi_run_one_driver_one_screening_rule_one_record(tmp_path, loss):
    """The same problem through mpirun -n 3 and the serial backend: both run the DDSS
    driver's screening with both gap-safe spheres (around x's dual point and the best
    one) at every test, every feature either removes is zero in a 1e-11 solution (safe),
    each removes some, and both write records with the same keys."""
    result = run_spmd(tmp_path, 3, loss, "ddss", 1, options=("screens",))
    solution = np.array(result["solution"])
    for name, backend in (("mpi_screens", "ServerBackend"),
                          ("serial_screens", "LocalBackend")):
        screens = result[name]
        assert screens and {s["backend"] for s in screens} == {backend}
        assert all(s["spheres"] == 2 for s in screens)
        removed = sorted({j for s in screens for j in s["removed"]})
        assert removed and not np.any(solution[removed])
    keys = {frozenset(h) for h in result["history"] + result["serial_history"]}
    assert len(keys) == 1
    assert {"epoch", "gap", "n_active", "coef_nnz", "bytes_sent", "newton_step",
            "support_changes", "certificate_s", "transport"} <= set(keys.pop())


def test_squared_conjugate_from_two_sums_is_the_per_sample_conjugate():
    """The squared loss's certificate needs no second round: sum_i f*(-rho_i / s) from
    sum rho^2 and sum y rho (``squared_conjugate_sum``) equals the per-sample sum that
    mean_neg_conjugate takes, at every scale s >= 1 the server may pick."""
    from asyncopt.losses import SQUARED, UNWEIGHTED, mean_neg_conjugate
    from asyncopt.solvers.mpi.protocol import squared_conjugate_sum
    rng = np.random.default_rng(11)
    for n in (1, 7, 500):
        rho, y = rng.standard_normal(n), 3.0 + rng.standard_normal(n)
        for scale in (1.0, 1.7, 40.0):
            want = -mean_neg_conjugate(SQUARED, rho / scale, y, UNWEIGHTED) * n
            got = squared_conjugate_sum(rho @ rho, y @ rho, scale)
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_the_intercepts_refit_folded_into_the_certificate_gives_the_refit_sums():
    """fold_intercept_shift: the certificate's sums at the old intercept, shifted by
    shift = sum rho / n (over all rows), are the sums the server had after the separate
    refit round: the margins at b + shift, the loss, sum rho (0), sum rho^2, sum y rho
    and A^T rho formed from them directly; on one shard, with its own rows and any shift,
    the same (a worker's own sums)."""
    import scipy.sparse as sp
    from asyncopt.losses import SQUARED, UNWEIGHTED, generalized_residual, mean_loss
    from asyncopt.solvers.mpi.protocol import CERTIFICATE_SUMS, fold_intercept_shift

    def sums(A, y, z):
        rho = generalized_residual(SQUARED, z, y, UNWEIGHTED, np.empty_like(z))
        return np.concatenate(([mean_loss(SQUARED, z, y, UNWEIGHTED) * z.shape[0],
                                rho.sum(), rho @ rho, y @ rho], A.T @ rho))

    rng = np.random.default_rng(5)
    for n, p in ((1, 3), (40, 7), (600, 50)):
        A = sp.random(n, p, density=0.3, random_state=n, format="csr")
        y = 2.0 + rng.standard_normal(n)
        z = A @ rng.standard_normal(p) - 0.4
        got = sums(A, y, z)
        shift = got[1] / n
        fold_intercept_shift(got, shift, n, y.sum(), np.asarray(A.sum(axis=0)).ravel())
        want = sums(A, y, z + shift)
        assert abs(got[1]) <= 1e-10 * np.abs(y).sum()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        assert got.shape[0] == CERTIFICATE_SUMS + p
        got = sums(A, y, z)
        fold_intercept_shift(got, 0.3, n, y.sum(), np.asarray(A.sum(axis=0)).ravel())
        np.testing.assert_allclose(got, sums(A, y, z + 0.3), rtol=1e-10, atol=1e-10)


def test_the_shards_intercept_refit_is_the_one_process_refit():
    """mpi.protocol.intercept_refit over one shard (a wire whose reductions return the
    shard's own sums) is problem.intercept_optimum: the same b to rounding, at which
    mean f' vanishes, and the margins shifted to it in place."""
    import scipy.special
    from asyncopt.losses import LOGISTIC
    from asyncopt.problem import intercept_optimum
    from asyncopt.solvers.mpi.protocol import intercept_refit

    class Alone:
        def allreduce(self, values):
            return np.asarray(values, dtype=np.float64)

    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(5, 200))
        z0 = rng.standard_normal(n) * 2
        y = np.where(rng.random(n) < 0.3, 1.0, -1.0)
        y[0], y[1] = 1.0, -1.0
        start = float(rng.normal() * 2)
        z = z0 + start
        b = intercept_refit(Alone(), LOGISTIC, z, y, start, n)
        assert b == pytest.approx(intercept_optimum(LOGISTIC, z0, y, start), abs=1e-12)
        assert abs(np.mean(-y * scipy.special.expit(-y * (z0 + b)))) <= 1e-12
        np.testing.assert_allclose(z, z0 + b, atol=1e-12)


def test_default_batch_sends_fewer_messages_where_every_rank_has_a_core():
    """default_batch: a worker's messages an epoch (its n / l rows over the batch) do
    not depend on n, the more workers the more messages an epoch in all, at least one
    step a message and at most a shard; up to 4 workers the node does not matter, beyond
    a node where every rank has a core (the server answers at once, each reply costing
    it a pass over what the others changed) sends fewer, longer messages."""
    from asyncopt.solvers.mpi.inner import default_batch
    n = 200_000
    for oversubscribed in (True, False):
        total = [n / default_batch(n, workers, oversubscribed) for workers in range(1, 17)]
        assert all(later >= earlier for earlier, later in zip(total, total[1:]))
        for workers in (1, 2, 3, 4, 8, 16):
            batch = default_batch(n, workers, oversubscribed)
            assert 1 <= batch <= n // workers
            assert default_batch(10 * n, workers, oversubscribed) == \
                pytest.approx(10 * batch, rel=1e-3)
            assert default_batch(workers, workers, oversubscribed) == 1
    for workers in (1, 2, 3, 4):
        assert default_batch(n, workers, True) == default_batch(n, workers, False)
    for workers in (5, 8, 16):
        assert default_batch(n, workers, False) > default_batch(n, workers, True)


@pytest.mark.perf
def test_default_batch_tuning():
    """The tuning behind default_batch (-m perf): m = ceil(2.5 l) messages a worker up
    to 4 workers; beyond, 25 on an oversubscribed node, 10 elsewhere
    (benchmarks/notes/ddss.md)."""
    from asyncopt.solvers.mpi.inner import default_batch
    n = 200_000
    for workers, messages in ((1, 3), (2, 5), (4, 10)):
        assert default_batch(n, workers, True) == default_batch(n, workers, False) == \
            n // (messages * workers)
    assert default_batch(n, 8, True) == n // (25 * 8) == 1000
    assert default_batch(n, 8, False) == n // (10 * 8) == 2500
    assert default_batch(50, 8, False) == 1


def test_inner_loop_one_pass_per_worker_and_every_worker_ends_on_the_servers_x():
    """serve_epoch / work_epoch over an in-process channel, one worker slower (5 ms a
    batch) than the other: each makes exactly one pass over its shard in batches of
    ``batch`` steps, the server counts every step and message, and both workers end
    holding exactly the server's x and b (the final replies assign every coordinate that
    differs), so the next epoch needs no broadcast."""
    import threading
    from asyncopt.solvers.mpi.inner import (HEADER, REPLY_HEADER, default_batch,
                                            serve_epoch, work_epoch)
    n, p, n_workers = 2000, 50, 2
    batch = default_batch(n, n_workers)
    rows = [n // 2 + 7, n - n // 2 - 7]
    channel = _QueueChannel(n_workers, p, HEADER, REPLY_HEADER)
    taken, batches, results = [0, 0, 0], [0, 0, 0], [None, None, None]

    def worker(rank, pause):
        import time

        def run_batch(local, intercept, samples):
            time.sleep(pause)
            np.add.at(local, samples % p, 1e-3 * rank)
            intercept[0] += 1e-4
            taken[rank] += samples.shape[0]
            batches[rank] += 1
        results[rank] = work_epoch(channel.worker(rank), rows[rank - 1], np.zeros(p), 0.0,
                                    run_batch, np.random.default_rng(rank), batch)

    threads = [threading.Thread(target=worker, args=(1, 0.0)),
               threading.Thread(target=worker, args=(2, 0.005))]
    for t in threads:
        t.start()
    x, b, steps, _, messages, _ = serve_epoch(channel, np.zeros(p), 0.0, n_workers,
                                             np.ones(p), 1.0, 1.0)
    for t in threads:
        t.join()
    assert taken[1:] == rows and steps == n
    assert batches[1:] == [-(-r // batch) for r in rows] and messages == sum(batches)
    assert np.all(x > 0) and b > 0
    for rank in (1, 2):
        np.testing.assert_array_equal(results[rank][0], x)
        assert results[rank][1] == b


def test_staleness_damping_is_one_up_to_l_then_l_over_tau_to_the_power():
    from asyncopt.solvers.mpi.inner import staleness_damping
    for power in (1.0, 2.0):
        assert [staleness_damping(tau, 4, power) for tau in range(5)] == [1.0] * 5
        assert staleness_damping(8, 4, power) == pytest.approx(0.5 ** power)
        assert staleness_damping(20, 4, power) == pytest.approx(0.2 ** power)


def test_damping_power_rises_with_the_gap_and_falls_after_calm_epochs():
    """The bold-driver rule of adapt_damping_power on its powers alone, whatever its cap
    and patience: an epoch whose gap rose adds 1 up to MAX_DAMPING_POWER; a calm one
    takes 1 off, never below 2, exactly when it ends CALM_EPOCHS calm epochs in a row
    since the power last changed or the gap last rose, and otherwise leaves it. So the
    power stays 1 until the first rise, a long run of rises reaches the cap and a long
    calm brings it back to 2."""
    from asyncopt.solvers.mpi.inner import (CALM_EPOCHS, MAX_DAMPING_POWER,
                                            adapt_damping_power)
    rng = np.random.default_rng(0)
    span = int(MAX_DAMPING_POWER) * (CALM_EPOCHS + 1)
    runs = [(False, span), (True, span), (False, span * CALM_EPOCHS)]
    pattern = [rose for rose, length in runs for _ in range(length)]
    pattern += list(rng.random(40 * span) < 0.2) + pattern[span:]
    powers, power, calm = [1.0], 1.0, 0
    for rose in pattern:
        power, calm = adapt_damping_power(power, calm, bool(rose))
        powers.append(power)
    for k, rose in enumerate(pattern, start=1):       # powers[k]: after epoch k
        before, now = powers[k - 1], powers[k]
        if rose:
            assert now == min(before + 1.0, MAX_DAMPING_POWER), k
            continue
        steady = k >= CALM_EPOCHS and not any(pattern[k - CALM_EPOCHS:k]) and \
            len(set(powers[k - CALM_EPOCHS:k])) == 1
        assert now == (before - 1.0 if steady and before > 2.0 else before), k
    first_rise = pattern.index(True) + 1
    assert set(powers[:first_rise]) == {1.0}
    ends = np.cumsum([length for _, length in runs])
    assert powers[ends[1]] == powers[-span * CALM_EPOCHS - 1] == MAX_DAMPING_POWER
    assert powers[ends[2]] == powers[-1] == 2.0


class _ReplayWire:
    """A one-process stand-in for Wire.bcast: as the server it keeps what it broadcasts
    and counts the bytes; as a worker it receives those buffers in the same order."""

    def __init__(self, sent=None):
        self.sent = [] if sent is None else sent
        self.received = 0
        self.replay = sent is not None

    def bcast(self, buf):
        if self.replay:
            buf[...] = self.sent.pop(0)
        else:
            self.sent.append(buf.copy())
        self.received += buf.nbytes
        return buf


@pytest.mark.parametrize("free_share", [0.01, 0.3])     # indices, bitmap
@pytest.mark.parametrize("blocks", [False, True])        # L1, groups of 1-4
def test_anchor_leaves_out_the_frozen_zeros_and_every_rank_gets_the_same(free_share,
                                                                          blocks):
    from asyncopt.solvers.ddss import EpochPlan, freeze_optimal_zeros, optimal_zeros
    from asyncopt.solvers.mpi.protocol import receive_anchor, send_anchor
    rng = np.random.default_rng(7)
    p, eta = 5000, 0.1
    block_indptr = None
    sizes = np.ones(p, dtype=int)
    if blocks:
        block_indptr = np.append(0, np.cumsum(rng.integers(1, 5, p)))
        block_indptr = np.append(block_indptr[block_indptr < p], p)
        sizes = np.diff(block_indptr)
    per_feature = np.repeat(sizes, sizes)
    # about free_share / 2 of the blocks non-zero, about as many zero ones violating
    # eta ||mu_g|| <= threshold
    x = np.repeat(rng.random(sizes.shape[0]) < free_share / 2, sizes) * \
        rng.standard_normal(p)
    thresholds = np.full(sizes.shape[0], 0.5)
    step = np.concatenate(([0.3], rng.standard_normal(p) * 2.0 / np.sqrt(per_feature)))
    step[1:][(x == 0) & np.repeat(rng.random(sizes.shape[0]) >= free_share / 2,
                                  sizes)] *= 0.1
    frozen_blocks = optimal_zeros(x, eta, step[1:], thresholds, block_indptr)
    mu = np.where(np.repeat(frozen_blocks, sizes), 0.0, step[1:])
    plan = EpochPlan(eta, 0.0, 0.3, mu, thresholds, frozen_blocks, None)
    server = _ReplayWire()
    send_anchor(server, plan, np.append(0, np.cumsum(sizes)))
    worker = _ReplayWire(list(server.sent))
    got = receive_anchor(worker, p, block_indptr)
    assert got[0] == 0.3 and worker.received == server.received
    np.testing.assert_array_equal(got[1], mu)
    frozen = np.where(got[2], np.inf, thresholds)
    # the thresholds the serial solver uses, and the anchor wherever it matters
    want = freeze_optimal_zeros(x, eta, step[1:], thresholds, block_indptr)
    np.testing.assert_array_equal(frozen, want)
    assert 0 < np.count_nonzero(np.isinf(want)) < want.shape[0]
    free = np.repeat(np.isfinite(want), sizes)
    np.testing.assert_array_equal(mu[free], step[1:][free])
    assert np.all(mu[~free] == 0.0)
    k = int(np.count_nonzero(free))
    assert server.received == 16 + 8 * k + 4 * min(k, (p + 31) // 32) + \
        4 * (min(k, (p + 31) // 32) % 2) < 8 * (p + 1)


@pytest.mark.mpi
def test_messages_shrink_as_screening_removes_features(tmp_path):
    # prox-SVRG epochs only: with the support Newton step this problem is solved before
    # the screening has removed most features
    history = run_spmd(tmp_path, 3, "squared", "ddss", 1,
                       options=("no-newton",))["history"]
    inner = [h for h in history if h["messages"]]
    first, last = inner[0], inner[-1]
    assert last["n_active"] < 0.2 * first["n_active"]
    assert last["message_bytes"] / last["messages"] < first["message_bytes"] / first["messages"]
    assert history[-1]["bytes_recv"] > 0 and history[-1]["bytes_sent"] > 0


@pytest.mark.mpi
@pytest.mark.parametrize("hessian_free,groups", [(False, 1), (True, 1), (False, 4)])
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_support_newton_step_over_the_shards(tmp_path, loss, hessian_free, groups):
    """a9a degree 2 (3,000 rows, nearly equal columns), 2 workers: prox-SVRG epochs alone
    stall (logistic: gap 2.4e-8 after 3,000 epochs); with the step, taken over the shards
    (Hessian reduced, trial losses reduced), Dis-DDSS reaches 1e-8 (20-39 epochs in ten
    runs, 70 once under load) and the serial objective. hessian_free: the direction from
    the server's CG on Hessian-vector products the workers reduce. groups: the group
    penalty's step (newton/group_model.py) on groups of 4."""
    result = run_spmd(tmp_path, 3, loss, "ddss", groups,
                      options=("a9a2",) + (("hessian-free",) if hessian_free else ()))
    assert result["converged"] and result["epochs"] <= 150
    assert any(h["newton_step"] > 0 for h in result["history"])
    assert abs(result["objective"] - result["serial_objective"]) <= \
        1e-7 * abs(result["serial_objective"])
    assert abs(result["history"][-1]["primal"] - result["objective"]) <= \
        1e-13 * abs(result["objective"])


@pytest.mark.mpi
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_hessian_free_group_step_over_the_shards(tmp_path, loss):
    """The group step whose target the server finds from products with the workers' rows
    (``group_model.hessian_free_group_minimum``; forced here on every support, taken
    under MPI above MAX_SUPPORT coordinates): random sparse data, groups of 4, 2
    workers. Dis-DDSS certifies 1e-8 in 5-6 epochs where prox-SVRG alone took 131-198,
    with products counted in the step's record, and reaches the serial objective."""
    result = run_spmd(tmp_path, 3, loss, "ddss", 4, options=("hessian-free",))
    assert result["converged"] and result["epochs"] <= 20
    steps = [h for h in result["history"] if h["newton_step"] > 0]
    assert steps and all(h["newton_products"] > 0 for h in steps)
    assert abs(result["objective"] - result["serial_objective"]) <= \
        1e-9 * abs(result["serial_objective"])


@pytest.mark.mpi
def test_estimators_with_the_mpi_backend_in_an_spmd_script(tmp_path):
    """Lasso, GroupLasso and SparseLogisticRegression with backend="mpi" in a script every
    rank of mpirun -n 3 runs (tests/mpi/estimators_spmd.py, as examples/mpi_lasso.py):
    celer's and scikit-learn's objectives to 1e-8, the same coef_ and intercept_ on every
    rank, string labels; a warm start (a smaller alpha after the first fit) takes fewer
    epochs than a cold fit, reaches the same point and keeps P(0) as the scale of its
    gap; with a checkpoint the server writes it and a second fit resumes from it and
    takes no epoch."""
    import celer
    import sklearn.linear_model as sklm
    env = rank_env()
    script = os.path.join(os.path.dirname(__file__), "mpi", "estimators_spmd.py")
    out, checkpoint = tmp_path / "out.json", tmp_path / "run.npz"
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, script, str(out),
                           str(checkpoint)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    import importlib.util
    spec = importlib.util.spec_from_file_location("estimators_spmd", script)
    spmd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spmd)
    X, y, labels = spmd.make_data()
    n, p = X.shape
    groups = spmd.GROUP_SIZE
    signs = np.where(labels == "spam", 1.0, -1.0)

    def squared(r, groups=1):
        coef = np.array(r["coef"])
        penalty = np.abs(coef).sum() if groups == 1 else \
            np.sqrt(groups) * np.linalg.norm(coef.reshape(-1, groups), axis=1).sum()
        return 0.5 * np.mean((y - X @ coef - r["intercept"]) ** 2) + r["alpha"] * penalty

    def logistic(coef, b, alpha):
        margins = signs * (X @ coef + b)
        return np.mean(np.logaddexp(0.0, -margins)) + alpha * np.abs(coef).sum()

    for name in ("lasso", "group", "logistic", "warm", "cold", "checkpointed", "resumed"):
        assert got[name]["same"], name
        assert got[name]["rel_gap"] <= 1e-9, name
    lasso = got["lasso"]
    ce = celer.Lasso(alpha=lasso["alpha"], tol=1e-14, max_iter=200).fit(X, y)
    theirs = squared({"coef": ce.coef_, "intercept": ce.intercept_,
                      "alpha": lasso["alpha"]})
    assert abs(squared(lasso) - theirs) <= 1e-8 * theirs
    group = got["group"]
    ce = celer.GroupLasso(groups=groups, alpha=group["alpha"],
                          weights=np.full(p // groups, np.sqrt(groups)), tol=1e-14,
                          max_iter=1000, max_epochs=50000).fit(X, y)
    theirs = squared({"coef": ce.coef_, "intercept": ce.intercept_,
                      "alpha": group["alpha"]}, groups=groups)
    assert abs(squared(group, groups=groups) - theirs) <= 1e-8 * theirs
    logit = got["logistic"]
    assert got["classes"] == ["ham", "spam"] and got["accuracy"] > 0.8
    sk = sklm.LogisticRegression(C=1.0 / (n * logit["alpha"]), l1_ratio=1.0, solver="saga",
                                 tol=1e-13, max_iter=500000, random_state=0).fit(X, labels)
    theirs = logistic(sk.coef_.ravel(), sk.intercept_[0], logit["alpha"])
    ours = logistic(np.array(logit["coef"]), logit["intercept"], logit["alpha"])
    assert abs(ours - theirs) <= 1e-8 * theirs
    # the warm start: fewer epochs, the same point, the same scale P(0) of the gap
    warm, cold = got["warm"], got["cold"]
    assert warm["n_iter"] < cold["n_iter"] and warm["first_rel_gap"] < 1e-2
    assert abs(squared(warm) - squared(cold)) <= 1e-9 * squared(cold)
    assert warm["reference"] == pytest.approx(cold["reference"], rel=1e-12)
    # the checkpoint
    saved = np.load(checkpoint)
    np.testing.assert_array_equal(saved["coef"], got["checkpointed"]["coef"])
    assert got["checkpoint_exists"] and got["resumed"]["n_iter"] == 0
    assert got["resumed"]["coef"] == got["checkpointed"]["coef"]


@pytest.mark.mpi
def test_estimators_failure_on_one_rank_ends_every_rank_with_one_message():
    """An error on one worker in the middle of an estimator's fit (backend="mpi", a
    user's SPMD script): one message with its traceback and every rank ends, within
    seconds, where the others would wait for it forever; more workers than rows is a
    ValueError on every rank alike, before any rank holds an empty shard."""
    env = rank_env()
    script = os.path.join(os.path.dirname(__file__), "mpi", "estimator_failure.py")
    # a rank left waiting for the failed one would hold the job past the timeout
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, script, "fail"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("failed, aborting all ranks") == 1, proc.stderr[-2000:]
    assert "Lasso.fit (backend='mpi'): rank 2 of 3 failed" in proc.stderr
    assert "RuntimeError: injected failure on one worker" in proc.stderr
    proc = subprocess.run([MPIRUN, "-n", "4", sys.executable, script, "rows"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stdout.count("ValueError: backend='mpi': 3 workers for 2 rows") == 4, \
        proc.stdout + proc.stderr[-2000:]


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["bug", "disk"])
def test_cli_failure_on_one_rank_mid_solve_ends_every_rank(tmp_path, mode):
    """asyncopt-lasso under mpirun when one rank fails in the middle of the solve: a bug
    on worker 2 (a traceback, it is ours) or the server's checkpoint write finding the
    disk full (one line naming the file): one message, a non-zero exit and every rank
    ended within seconds, where the others would wait for the failed one forever."""
    env = rank_env()
    script = os.path.join(os.path.dirname(__file__), "mpi", "cli_failure.py")
    checkpoint = tmp_path / "run.npz"
    # a rank left waiting for the failed one would hold the job past the timeout
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, script, mode, "--quiet",
                           "--checkpoint", str(checkpoint)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("aborting all ranks") == 1, proc.stderr[-2000:]
    if mode == "bug":
        assert "asyncopt-lasso: rank 2 of 3 failed" in proc.stderr
        assert "RuntimeError: injected failure on one worker" in proc.stderr
    else:
        assert f"asyncopt-lasso: error: No space left on device: {checkpoint} (rank 0 of " \
            "3; aborting all ranks)" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.mpi
def test_the_documented_mpi_example_runs():
    """examples/mpi_lasso.py, as the README starts it (here with mpirun -n 3): rank 0 prints
    one summary line with a relative gap below the example's tol."""
    import re
    env = rank_env()
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable,
                           os.path.join(ROOT, "examples", "mpi_lasso.py")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("2 workers: "), proc.stdout
    assert float(re.search(r"relative gap ([0-9.e+-]+),", lines[0]).group(1)) <= 1e-6


@pytest.mark.mpi
def test_dis_ddss_naive_makes_progress(tmp_path):
    history = run_spmd(tmp_path, 3, "squared", "ddss_naive", 1)["history"]
    assert history[-1]["rel_gap"] < 0.1 * history[0]["rel_gap"]          # sublinear, but moving


def _cli(n_ranks, *args):
    env = rank_env()
    return subprocess.run([MPIRUN, "-n", str(n_ranks), sys.executable, "-m",
                           "asyncopt.cli.lasso", *args], env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.mpi
def test_cli_under_mpirun_prints_one_summary(tmp_path):
    proc = _cli(3, "--quiet", "--history-json", str(tmp_path / "h.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("asyncopt-lasso summary") == 1
    assert "mpi (1 server + 2 workers)" in proc.stdout
    assert "NOT reached" not in proc.stdout
    history = json.loads((tmp_path / "h.json").read_text())
    assert history[-1]["rel_gap"] <= 1e-6 and history[-1]["bytes_recv"] > 0


@pytest.mark.mpi
def test_cli_under_mpirun_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5 2:1\n-1 3:zz\n")
    proc = _cli(5, str(bad))
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"asyncopt-lasso: error: {bad}:2: bad feature '3:zz' "
                     "(expected index:value)"]


@pytest.mark.mpi
def test_cli_under_mpirun_more_workers_than_rows_is_one_line(tmp_path):
    """mpirun -n 5 on a 3-row file: 4 workers cannot each hold a row; rank 0 says so in
    one line, the job exits non-zero and every rank ends."""
    data = _write_libsvm(tmp_path / "tiny.svm", n=3, p=10)
    proc = _cli(5, str(data), "--quiet")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("asyncopt-lasso: error: ")
    assert "more workers (4) than rows (3)" in lines[0] and "Traceback" not in proc.stderr


def _write_libsvm(path, n=300, p=40, seed=0, bad_line=None):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        cols = np.sort(rng.choice(p, 6, replace=False)) + 1          # one-based
        vals = rng.standard_normal(6)
        label = float(vals[:2].sum() + 0.1 * rng.standard_normal())
        lines.append(f"{label:.6f} " + " ".join(f"{c}:{v:.6f}" for c, v in zip(cols, vals)))
    if bad_line is not None:
        lines[bad_line - 1] = "1.0 3:0.5 2:0.1"                   # indices not increasing
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.mpi
def test_cli_workers_read_their_byte_range_and_match_the_serial_run(tmp_path):
    data = _write_libsvm(tmp_path / "d.svm")
    common = ["--quiet", "--tol", "1e-9", "--max-epochs", "2000"]
    # the headline form, mpirun -n 9 asyncopt-lasso --data big.svm
    proc = _cli(4, "--data", str(data), *common, "--save-coef", str(tmp_path / "mpi.npz"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "d.svm: 300 x 40" in proc.stdout
    env = dict(os.environ, PYTHONPATH=ROOT)
    serial = subprocess.run([sys.executable, "-m", "asyncopt.cli.lasso", str(data), *common,
                             "--backend", "serial", "--save-coef", str(tmp_path / "s.npz")],
                            env=env, capture_output=True, text=True, timeout=240)
    assert serial.returncode == 0, serial.stderr[-2000:]
    a, b = np.load(tmp_path / "mpi.npz"), np.load(tmp_path / "s.npz")
    assert float(a["alpha"]) == pytest.approx(float(b["alpha"]), rel=1e-12)   # same lam_max
    np.testing.assert_allclose(a["coef"], b["coef"], rtol=1e-4, atol=1e-6)


@pytest.mark.mpi
def test_a_hostfile_puts_the_server_and_the_workers_on_two_nodes(tmp_path):
    """mpirun -f HOSTFILE as on a cluster (hostfile.example): hydra counts "localhost"
    and "127.0.0.1" as two nodes and starts both here without ssh, rank 0 alone on the
    first. The ranks then share no node, so the inner loop runs on MPI messages (no
    shared-memory window), and the job reaches celer's solution."""
    import celer
    from sklearn.datasets import load_svmlight_file
    data = _write_libsvm(tmp_path / "d.svm")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:2\n")
    env = rank_env()
    proc = subprocess.run([MPIRUN, "-f", str(hosts), "-n", "3", sys.executable, "-m",
                           "asyncopt.cli.lasso", str(data), "--quiet", "--tol", "1e-10",
                           "--output", str(tmp_path / "out.npz"), "--history",
                           str(tmp_path / "h.jsonl")], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mpi (1 server + 2 workers)" in proc.stdout
    history = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert {h["transport"] for h in history} == {"messages"}
    out = np.load(tmp_path / "out.npz")
    X, y = load_svmlight_file(str(data))
    X = X.toarray()
    ref = celer.Lasso(alpha=float(out["alpha"]), tol=1e-14, max_iter=200).fit(X, y)
    np.testing.assert_allclose(out["coef"], ref.coef_, rtol=1e-5, atol=1e-7)
    assert float(out["intercept"]) == pytest.approx(ref.intercept_, rel=1e-6, abs=1e-8)


@pytest.mark.mpi
def test_cli_checkpoint_of_another_alpha_is_one_message(tmp_path):
    """--checkpoint of a run at another alpha: the server refuses it (resuming would carry
    that run's history into this one), one error line for the job, exit 1."""
    data = _write_libsvm(tmp_path / "d.svm")
    checkpoint = str(tmp_path / "run.npz")
    first = _cli(3, str(data), "--quiet", "--alpha-ratio", "0.1", "--checkpoint", checkpoint)
    assert first.returncode == 0, first.stderr[-2000:]
    other = _cli(3, str(data), "--quiet", "--alpha-ratio", "0.05", "--checkpoint", checkpoint)
    assert other.returncode == 1
    lines = [line for line in other.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        f"asyncopt-lasso: error: {checkpoint}: checkpoint of a run at alpha = "), lines


@pytest.mark.mpi
def test_cli_bad_line_in_one_workers_range_is_one_message(tmp_path):
    data = _write_libsvm(tmp_path / "d.svm", bad_line=250)
    proc = _cli(4, str(data))
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"asyncopt-lasso: error: {data}:250:")


def _rank_pid(marker, rank):
    """PID of the process whose command line holds ``marker`` and whose PMI_RANK is rank."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmdline and f"PMI_RANK={rank}".encode() in environ:
            return int(pid)
    return None


@pytest.mark.mpi
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find a worker")
# -n 5 on 2 cores is a crowded node: every wait sleeps on a doorbell (wire.Doorbell)
@pytest.mark.parametrize("ranks", ["3", "5"])
def test_killed_worker_ends_the_job_and_the_checkpoint_resumes(tmp_path, ranks):
    import signal
    import time

    from asyncopt.solvers.checkpoint import load_checkpoint
    data = _write_libsvm(tmp_path / "killed_worker.svm", n=20000, p=120)
    ckpt = tmp_path / "run.npz"
    env = rank_env()
    # prox-SVRG epochs of one step per message keep the job running for seconds (auto's
    # working set, solved on the server, certifies 1e-15 within three outer iterations, a
    # second); the support Newton step can certify even 1e-15 (a gap at rounding level,
    # or 0) within a few tenths of a second once it is taken
    argv = [MPIRUN, "-n", ranks, sys.executable, "-m", "asyncopt.cli.lasso", str(data),
            "--checkpoint", str(ckpt), "--tol", "1e-15", "--max-epochs", "100000",
            "--method", "ddss", "--batch", "1", "--quiet"]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.time() + 60
        records = []
        while len(records) < 3 and time.time() < deadline:
            time.sleep(0.05)
            try:
                records = load_checkpoint(str(ckpt), 120)[3]
            except (OSError, ValueError):
                pass
        worker = _rank_pid("killed_worker.svm", 1)
        assert len(records) >= 3 and worker is not None
        os.kill(worker, signal.SIGKILL)
        # the job ends: the other ranks do not wait for the dead one past the timeout
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert "BAD TERMINATION" in out + err          # mpirun names the dead process
    coef, _, _, history = load_checkpoint(str(ckpt), 120)       # intact, readable
    assert len(history) >= 3
    argv[argv.index("1e-15")] = "1e-8"
    resumed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "NOT reached" not in resumed.stdout
    after = load_checkpoint(str(ckpt), 120)[3]
    assert after[:len(history)] == history and after[-1]["rel_gap"] <= 1e-8


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", ["3", "5"])
def test_sigterm_checkpoints_the_servers_current_x_mid_epoch(tmp_path, ranks):
    import signal
    import time


    from asyncopt.solvers.checkpoint import load_checkpoint
    data = _write_libsvm(tmp_path / "sigterm.svm", n=120000, p=120)
    ckpt = tmp_path / "run.npz"
    env = rank_env()
    # one step per message: the first epoch takes 120,000 round trips (2.9-4.4 s on 2
    # cores), so the signal, 1 s after the epoch-0 checkpoint (x = 0), lands inside it
    # and before epoch 1's. With 0.3 s the test failed twice in ~150 runs of the whole
    # file and never alone (the assertion unseen); a busy machine can hold back the first
    # deltas that long, and 1 s keeps well inside the epoch
    argv = [MPIRUN, "-n", ranks, sys.executable, "-m", "asyncopt.cli.lasso", str(data),
            "--checkpoint", str(ckpt), "--batch", "1", "--quiet", "--method", "ddss"]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.time() + 60
        while not ckpt.exists() and time.time() < deadline:
            time.sleep(0.1)
        first = load_checkpoint(str(ckpt), 120)
        assert len(first[3]) == 1 and not np.any(first[0]), \
            (len(first[3]), np.count_nonzero(first[0]))
        time.sleep(1.0)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    # what the job said, in any failure below (this test failed once in ~100 runs, unseen)
    said = f"rc {job.returncode}: " + (out + err)[-2000:]
    assert job.returncode != 0, said
    assert "Traceback" not in out + err, said
    assert err.count(f"terminated; the checkpoint {ckpt} holds the server's x") == 1, said
    coef, _, _, history = load_checkpoint(str(ckpt), 120)
    assert len(history) == 1 and np.count_nonzero(coef) > 0, \
        (len(history), np.count_nonzero(coef), said)       # mid-epoch x, not x = 0
    argv[argv.index("--batch"):argv.index("--batch") + 2] = ["--tol", "1e-8"]
    resumed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "NOT reached" not in resumed.stdout
    after = load_checkpoint(str(ckpt), 120)[3]
    assert after[:1] == history and after[-1]["rel_gap"] <= 1e-8


@pytest.mark.mpi
def test_ctrl_c_under_mpirun_is_one_message(tmp_path):
    """Ctrl-C on mpirun, which sends it to every rank: one "interrupted" line (rank 0's),
    exit status 130, every rank ended within seconds."""
    import signal
    import time
    data = _write_libsvm(tmp_path / "interrupt.svm", n=120000, p=120)
    ckpt = tmp_path / "run.npz"
    env = rank_env()
    argv = [MPIRUN, "-n", "3", sys.executable, "-m", "asyncopt.cli.lasso", str(data),
            "--checkpoint", str(ckpt), "--batch", "1", "--quiet", "--method", "ddss"]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.time() + 60
        while not ckpt.exists() and time.time() < deadline:       # the solve has begun
            time.sleep(0.1)
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=30)       # every rank ends: no wait for one
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130, (job.returncode, err)
    assert (out + err).count("interrupted") == 1, out + err


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks, route", [(2, "auto"), (4, "auto"), (2, "mpi"),
                                            (4, "messages")])
def test_root_centred_and_window_collectives_match_mpis(tmp_path, n_ranks, route):
    """The point-to-point collectives a Wire uses on an oversubscribed node
    (comm/wire.py), and those through the inner loop's shared-memory window
    (channels.SharedCollectives; a reduction of a vector longer than the window's
    capacity goes through it in pieces on an oversubscribed node, -n 4 on 2 cores),
    against MPI's Ibcast / Ireduce / Iallreduce: the same values on every rank (sums to
    1e-12, as the order of additions differs; the window's and the root-centred sums in
    the same order, bit for bit) and the same byte counts. A reduction onto a blank
    root (``root_blank``; its buffer full of NaN) sums the workers' vectors alone, into
    the root's buffer. So on every route of a reduction that does not go root-centred
    (ASYNCOPT_MPI_REDUCE: MPI's for one worker too, messages for three)."""
    out = tmp_path / "wire.json"
    env = rank_env(ASYNCOPT_MPI_REDUCE=route)
    proc = subprocess.run([MPIRUN, "-n", str(n_ranks), sys.executable,
                           os.path.join(os.path.dirname(SCRIPT), "wire_collectives.py"),
                           str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = json.loads(out.read_text())["ranks"]
    assert len(ranks) == n_ranks
    expected = np.array(ranks[0]["tree"]["expected_sum"])
    for rank, modes in enumerate(ranks):
        tree, centred, window = modes["tree"], modes["root_centred"], modes["window"]
        for mode in (tree, centred, window):
            assert mode["bcast"] == [3.5 * k for k in range(7)] and mode["bcast_long"]
            np.testing.assert_allclose(mode["allreduce_sum"], expected, rtol=0, atol=1e-12)
            np.testing.assert_allclose(mode["allreduce_sum_short"], expected[:600], rtol=0,
                                       atol=1e-12)
            assert mode["allreduce_max"] == [n_ranks - 1.0, 0.0]
            assert (mode["sent"], mode["received"]) == (tree["sent"], tree["received"])
            if rank == 0:
                np.testing.assert_allclose(mode["reduce"], expected, rtol=0, atol=1e-12)
                summed, into_own = mode["reduce_blank_root"]
                np.testing.assert_allclose(summed, modes["tree"]["expected_workers_sum"],
                                           rtol=0, atol=1e-12)
                assert into_own
                first, second = mode["reduce_twice"]
                np.testing.assert_allclose(first, expected[:600], rtol=0, atol=1e-12)
                np.testing.assert_allclose(second, 2.0 * expected[:500], rtol=0,
                                           atol=1e-12)
            else:
                assert mode["reduce"] is None and mode["reduce_twice"] is None
                assert mode["reduce_blank_root"] is None
        assert window["fits"] == [True, False]
        assert window["allreduce_sum_short"] == centred["allreduce_sum_short"]
        if window["oversubscribed"] and rank == 0:       # the long one, in pieces
            assert window["reduce"] == centred["reduce"]
        if rank == 0:
            assert window["reduce_twice"] == centred["reduce_twice"]


class _RootComm:
    """Rank 0 of a communicator of ``size`` ranks, as a Wire's constructor sees it: its
    allreduce (of the agreement word, over MAX) returns the larger of this rank's word
    and the other ranks', whose level is ``other`` and route ``route`` (an index of
    REDUCE_ROUTES), or, given ``words``, the next of those words at each call; ``seen``
    records the ops. Its node (``Split_type``) holds the other ranks' affinity masks
    ``node_masks`` (lists of CPU ids; ``node_load`` adds their loads to this rank's)."""

    def __init__(self, size, other=0, route=0, words=None, node_masks=()):
        from asyncopt.comm.wire import agreement_word
        self.size, self.other, self.seen = size, agreement_word(other, route), []
        self.words, self.node_masks, self.nodes = list(words or []), node_masks, []

    def Get_rank(self):
        return 0

    def Get_size(self):
        return self.size

    def allreduce(self, value, op=None):
        self.seen.append(op)
        return max(value, self.words.pop(0) if self.words else self.other)

    def Split_type(self, split_type, key=0):
        node = _NodeComm(self.node_masks)
        self.nodes.append(node)
        return node


class _NodeComm:
    """The node of a ``_RootComm``: Allreduce(IN_PLACE, load, SUM) adds the other ranks'
    loads (1 / |mask| on each CPU of a mask) to ``load``."""

    def __init__(self, masks):
        self.masks, self.freed = [list(mask) for mask in masks], False

    def Allreduce(self, sendbuf, recvbuf, op=None):
        for mask in self.masks:
            recvbuf[mask] += 1.0 / len(mask)

    def Get_size(self):
        return 1 + len(self.masks)

    def Free(self):
        self.freed = True


def test_ranks_bound_to_a_core_each_count_the_cores_of_their_node(monkeypatch):
    """A launcher that binds each rank to one core (mpirun -bind-to core, srun
    --cpu-bind=cores) leaves each rank one CPU in its affinity mask: the Wire sums what
    each CPU of the node carries (node_load: a rank spread evenly over its mask), so 4
    ranks bound to 4 CPUs have a core each; a fifth bound to one of them makes 2 on that
    core (crowded), ranks spread over two CPUs 1.5 (oversubscribed); the node's CPUs are
    the union of the masks; the node communicator is freed, and the ranks agree twice
    (any bound rank first). Unbound, no node communicator is made."""
    from mpi4py import MPI
    from asyncopt.comm.wire import Wire, agreement_word

    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    for masks, oversubscribed, crowded in (([[1], [2], [3]], False, False),
                                           ([[1], [2], [3], [0]], True, True),
                                           ([[1, 2], [1, 2], [3]], False, False),
                                           ([[1, 2], [1, 2], [1, 2], [3]], True, False)):
        monkeypatch.setenv("MPI_LOCALNRANKS", str(1 + len(masks)))
        # the other ranks: bound too (each sees one or two cores: crowded), then the
        # level of the node's load (this rank's)
        level = int(oversubscribed) + int(crowded)
        comm = _RootComm(1 + len(masks), node_masks=masks,
                         words=[agreement_word(2, 0, True), agreement_word(level, 0)])
        link = Wire(comm)
        assert (link.oversubscribed, link.crowded, link.node_cores) == \
            (oversubscribed, crowded, 4)
        assert comm.seen == [MPI.MAX, MPI.MAX] and [n.freed for n in comm.nodes] == [True]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")
    comm = _RootComm(4, node_masks=[[1], [2], [3]])
    link = Wire(comm)
    assert not link.oversubscribed and comm.nodes == [] and comm.seen == [MPI.MAX]


def test_oversubscription_is_read_from_the_launchers_rank_count(monkeypatch):
    """More ranks on the node than this process has cores: root-centred collectives."""
    from asyncopt.comm.wire import Wire
    from asyncopt.runtime import available_cores

    cores = available_cores()
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", str(cores + 1))
    assert Wire(_RootComm(1)).oversubscribed
    monkeypatch.setenv("MPI_LOCALNRANKS", str(cores))
    assert not Wire(_RootComm(1)).oversubscribed
    monkeypatch.delenv("MPI_LOCALNRANKS")
    assert not Wire(_RootComm(1)).oversubscribed      # one rank: the communicator's size
    assert Wire(_RootComm(1), oversubscribed=True).oversubscribed


def test_a_node_with_two_ranks_per_core_is_crowded(monkeypatch):
    """Wire.crowded (doorbells and no spin in Dis-DDSS's window): at least
    CROWDED_RANKS_PER_CORE ranks per core on some node, agreed over the communicator with
    the oversubscription flag in one MAX (level 2 crowded, 1 oversubscribed)."""
    from mpi4py import MPI
    from asyncopt.comm.wire import CROWDED_RANKS_PER_CORE, Wire
    from asyncopt.runtime import available_cores

    cores = available_cores()
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    for ranks, oversubscribed, crowded in ((cores, False, False),
                                           (cores + 1, True,
                                            cores + 1 >= CROWDED_RANKS_PER_CORE * cores),
                                           (CROWDED_RANKS_PER_CORE * cores, True, True)):
        monkeypatch.setenv("MPI_LOCALNRANKS", str(ranks))
        link = Wire(_RootComm(1))
        assert (link.oversubscribed, link.crowded) == (oversubscribed, crowded)
    monkeypatch.setenv("MPI_LOCALNRANKS", str(cores))              # this node: room
    comm = _RootComm(2, other=2)                                   # another: crowded
    link = Wire(comm)
    assert link.oversubscribed and link.crowded and comm.seen == [MPI.MAX]
    link = Wire(_RootComm(2, other=1))
    assert link.oversubscribed and not link.crowded
    assert Wire(_RootComm(1), oversubscribed=True).crowded        # given: as oversubscribed


@pytest.mark.skipif(not __import__("asyncopt.comm.wire", fromlist=["Doorbell"])
                    .Doorbell.available, reason="futex doorbells: Linux on x86-64")
def test_a_doorbell_wakes_its_sleeper_when_rung_and_only_then():
    """wire.Doorbell: a wait on an unchanged word lasts its timeout; one on a word that
    changed since it was read returns without sleeping; a ring from another thread ends
    a sleep, which does not end before the ring; and poll with the doorbell returns once
    ready() holds, having slept between checks instead of spinning. Every wait that must
    not sleep its timeout has one of 30 s and ends well within half of it."""
    import threading
    from asyncopt.comm import wire

    word = np.zeros(1, dtype=np.int32)
    bell = wire.Doorbell(word, timeout=0.05)
    start = time.perf_counter()
    bell.wait(bell.value())                     # unchanged: sleeps its timeout
    assert time.perf_counter() - start >= 0.04

    slow = wire.Doorbell(word, timeout=30.0)
    seen = slow.value()
    slow.ring()
    assert slow.value() == seen + 1
    start = time.perf_counter()
    slow.wait(seen)                             # rung since it was read: no sleep
    assert time.perf_counter() - start < 15.0

    asleep, woke, rung = threading.Event(), [], []

    def sleeper():
        value = slow.value()
        asleep.set()
        slow.wait(value)
        woke.append(time.perf_counter())

    thread = threading.Thread(target=sleeper)
    thread.start()
    assert asleep.wait(10)
    time.sleep(0.1)
    assert not woke                             # still asleep: nothing rang
    rung.append(time.perf_counter())
    slow.ring()
    thread.join(timeout=20)
    assert woke and rung[0] <= woke[0] < rung[0] + 15.0     # the ring, not the timeout

    flag, checks = [False], [0]

    def ready():
        checks[0] += 1
        return flag[0]

    def poster():
        time.sleep(0.1)
        flag[0] = True
        slow.ring()

    thread = threading.Thread(target=poster)
    thread.start()
    start = time.perf_counter()
    wire.poll(ready, spin=0.0, doorbell=slow)
    thread.join()
    # a spin would check thousands of times in 0.1 s; a lost ring would sleep 30 s
    assert flag[0] and checks[0] <= 4 and time.perf_counter() - start < 15.0


def test_every_rank_agrees_on_root_centred_collectives(monkeypatch):
    """A job across machines can put more ranks than cores on one node only: a rank there
    and a rank on a roomy node must still pick the same collectives (root-centred sends
    never meet an Ibcast), so the flag is the MAX over the communicator."""
    from mpi4py import MPI
    from asyncopt.comm.wire import Wire
    from asyncopt.runtime import available_cores

    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", str(available_cores()))     # this node: room
    comm = _RootComm(2, other=1)
    assert Wire(comm).oversubscribed and comm.seen == [MPI.MAX]
    assert not Wire(_RootComm(2, other=0)).oversubscribed
    monkeypatch.setenv("MPI_LOCALNRANKS", str(available_cores() + 1))  # this node: full
    assert Wire(_RootComm(2, other=0)).oversubscribed


def test_the_newton_steps_cg_asks_the_workers_only_across_machines(monkeypatch):
    """On one node (the launcher, or else the node communicator, counts every rank of
    the job here) the L1 step takes the workers' Hessian shares once and runs its CG on
    the server: a product's round costs more than the bytes. Across machines, products
    above 398 coordinates (uses_hessian_free), where they send fewer bytes than the
    shares."""
    from asyncopt.newton.policy import MIN_PRODUCTS
    from asyncopt.solvers.mpi.newton import cg_products_from_shares
    from asyncopt.comm.wire import Wire

    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", "9")
    one_node, two_nodes = Wire(_RootComm(9)), Wire(_RootComm(17))
    assert one_node.one_node and not two_nodes.one_node
    # MIN_PRODUCTS products of 2 (|S| + 1) numbers against (|S| + 1)(|S| + 2) / 2
    bound = 4 * MIN_PRODUCTS - 2
    assert not cg_products_from_shares(one_node, bound)
    assert not cg_products_from_shares(one_node, 4 * bound)
    assert not cg_products_from_shares(two_nodes, bound)
    assert cg_products_from_shares(two_nodes, bound + 1)
    # no launcher count (srun with PMI): the node communicator counts the ranks here
    monkeypatch.delenv("MPI_LOCALNRANKS")
    assert Wire(_RootComm(9, node_masks=[[0]] * 8)).one_node
    across = Wire(_RootComm(17, node_masks=[[0]] * 7))
    assert not across.one_node and across.local_ranks == 8


def test_popular_zeros_enter_the_step_only_where_the_hessian_is_summed(monkeypatch):
    """The server lets the popular zeros (the largest columns) enter S where the step
    reduces the workers' Hessian shares; where S with them would ask for products
    (across machines, above 398 coordinates) it enters the violating zeros alone."""
    from asyncopt.solvers.mpi.newton import server_entering_coordinates
    from asyncopt.comm.wire import Wire

    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", "9")
    one_node, two_nodes = Wire(_RootComm(9)), Wire(_RootComm(17))
    p = 2_000
    x = np.zeros(p)
    x[np.arange(0, 2 * 380, 2)] = 1.0                   # 380 non-zeros, no violating zero
    column_sq = np.where(x != 0, 10.0, 1.0)
    column_sq[[1, 3, 5]] = 50.0                         # 3 popular zeros
    correlation = np.zeros(p)
    args = (x, correlation, 1, 1.0, np.ones(p))
    np.testing.assert_array_equal(server_entering_coordinates(one_node, *args, column_sq),
                                  [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(server_entering_coordinates(two_nodes, *args, column_sq),
                                  [2.0, 4.0, 6.0])           # 383 coordinates: the sum
    x[np.arange(1000, 1040)] = 1.0                      # 420: products across machines
    column_sq[1000:1040] = 10.0
    assert server_entering_coordinates(two_nodes, *args, column_sq).size == 0
    assert server_entering_coordinates(one_node, *args, column_sq).size == 3
    assert server_entering_coordinates(one_node, *args, None).size == 0


def _wire_flags(folder, n_ranks, mpirun_args=(), command_prefix=()):
    """[mask size, oversubscribed, crowded, node_cores, local_ranks, one_node] of a Wire
    on each rank of ``mpirun [mpirun_args] -n n_ranks [command_prefix] python``."""
    code = ("import json, os, sys; from mpi4py import MPI; from asyncopt.comm.wire "
            "import Wire; w = Wire(MPI.COMM_WORLD); open(os.path.join(sys.argv[1], "
            "'%d.json' % w.rank), 'w').write(json.dumps([len(os.sched_getaffinity(0)), "
            "w.oversubscribed, w.crowded, w.node_cores, w.local_ranks, w.one_node]))")
    folder.mkdir()
    proc = subprocess.run([MPIRUN, *mpirun_args, "-n", str(n_ranks), *command_prefix,
                           sys.executable, "-c", code, str(folder)], env=rank_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads((folder / f"{rank}.json").read_text()) for rank in range(n_ranks)]


@pytest.mark.mpi
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores")
def test_mpirun_bind_to_core_leaves_a_core_per_rank_uncrowded(tmp_path):
    """mpirun -bind-to core -n 2: each rank's affinity mask holds one CPU, and the Wire
    finds a core per rank (not oversubscribed, not crowded; before, each rank saw one
    core, and 2 ranks per core made the node crowded); -n 3 on 2 cores: the third rank
    is bound to a core that carries another, 2 ranks there (crowded)."""
    seen = {n_ranks: _wire_flags(tmp_path / str(n_ranks), n_ranks, ("-bind-to", "core"))
            for n_ranks in (2, 3)}
    if any(flags[0] != 1 for flags in seen[2]):
        pytest.skip("this mpirun did not bind each rank to one core")
    assert all(flags == [1, False, False, 2, 2, True] for flags in seen[2])
    assert all(flags[1:] == [True, True, 2, 3, True] for flags in seen[3])


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("env") is None or (os.cpu_count() or 1) != 2,
                    reason="needs env and exactly 2 cores")
def test_ranks_with_no_launcher_count_count_their_node(tmp_path):
    """A launcher that gives no count of a node's ranks (srun with PMI; here hydra's
    MPI_LOCALNRANKS removed with env -u): the Wire counts them on the node communicator
    under a real launcher, so -n 2 on 2 cores has a core per rank and -n 3 is
    oversubscribed, one node both. (On one machine the old fallback, the communicator's
    size, agrees; test_the_newton_steps_cg_asks_the_workers_only_across_machines covers
    two machines on a fake node.)"""
    unset = ("env", "-u", "MPI_LOCALNRANKS", "-u", "OMPI_COMM_WORLD_LOCAL_SIZE")
    for n_ranks, over in ((2, False), (3, True)):
        for flags in _wire_flags(tmp_path / str(n_ranks), n_ranks, (), unset):
            assert flags[1:] == [over, False, 2, n_ranks, True]


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("env") is None or (os.cpu_count() or 1) < 2,
                    reason="needs env and 2 cores")
def test_a_job_whose_ranks_see_different_room_still_runs(tmp_path):
    """mpirun -n 1 env MPI_LOCALNRANKS=3 ... : -n 1 ...: the server counts 3 ranks on
    its node's 2 cores (oversubscribed), the worker 2 (not), as on two machines of a
    hostfile. Before the ranks agreed on the flag, the server's root-centred sends never
    met the worker's Ibcast and the job hung."""
    out = tmp_path / "result.json"
    env = rank_env()
    command = [sys.executable, SCRIPT, str(out), "squared", "ddss", "1"]
    proc = subprocess.run([MPIRUN, "-n", "1", "env", "MPI_LOCALNRANKS=3", *command, ":",
                           "-n", "1", *command], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["converged"]
    assert abs(result["objective"] - result["serial_objective"]) <= \
        1e-6 * abs(result["serial_objective"])


def test_a_wait_gives_its_core_away_between_checks_then_sleeps(monkeypatch):
    """wire.poll: within the spin every check that finds nothing is followed by a
    sched_yield (a waiting rank leaves its core to one that computes there), the checks
    after the spin by sleeps, each double the one before up to MAX_PAUSE, and the wait
    ends at the first check that finds the message (every wait of a Wire is such a poll
    with the Wire's ``spin``, SPIN_SECONDS unless a protocol sets it)."""
    from asyncopt.comm import wire

    calls = []
    monkeypatch.setattr(wire.os, "sched_yield", lambda: calls.append("yield"))
    monkeypatch.setattr(wire.time, "sleep", lambda seconds: calls.append(seconds))

    def ready_after(checks):
        count = [0]

        def ready():
            count[0] += 1
            calls.append("check")
            return count[0] > checks
        return ready

    wire.poll(ready_after(3), spin=60.0)
    assert calls == ["check", "yield"] * 3 + ["check"]
    calls.clear()
    wire.poll(ready_after(40), spin=0.0)
    sleeps = [c for c in calls if c != "check"]
    assert "yield" not in calls and len(sleeps) == 40
    assert calls[::2] == ["check"] * 41 and calls[1::2] == sleeps   # one between checks
    # each pause doubles the one before up to MAX_PAUSE, then stays there
    assert 0.0 < sleeps[0] < wire.MAX_PAUSE
    np.testing.assert_allclose(sleeps[1:], np.minimum(2.0 * np.array(sleeps[:-1]),
                                                      wire.MAX_PAUSE), rtol=1e-12)
    assert sleeps[-1] == wire.MAX_PAUSE


class _LateRequest:
    """A nonblocking request that completes at its ``checks + 1``-th Test."""

    def __init__(self, checks):
        self.left = checks

    def Test(self):
        self.left -= 1
        return self.left < 0


class _LateComm(_RootComm):
    def Irecv(self, buf, source, tag):
        return _LateRequest(3)


def test_a_wires_waits_spin_as_long_as_its_spin_says(monkeypatch):
    """Wire.spin sets how every wait of the Wire spins (Dis-DDSS's server on an
    oversubscribed node sets 0: it sleeps from the first check and never yields)."""
    from asyncopt.comm import wire

    calls = []
    monkeypatch.setattr(wire.os, "sched_yield", lambda: calls.append("yield"))
    monkeypatch.setattr(wire.time, "sleep", lambda seconds: calls.append("sleep"))
    link = wire.Wire(_LateComm(1), oversubscribed=True)
    assert link.spin == wire.SPIN_SECONDS
    link.spin = 60.0
    link.recv(np.zeros(3), source=0, tag=5)
    assert calls == ["yield"] * 3
    calls.clear()
    link.spin = 0.0
    link.recv(np.zeros(3), source=0, tag=5)
    assert calls == ["sleep"] * 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's timer slack")
def test_a_wire_makes_its_process_sleeps_fine():
    """Constructing a Wire sets the process's timer slack to 1 us (prctl): a wait that
    sleeps wakes up to 50 us sooner."""
    import ctypes
    from asyncopt import runtime
    from asyncopt.comm import wire

    wire.Wire(_RootComm(1), oversubscribed=False)
    assert ctypes.CDLL(None).prctl(30, 0, 0, 0, 0) == runtime.TIMER_SLACK_NS    # GET


def test_reduce_route_is_read_and_agreed(monkeypatch):
    """ASYNCOPT_MPI_REDUCE: auto, mpi or messages (ValueError else); the ranks agree on
    one route in the constructor's MAX, the oversubscription level first."""
    from asyncopt.comm.wire import Wire, reduce_route_from_env
    from asyncopt.runtime import available_cores
    monkeypatch.delenv("ASYNCOPT_MPI_REDUCE", raising=False)
    assert reduce_route_from_env() == "auto"
    monkeypatch.setenv("ASYNCOPT_MPI_REDUCE", " Messages ")
    assert reduce_route_from_env() == "messages"
    with pytest.raises(ValueError, match="unknown MPI reduction route 'bogus'"):
        reduce_route_from_env("bogus")
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", str(available_cores()))
    monkeypatch.setenv("ASYNCOPT_MPI_REDUCE", "auto")
    link = Wire(_RootComm(2, other=0, route=2))              # another rank: messages
    assert link.reduce_route == "messages" and not link.oversubscribed
    link = Wire(_RootComm(2, other=1, route=0))              # another: oversubscribed
    assert link.reduce_route == "auto" and link.oversubscribed
    monkeypatch.setenv("ASYNCOPT_MPI_REDUCE", "mpi")
    assert Wire(_RootComm(2, other=0, route=0)).reduce_route == "mpi"


def test_transport_is_auto_shared_or_messages(monkeypatch):
    from asyncopt.comm.channels import transport_from_env
    monkeypatch.delenv("ASYNCOPT_MPI_TRANSPORT", raising=False)
    assert transport_from_env() == "auto"
    monkeypatch.setenv("ASYNCOPT_MPI_TRANSPORT", " Messages ")
    assert transport_from_env() == "messages"
    assert transport_from_env("shared") == "shared"          # the keyword wins
    with pytest.raises(ValueError, match="unknown MPI transport 'bogus'"):
        transport_from_env("bogus")


def test_shared_slots_hold_a_whole_active_set_on_separate_cache_lines():
    """Each worker's five buffers (delta values with header, delta indices, reply values
    with header, reply indices, its vector for a reduction with header) start on a
    64-byte boundary and hold ``capacity`` coordinates: a full reply is the whole x."""
    from asyncopt.comm.channels import _SharedSlots
    capacity, header, reply_header = 1001, 4, 4
    sizes = _SharedSlots.layout(capacity, header, reply_header)
    assert all(size % 64 == 0 for size in sizes)
    memory = np.zeros(sum(sizes), dtype=np.uint8)
    slots = _SharedSlots(memory, capacity, header, reply_header)
    assert slots.delta_values.shape == (header + capacity,)
    assert slots.reply_values.shape == (reply_header + capacity,)
    assert slots.summand.shape == (header + capacity,)
    assert slots.delta_index.shape == slots.reply_index.shape == (capacity,)
    views = [slots.delta_values, slots.delta_index, slots.reply_values, slots.reply_index,
             slots.summand]
    for value, view in enumerate(views, start=1):
        view[...] = value
        assert (view.ctypes.data - memory.ctypes.data) % 64 == 0
    # no buffer overlaps another
    assert [np.all(view == value) for value, view in enumerate(views, start=1)] == [True] * 5
