"""benchmarks/bench_server.py times Dis-DDSS's server over prepared deltas: each epoch it
times must be a whole inner loop, every prepared message served and the loop ended by each
worker's last one, else its microseconds a message mean nothing."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import bench_server  # noqa: E402


def test_each_timed_epoch_serves_every_prepared_message(tmp_path, monkeypatch):
    served = []
    original = bench_server.PreparedDeltas.wait_delta

    def counted(self):
        served.append(self.next)
        return original(self)

    monkeypatch.setattr(bench_server.PreparedDeltas, "wait_delta", counted)
    out = tmp_path / "server.json"
    bench_server.main(["--workers", "1", "3", "--messages", "4", "--features", "2000",
                       "--moving", "300", "--coords", "120", "--repeat", "2",
                       "--output", str(out)])
    result = json.loads(out.read_text())
    assert [run["messages"] for run in result["runs"]] == [4, 12]
    assert all(len(run["seconds"]) == 2 and min(run["seconds"]) > 0
               for run in result["runs"])
    # 3 epochs (a warm-up and 2 timed) of 4 messages, then of 12: each read them all
    assert served == [i for count in (4, 12) for _ in range(3) for i in range(count)]
    assert result["machine"]["cpu_count"] >= 1
