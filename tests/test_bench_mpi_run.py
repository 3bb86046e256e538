"""benchmarks/_mpi_run.py under mpirun, the SPMD script every Dis-DDSS figure of
bench_distributed and bench_speedup comes from: its warm-up (which builds the support
Newton step's SupportRows on a tiny problem) and its timed solve, on prepared shards,
reach celer's optimum. Its warm-up broke once with a change of SupportRows' signature and
no test noticed; the benchmark runs did."""
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._mpi_run import launch  # noqa: E402
from benchmarks.bench_serial import load_data  # noqa: E402

celer = pytest.importorskip("celer")


def celer_objective(X, y, loss, lam, fit_intercept, group_size=1):
    """P* = (1/n) sum_i f(a_i^T x + b) + lam Omega(x) at celer's solution (tol 1e-14):
    Lasso(alpha = lam) minimises exactly this with Omega = ||.||_1, GroupLasso with the
    group norms weighted by sqrt(|g|) (``GroupL1``'s default); LogisticRegression(C)
    minimises sum_i log(1 + exp(-y_i a_i^T x)) + ||x||_1 / C, n P with C = 1 / (n lam)."""
    n = X.shape[0]
    if group_size > 1:
        from asyncopt.penalties import GroupL1
        penalty = GroupL1(X.shape[1], group_size)
        model = celer.GroupLasso(groups=group_size, alpha=lam, fit_intercept=fit_intercept,
                                 weights=penalty.weights, tol=1e-14, max_iter=200).fit(X, y)
        z = X @ model.coef_ + model.intercept_
        return 0.5 * np.mean((z - y) ** 2) + lam * penalty.value(model.coef_)
    if loss == "squared":
        model = celer.Lasso(alpha=lam, fit_intercept=fit_intercept, tol=1e-14,
                            max_iter=200).fit(X, y)
        z = X @ model.coef_ + model.intercept_
        smooth = 0.5 * np.mean((z - y) ** 2)
    else:
        model = celer.LogisticRegression(C=1.0 / (n * lam), fit_intercept=False, tol=1e-14,
                                         max_iter=200).fit(X, y)
        z = X @ model.coef_.ravel()
        smooth = np.mean(np.logaddexp(0.0, -y * z))
    return smooth + lam * np.abs(model.coef_).sum()


@pytest.mark.mpi
@pytest.mark.parametrize("data,loss,lam_ratio,fit_intercept,group_size", [
    ("ctr_small", "squared", 0.05, True, 1),
    ("a9a_d2_small", "logistic", 0.05, False, 1),
    ("ctr_small", "squared", 0.05, True, 5)])
