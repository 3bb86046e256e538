"""How long a rank waits for a message: round trips of Dis-DDSS's synchronous messages
under each way of waiting (``asyncopt.comm.wire.poll``), at several rank counts.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_wire.py             # ~1 min
    PYTHONPATH=. .venv/bin/python benchmarks/bench_wire.py --ranks 3 9 --rounds 500

Two patterns, each timed with the ``Wire`` that solve_mpi uses (root-centred on an
oversubscribed node, MPI's collectives otherwise):
- ``cg product``: what the support Newton step's CG does once per Hessian-vector product
  (newton.model.hessian_free_direction under MPI): rank 0 broadcasts v (|S| + 1
  doubles), every worker multiplies its symmetric |S|-square Hessian share by it (BLAS
  dsymv, |S| = 1,050 as on CTR 200,000 x 100,000 at 1e-3 lam_max) and the products are
  summed on rank 0. Milliseconds per round trip.
- ``certificate``: a broadcast and a reduction of 100,000 doubles and an allreduce of one
  (the outer iteration's messages on CTR's 100,000 features). Milliseconds per round,
  with MPI's messages and through the inner loop's shared-memory window
  (``channels.SharedCollectives``, what solve_mpi uses on one node).
- ``hessian sum``: the support Newton step's reduction of every worker's packed Hessian
  share ((|S| + 1)(|S| + 2) / 2 doubles, ``--hessian-support`` 1,466: 8.6 MB, CTR's
  8-worker step on 16 cores) into a blank buffer on rank 0 (``Wire.reduce(root_blank=
  True)``), worker r arriving r ms after rank 0 as the shares' forming ends unevenly;
  on each route of ASYNCOPT_MPI_REDUCE (``mpi``: MPI's reduction, ``messages``: each
  share a message to rank 0, which sums them), root-centred on an oversubscribed node
  whatever the route. Milliseconds per round, the stagger included.

Ways of waiting (``--modes``):
- ``yield``: the library's ``poll``: a spin of up to SPIN_SECONDS that gives the core away
  (sched_yield) after every check, then sleeps of 50 us doubling to MAX_PAUSE;
- ``sleep``: no spin, the sleeps at once (what an oversubscribed node's waits did before);
- ``hold``: the spin without the yield (a rank that waits keeps its core for 1 ms);
- ``server-sleeps``: rank 0 sleeps at once, the others as ``yield`` (what Dis-DDSS does on
  an oversubscribed node, ``solvers/mpi.py``);
- ``doorbell``: no rank spins, and the window's waits sleep on futex doorbells that the
  poster rings (``wire.Doorbell``; what Dis-DDSS does on a crowded node, 2 ranks per core
  or more). MPI's messages have no doorbells: their waits sleep as in ``sleep``.

Output: a table, and ``results/bench_wire.json`` (machine, rank counts, oversubscription,
every round's time); each row is the best of ``--repeat`` blocks of ``--rounds`` rounds.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

MODES = ("yield", "sleep", "hold", "server-sleeps", "doorbell")


def _set_mode(wire_module, wire, mode):
    """Make every wait of ``wire`` (its own and its channels') wait the way ``mode``
    says; only ``doorbell`` gives the window's channel doorbells, whatever the node."""
    wire.crowded = mode == "doorbell"
    if mode in ("sleep", "doorbell") or (mode == "server-sleeps" and wire.rank == 0):
        wire.spin = 0.0
    elif mode == "hold":
        wire_module.os.sched_yield = lambda: None


def rank_side(args):
    """SPMD: time both patterns for one mode; rank 0 writes JSON to args.out."""
    import numpy as np
    from mpi4py import MPI
    from scipy.linalg.blas import dsymv
    from asyncopt.comm import wire as wire_module
    from asyncopt.comm.channels import open_channel

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    wire = wire_module.Wire(comm)
    _set_mode(wire_module, wire, args.mode)
    dim = args.support
    share = np.random.default_rng(rank).standard_normal((dim, dim))
    share = np.asfortranarray(share + share.T)
    vector = np.ones(dim + 1)
    out = {"mode": args.mode, "ranks": comm.Get_size(), "support": dim,
           "oversubscribed": wire.oversubscribed}

    def cg_products(rounds):
        for _ in range(rounds):
            wire.bcast(vector)
            wire.reduce(np.zeros(dim) if rank == 0 else dsymv(1.0, share, vector[1:]))

    payload = np.ones(args.features)

    def certificates(rounds):
        for _ in range(rounds):
            wire.bcast(payload)
            wire.reduce(payload)
            wire.allreduce(np.ones(1))

    def time_pattern(name, pattern, rounds):
        pattern(5)                                     # connections, first touches
        blocks = []
        for _ in range(args.repeat):
            comm.Barrier()
            start = time.perf_counter()
            pattern(rounds)
            blocks.append((time.perf_counter() - start) / rounds * 1e3)
        out[name] = {"ms_per_round": min(blocks), "blocks_ms": blocks, "rounds": rounds}

    size = (args.hessian_support + 1) * (args.hessian_support + 2) // 2
    triangle = np.random.default_rng(rank).standard_normal(size)

    def hessian_sums(rounds):
        for _ in range(rounds):
            if rank:
                time.sleep(1e-3 * rank)
            wire.reduce(np.empty(size) if rank == 0 else triangle, root_blank=True)

    time_pattern("cg_product", cg_products, args.rounds)
    for route in ("mpi", "messages"):
        wire.reduce_route = route       # every rank alike
        time_pattern(f"hessian_sum_{route}", hessian_sums, max(3, args.rounds // 30))
    wire.reduce_route = "auto"
    time_pattern("certificate", certificates, max(1, args.rounds // 6))
    # the same round through the inner loop's shared-memory window (what solve_mpi's
    # Wire does on one node while the channel is open)
    channel = open_channel(comm, wire, args.features, 4, 4, "shared")
    wire.attach(channel.collectives)
    time_pattern("certificate_shared", certificates, max(1, args.rounds // 6))
    wire.detach()
    channel.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 5, 9])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--support", type=int, default=1050)
    parser.add_argument("--features", type=int, default=100_000)
    parser.add_argument("--hessian-support", type=int, default=1466)
    parser.add_argument("--output", default=None)
    parser.add_argument("--mpirun", default=None)
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="yield", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_side:
        return rank_side(args)

    from benchmarks._mpi_run import RANK_ENV, find_mpirun
    from benchmarks.common import RESULTS_DIR, format_table, machine_info, write_json

    mpirun = find_mpirun(args.mpirun)
    if mpirun is None:
        raise SystemExit("bench_wire: no mpirun found (pip install mpich)")
    cores = os.cpu_count()
    print(f"bench_wire: os.cpu_count() = {cores}, {mpirun}; |S| = {args.support}, "
          f"{args.features:,} features, {args.rounds} rounds, best of {args.repeat}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(RANK_ENV)
    results, rows = [], []
    handle, out = tempfile.mkstemp(prefix="bench_wire_", suffix=".json")
    os.close(handle)
    for n_ranks in args.ranks:
        for mode in args.modes:
            cmd = [mpirun, "-n", str(n_ranks), sys.executable, os.path.abspath(__file__),
                   "--rank-side", "--mode", mode, "--out", out,
                   "--rounds", str(args.rounds), "--repeat", str(args.repeat),
                   "--support", str(args.support), "--features", str(args.features),
                   "--hessian-support", str(args.hessian_support)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"bench_wire: mpirun -n {n_ranks} ({mode}) failed: "
                                 + proc.stderr.strip()[-500:])
            with open(out) as f:
                result = json.load(f)
            os.remove(out)
            results.append(result)
            rows.append([f"-n {n_ranks}", "yes" if n_ranks > cores else "no", mode,
                         f"{result['cg_product']['ms_per_round']:.3f}",
                         f"{result['certificate']['ms_per_round']:.2f}",
                         f"{result['certificate_shared']['ms_per_round']:.2f}",
                         f"{result['hessian_sum_mpi']['ms_per_round']:.1f}",
                         f"{result['hessian_sum_messages']['ms_per_round']:.1f}"])
            print(f"  -n {n_ranks} {mode:5s} cg product "
                  f"{result['cg_product']['ms_per_round']:.3f} ms, certificate "
                  f"{result['certificate']['ms_per_round']:.2f} ms (MPI), "
                  f"{result['certificate_shared']['ms_per_round']:.2f} ms (window), "
                  f"Hessian sum {result['hessian_sum_mpi']['ms_per_round']:.1f} ms "
                  "(MPI's reduction) / "
                  f"{result['hessian_sum_messages']['ms_per_round']:.1f} ms (messages)",
                  flush=True)
    header = ["ranks", "oversub.", "wait", "cg product ms", "certificate ms",
              "certificate window ms", "Hessian sum ms (MPI)", "(messages)"]
    table = format_table(header, rows)
    print()
    print(table)
    path = args.output or os.path.join(RESULTS_DIR, "bench_wire.json")
    write_json(path, {"benchmark": "bench_wire", "machine": machine_info(["mpi4py"]),
                      "cpu_count": cores, "support": args.support,
                      "features": args.features, "rounds": args.rounds,
                      "hessian_support": args.hessian_support,
                      "repeat": args.repeat, "results": results, "table_text": table})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
