"""The parameter server's CPU per inner-loop message: Dis-DDSS's ``serve_epoch`` (decode
the delta's coordinates, add it with its weights, list what the worker is owed since its
last reply, write the reply) over a channel that hands it prepared deltas at once, so that
only the server's own work is timed, with no MPI and no workers.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_server.py            # ~10 s
    PYTHONPATH=. .venv/bin/python benchmarks/bench_server.py --workers 1 2 4 8 16

The deltas look like an epoch of CTR 200,000 x 100,000 at 1e-3 lam_max once x is sparse:
each of ``--coords`` coordinates drawn from ``--moving`` coordinates that move (of
``--features``), ``--messages`` messages per worker per epoch (``default_batch`` sends 10
beyond 4 workers where every rank has a core). With l workers the server answers every
message with the coordinates the other l - 1 changed since that worker's previous reply,
so its work per message grows with l; it is a serial (Amdahl) term of every inner loop
(benchmarks/notes/bench_server.md).

Output: a table, and ``results/bench_server.json`` (machine, sizes, every block's time);
each row is the best and the median of ``--repeat`` epochs.
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class PreparedDeltas:
    """A server-side channel (``comm.channels``' interface) whose deltas are already
    there, in round-robin worker order; replies are written and dropped."""

    def __init__(self, messages, reply_header):
        self.messages, self.reply_header, self.next = messages, reply_header, 0

    def wait_delta(self):
        message = self.messages[self.next]
        self.next += 1
        return message

    def reply_buffers(self, worker, n_index, n_values):
        return np.empty(n_index, dtype=np.int32), np.empty(self.reply_header + n_values)

    def post_reply(self, worker, index, values):
        pass

    def flush(self):
        pass


def epoch_messages(rng, n_workers, per_worker, features, moving, coords, header):
    """One epoch's deltas: (worker, wire-form coordinates, header + values), the last of
    each worker flagged."""
    from asyncopt.comm.messages import bitmap_words, encode_index
    moving_set = np.sort(rng.choice(features, moving, replace=False))
    scratch = np.empty(bitmap_words(features), dtype=np.uint32)
    messages = []
    for m in range(per_worker):
        for worker in range(1, n_workers + 1):
            buffer = np.empty(features, dtype=np.int32)
            buffer[:coords] = np.sort(rng.choice(moving_set, coords, replace=False))
            n_index = encode_index(buffer, coords, scratch)
            values = np.empty(header + coords)
            values[header:] = 1e-4 * rng.standard_normal(coords)
            values[:header] = [max(0, len(messages) - n_workers), 1000.0, 1e-5,
                               float(m == per_worker - 1)]
            messages.append((worker, buffer[:n_index].copy(), values))
    return messages


def time_epochs(n_workers, args):
    """Seconds of ``serve_epoch`` for each of args.repeat epochs (after one warm-up)."""
    from asyncopt.solvers.mpi.inner import HEADER, REPLY_HEADER, serve_epoch
    rng = np.random.default_rng(args.seed)
    messages = epoch_messages(rng, n_workers, args.messages, args.features, args.moving,
                              min(args.coords, args.moving), HEADER)
    omega, orthant = np.ones(args.features), np.ones(args.features, dtype=bool)
    seconds = []
    for _ in range(args.repeat + 1):
        channel = PreparedDeltas(messages, REPLY_HEADER)
        start = time.perf_counter()
        serve_epoch(channel, np.zeros(args.features), 0.0, n_workers, omega, 1.0, 1.0,
                     orthant)
        seconds.append(time.perf_counter() - start)
    return seconds[1:], len(messages)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--messages", type=int, default=10, help="per worker per epoch")
    parser.add_argument("--features", type=int, default=100_000)
    parser.add_argument("--moving", type=int, default=2_500)
    parser.add_argument("--coords", type=int, default=1_600, help="per delta")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    from benchmarks.common import RESULTS_DIR, format_table, machine_info, write_json
    rows, runs = [], []
    for n_workers in args.workers:
        seconds, count = time_epochs(n_workers, args)
        best, median = min(seconds), float(np.median(seconds))
        rows.append([n_workers, count, f"{1e3 * best:.2f}", f"{1e3 * median:.2f}",
                     f"{1e6 * best / count:.1f}"])
        runs.append({"workers": n_workers, "messages": count, "seconds": seconds})
    print(format_table(["workers", "messages an epoch", "epoch ms, best", "median",
                        "us a message, best"], rows))
    path = args.output or os.path.join(RESULTS_DIR, "bench_server.json")
    write_json(path, {"benchmark": "bench_server", "machine": machine_info(),
                      "features": args.features, "moving": args.moving,
                      "coords": args.coords, "messages_per_worker": args.messages,
                      "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