def test_the_benchmark_script_reaches_celers_objective_on_prepared_shards(
        tmp_path, data, loss, lam_ratio, fit_intercept, group_size):
    payload, wall, error = launch(
        3, str(tmp_path / "run.json"), data=data, loss=loss, lam_ratio=lam_ratio,
        fit_intercept=fit_intercept, method="ddss", tol=1e-9, max_time=60, timeout=240,
        shard_root=str(tmp_path / "shards"), extra_args=["--group-size", str(group_size)])
    assert error is None, error
    assert payload["converged"] and payload["flags"]["support_newton"]
    assert payload["group_size"] == group_size
    X, y = load_data(data)
    assert (payload["n_samples"], payload["n_features"], payload["nnz"]) == \
        (X.shape[0], X.shape[1], X.nnz)
    # the server holds no rows, each worker its half of them
    ranks = sorted(payload["ranks"], key=lambda r: r["rank"])
    assert [r["rows"] for r in ranks] == [0, X.shape[0] // 2, X.shape[0] - X.shape[0] // 2]
    assert all(r["warm_up_s"] > 0 and r["solve_s"] > 0 for r in ranks)
    reference = celer_objective(X, y, loss, payload["lam"], fit_intercept, group_size)
    assert abs(payload["primal"] - reference) <= 1e-7 * reference
    history = payload["history"]
    assert history[-1]["rel_gap"] <= 1e-9
    assert history[-1]["primal"] == payload["primal"]
    # the support Newton step over the shards (newton/group_model.py for groups of 5)
    assert any(h["newton_step"] > 0 for h in history)
    # each record's phase seconds: the inner loop and the Newton step since the last
    # record (one outer iteration: an epoch, then the step where the watch took one),
    # where there was one, and the certificates, all within that span
    for before, record in zip(history, history[1:]):
        ran_inner = record["inner_steps"] > before["inner_steps"]
        assert (record["inner_s"] > 0) == ran_inner
        assert record["newton_s"] > 0 or record["newton_step"] == 0
        assert 0 < record["certificate_s"] and record["inner_s"] + record["newton_s"] + \
            record["certificate_s"] <= record["time"] - before["time"]
    assert history[0]["inner_s"] == history[0]["newton_s"] == 0.0


@pytest.mark.mpi
def test_bench_wire_times_every_way_of_waiting(tmp_path):
    """benchmarks/bench_wire.py runs its SPMD side under mpirun for each way of waiting
    and writes one result per (ranks, mode) with every pattern timed (the Hessian sum on
    both routes)."""
    import json
    from benchmarks import bench_wire
    out = tmp_path / "wire.json"
    bench_wire.main(["--ranks", "2", "--rounds", "12", "--repeat", "1", "--support", "40",
                     "--features", "500", "--hessian-support", "30", "--output", str(out)])
    payload = json.loads(out.read_text())
    assert [(r["ranks"], r["mode"]) for r in payload["results"]] == \
        [(2, mode) for mode in bench_wire.MODES]
    for result in payload["results"]:
        for pattern in ("cg_product", "certificate", "hessian_sum_mpi",
                        "hessian_sum_messages"):
            assert result[pattern]["ms_per_round"] > 0
            assert result[pattern]["ms_per_round"] == min(result[pattern]["blocks_ms"])


@pytest.mark.mpi
def test_bench_paired_runs_each_tree_on_its_own_asyncopt(tmp_path):
    """benchmarks/bench_paired.py: one pair of solves, the base being this checkout
    reached through another path; each run imports asyncopt from its own tree (the base
    first on PYTHONPATH), both reach the target, and the ratio is base / this."""
    import json
    from benchmarks.bench_paired import main
    tree = tmp_path / "tree"
    tree.symlink_to(ROOT, target_is_directory=True)
    out = tmp_path / "paired.json"
    assert main(["--base", str(tree), "--ranks", "2", "--seeds", "3", "--data", "ctr_small",
                 "--lam-ratio", "0.05", "--tol", "1e-6", "--time-cap", "30",
                 "--shards", str(tmp_path / "shards"), "--output", str(out)]) == 0
    payload = json.load(open(out))
    assert payload["trees"]["base"]["path"] == str(tree)
    (result,) = payload["results"]
    (pair,) = result["pairs"]
    assert pair["order"] == ["base", "this"]
    assert pair["base"]["source"] == os.path.join(str(tree), "asyncopt")
    assert pair["this"]["source"] == os.path.join(ROOT, "asyncopt")
    for label in ("base", "this"):
        assert pair[label]["converged"] and pair[label]["rel_gap"] <= 1e-6
    assert result["median_ratio"] == pytest.approx(
        pair["base"]["solve_s"] / pair["this"]["solve_s"])


@pytest.mark.mpi
def test_bench_timeline_times_every_ranks_kernels_and_waits(tmp_path):
    """benchmarks/bench_timeline.py on mpirun -n 3: the server's record holds its inner
    loops and waits, each worker's its SVRG batches (inside its inner loops), its
    certificate passes and its waits; no inclusive total exceeds the solve, the waits
    at the inner loops' ends lie within the worker's waits, and no CPU time exceeds the
    wall time it was spent in."""
    import json
    from benchmarks.bench_timeline import main
    out = tmp_path / "timeline.json"
    assert main(["--ranks", "3", "--data", "ctr_small", "--lam-ratio", "0.05", "--seed", "2",
                 "--shards", str(tmp_path / "shards"), "--output", str(out)]) == 0
    payload = json.load(open(out))
    assert payload["history"][-1]["rel_gap"] <= 1e-6
    rows = {row["rank"]: row for row in payload["per_rank"]}
    assert sorted(rows) == [0, 1, 2]
    assert {"serve_epoch", "wait"} <= set(rows[0]["totals_ms"])
    for rank in (1, 2):
        totals = rows[rank]["totals_ms"]
        assert {"svrg_epoch_l1", "csr_rmatvec", "margins", "work_epoch", "wait"} <= set(totals)
        assert totals["svrg_epoch_l1"] < totals["work_epoch"]
        assert 0.0 <= rows[rank]["inner_end_wait_ms"] <= totals["wait"]
    for row in rows.values():
        assert max(row["totals_ms"].values()) <= row["solve_ms"] * 1.01
        assert all(0.0 <= a <= z for _, a, z in row["events"])
        # one thread a rank: the CPU a name took is within its wall time, the rank's
        # within the solve's, and the waits' within the rank's
        for name, cpu in row["cpu_totals_ms"].items():
            assert 0.0 <= cpu <= row["totals_ms"][name] * 1.05 + 1.0
        assert 0.0 < row["cpu_ms"] <= row["solve_ms"] * 1.05 + 1.0
        assert row["cpu_totals_ms"]["wait"] <= row["cpu_ms"]
    assert payload["cpu_ms"] == pytest.approx(sum(row["cpu_ms"] for row in rows.values()))
    assert 0.0 < payload["wait_cpu_ms"] < payload["cpu_ms"]
    for row in rows.values():
        assert 0.0 <= row["system_ms"] <= row["cpu_ms"] + 1.0
    # every timed call noted a CPU of this machine, and the placement names each rank's
    for row in rows.values():
        assert sum(count for _, count in row["cpus"]) == len(row["events"])
        assert all(0 <= cpu < os.cpu_count() for cpu, _ in row["cpus"])
    assert [rank for rank, _, _ in payload["placement"]["ranks"]] == [0, 1, 2]
    idle = payload["idle"]
    span = max(row["solve_ms"] for row in rows.values()) * min(payload["cores"], 3)
    assert 0.0 <= idle["idle_core_ms"] <= span * 1.01
    assert sum(ms for _, ms in idle["by_activity"]) == pytest.approx(idle["idle_core_ms"])


def test_bench_timeline_finds_where_the_cores_idle():
    """idle_cores on a made-up timeline of mpirun -n 3 on 2 cores: for 10 ms the server
    solves alone (one core idle), for 5 ms one worker computes alone (one idle), then
    both workers compute (none idle), and a rank waiting inside a timed call counts as
    idle, its enclosing call not as busy."""
    from benchmarks.bench_timeline import idle_cores
    rows = [
        {"rank": 0, "start_s": 0.0, "solve_ms": 20.0,
         "events": [("dense_move", 0.0, 0.010), ("wait", 0.010, 0.020)]},
        {"rank": 1, "start_s": 0.0, "solve_ms": 20.0,
         "events": [("work_epoch", 0.0, 0.020), ("wait", 0.0, 0.010),
                    ("svrg_epoch_l1", 0.010, 0.020)]},
        {"rank": 2, "start_s": 0.0, "solve_ms": 20.0,
         "events": [("wait", 0.0, 0.015), ("svrg_epoch_l1", 0.015, 0.020)]},
    ]
    idle = idle_cores(rows, cores=2)
    assert idle["idle_core_ms"] == pytest.approx(15.0)
    assert idle["span_core_ms"] == pytest.approx(40.0)      # 2 cores for 20 ms
    assert dict(idle["by_activity"]) == pytest.approx(
        {"server dense_move": 10.0, "1 worker svrg_epoch_l1": 5.0})
    # on 4 cores the same timeline leaves 3 - busy ranks idle: 20 + 10 + 5 core-ms
    idle = idle_cores(rows, cores=4)
    assert idle["idle_core_ms"] == pytest.approx(35.0)
    assert dict(idle["by_activity"]) == pytest.approx(
        {"server dense_move": 20.0, "1 worker svrg_epoch_l1": 10.0,
         "2 workers svrg_epoch_l1": 5.0})


def test_bench_timeline_names_the_ranks_that_share_a_physical_core(tmp_path):
    """smt_siblings reads the sibling groups of a made-up sysfs tree (ranges and lists,
    each group once, single CPUs left out), and shared_cores places each rank on the CPU
    where most of its timed calls ended: ranks on two CPUs of one group share a physical
    core, ranks on one CPU share it, ranks on other groups share nothing."""
    from benchmarks.bench_timeline import format_placement, shared_cores
    from benchmarks.common import smt_siblings
    lists = {0: "0,4", 1: "1-1", 2: "2,6", 3: "3", 4: "0,4", 6: "2,6"}
    for cpu, text in lists.items():
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    (tmp_path / "cpufreq").mkdir()
    siblings = smt_siblings(str(tmp_path))
    assert siblings == [[0, 4], [2, 6]]
    assert smt_siblings(str(tmp_path / "absent")) == []
    rows = [{"rank": 0, "cpus": [[3, 9], [0, 1]]},
            {"rank": 1, "cpus": [[0, 10]]},
            {"rank": 2, "cpus": [[4, 6], [2, 2]]},
            {"rank": 3, "cpus": [[2, 5]]},
            {"rank": 4, "cpus": [[2, 5]]},
            {"rank": 5, "cpus": []}]
    placed, smt, same = shared_cores(rows, siblings)
    assert placed == [[0, 3, 0.9], [1, 0, 1.0], [2, 4, 0.75], [3, 2, 1.0], [4, 2, 1.0]]
    assert smt == [[1, 2, 0, 4]]
    assert same == [[3, 4, 2]]
    line = format_placement(placed, smt, same, siblings)
    assert "ranks 1 and 2 (CPUs 0, 4)" in line and "ranks 3 and 4 (2)" in line
    assert "no physical core has several" in format_placement(placed, [], [], [])
