"""benchmarks/bench_speedup.py end to end on its --quick problem (1 and 2 workers, 1
thread): every run reaches the target, the server's phase seconds account for the solve
they split, the ranks' CPU sets a floor no longer than the solve, and the
no-communication, one-block, machine and command rows are there. A change to
_mpi_run.py once broke every Dis-DDSS run of the benchmark and only a device run showed
it."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)




@pytest.mark.mpi
def test_bench_speedup_quick_reports_where_each_solve_went(tmp_path):
    from benchmarks import bench_speedup
    out = tmp_path / "speedup.json"
    assert bench_speedup.main(["--quick", "--workers", "1", "2", "--threads", "1",
                               "--repeat", "1", "--ceiling-epochs", "2", "--no-plot",
                               "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    runs = payload["runs"]
    assert set(runs) == {"dis@1", "dis@2", "sha@1"}
    assert all(run["reached"] and run["error"] is None for run in runs.values())
    from asyncopt.solvers.mpi.inner import default_batch
    for key, workers in (("dis@1", 1), ("dis@2", 2)):
        extra = runs[key]["extra"]
        # the solver's own batch, read off its history
        assert extra["batch"] == default_batch(payload["problem"]["n_samples"], workers)
        assert extra["timeline"]
        solve = extra["timeline"][-1]["time"]
        totals = extra["phase_totals"]
        spent = totals["certificate_s"] + totals["inner_s"] + totals["newton_s"]
        # the records' phases cover the solve but for the steps' broadcasts between them
        assert 0.5 * solve <= spent <= solve
        assert totals["inner_s"] > 0 and totals["certificate_s"] > 0
        # the ranks' CPU over the cores: a floor the solve's own wall time cannot beat
        walls = [r["solve_s"] for r in extra["ranks"]]
        assert extra["solve_cpu_s"] > 0
        assert extra["solve_cpu_s"] / os.cpu_count() <= extra["cpu_floor_s"] <= \
            1.05 * max(walls) + 0.01
    whole = [max(r["solve_s"] for r in runs[key]["extra"]["ranks"])
             for key in ("dis@1", "dis@2")]
    assert payload["targets"]["dis@1/dis@2 >= 1.6"]["cpu_floor_bound"] >= \
        0.95 * whole[0] / whole[1]
    assert [row[0] for row in payload["phases"]["rows"]] == [1, 2]
    # a worker's CPU: the fit through the two counts' means, which are each worker's mean
    per_worker = {}
    for key, workers in (("dis@1", 1), ("dis@2", 2)):
        extra = runs[key]["extra"]
        cpu = [r["solve_cpu_s"] for r in extra["ranks"] if r["rank"] != 0]
        assert len(cpu) == workers
        per_worker[workers] = extra["worker_cpu_s"]
        assert per_worker[workers] == pytest.approx(sum(cpu) / workers)
    fit = payload["worker_cpu_fit"]
    for workers, cpu in per_worker.items():
        assert fit["rows_s"] / workers + fit["fixed_s"] == pytest.approx(cpu, abs=1e-9)
    ceiling = payload["no_communication"]
    assert set(ceiling["seconds"]) == set(ceiling["one_block_alone_seconds"]) == {"1", "2"}
    assert ceiling["one_block_alone_seconds"]["1"] == ceiling["seconds"]["1"]
    for kind in ("compute", "memory"):
        assert payload["core_probe"][kind]["1"] == 1.0
        assert payload["core_probe"][kind]["2"] > 0
    # the command runs: mpirun asyncopt-lasso on the problem as a LIBSVM file, solved to
    # the target with the lam the Dis-DDSS runs used
    commands = payload["commands"]
    assert set(commands) == {"1", "2"}
    for k, workers in (("1", 1), ("2", 2)):
        (run,) = commands[k]["rounds"]
        assert run["error"] is None and run["k"] == workers
        assert run["rel_gap"] <= payload["target_rel_gap"]
        assert commands[k]["best_wall_s"] == run["wall_s"] > run["solve_s"] > 0
    assert payload["table"]["header"][-1] == "command s"
