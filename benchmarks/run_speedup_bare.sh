#!/usr/bin/env bash
# bench_speedup on a bare many-core machine that has python3 with numpy, scipy and numba but
# no MPI: installs the mpich and mpi4py wheels found in WHEELS (pip download them where
# there is a registry), warms numba's cache with a --quick run, then runs the benchmark.
#
#   WHEELS=.whl OUT=/some/dir bash benchmarks/run_speedup_bare.sh [extra bench_speedup args]
#
# The wheels, fetched where a registry is reachable (for that machine's Python, here 3.12):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 \
#       -d .whl mpich==5.0.2 mpi4py==4.1.2
#
# Writes OUT/bench_speedup.json (+ .png) and OUT/log.txt. SECOND="args" runs the benchmark
# once more with those args (an ablation in the same call, e.g. SECOND="--newton-products
# --workers 1 8 --no-threads --no-ceiling --no-command --repeat 3") into
# OUT/bench_speedup_second.json and OUT/log_second.txt, with SECOND_ENV's NAME=value words
# in its environment (e.g. SECOND_ENV="ASYNCOPT_MPI_REDUCE=messages" to compare the
# Hessian shares' routes in one call). The diagnostics come after the
# benchmarks, so that a call cut short still returns the targets' figures: PAIRED="args"
# runs bench_paired.py with those args (e.g. PAIRED="--base .whl/base --ranks 9 --seeds
# 1 2 3 4 5 6", the base tree copied into a carried folder) into OUT/bench_paired.json and
# OUT/log_paired.txt; TIMELINE="args" runs bench_timeline.py (e.g. TIMELINE="--ranks 9
# --data ctr_tall") into OUT/bench_timeline.json and OUT/log_timeline.txt; WIRE=1 times
# the synchronous messages with bench_wire.py (yielding waits; MPI's messages against the
# shared-memory window) into OUT/bench_wire.json and OUT/log_wire.txt. PACK=FILE: on
# exit, a SIGTERM from an outer timeout included, OUT is packed into the .tar.gz FILE (the
# device tool returns at most 8 files: PACK=$OUT/all.tgz OUT=/tmp/o, PACK first).
set -uo pipefail
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
if [ -n "${PACK:-}" ]; then
    trap 'tar czf "$PACK" -C "$OUT" .' EXIT
    trap 'exit 124' TERM
fi
PREFIX=${PREFIX:-/tmp/mpi-prefix}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed \
    --prefix "$PREFIX" "$WHEELS"/*.whl || exit 3
PYV=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
export PYTHONPATH="$PREFIX/lib/python$PYV/site-packages:$PWD"
export LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MPIRUN="$PREFIX/bin/mpirun"
nproc
lscpu | grep -Ei "model name|^CPU\(s\)|thread|socket|numa node"
# which logical CPUs share a physical core (bench_timeline names the ranks that did)
{ lscpu; echo; lscpu -e; } > "$OUT/lscpu.txt" 2>&1
python3 -c "import numpy, scipy, numba, mpi4py; print('numpy', numpy.__version__,
'scipy', scipy.__version__, 'numba', numba.__version__, 'mpi4py', mpi4py.__version__)"
"$MPIRUN" -n 2 python3 -c "from mpi4py import MPI; c = MPI.COMM_WORLD
print(c.Get_rank(), MPI.Get_library_version().splitlines()[0])" || exit 4
python3 -m compileall -q asyncopt
t0=$(date +%s)
timeout 200 python3 benchmarks/bench_speedup.py --quick --no-ceiling --threads 1 2 \
    --workers 1 8 --mpirun "$MPIRUN" --output "$OUT/bench_speedup_quick.json" \
    > "$OUT/log_quick.txt" 2>&1
echo "warm-up (--quick, numba compile): rc $? in $(( $(date +%s) - t0 )) s"
tail -n 12 "$OUT/log_quick.txt"
timeout "${BENCH_TIMEOUT:-330}" python3 benchmarks/bench_speedup.py --mpirun "$MPIRUN" \
    --output "$OUT/bench_speedup.json" "$@" 2>&1 | tee "$OUT/log.txt"
if [ -n "${SECOND:-}" ]; then
    # shellcheck disable=SC2086 # SECOND is a list of arguments
    # shellcheck disable=SC2086 # SECOND_ENV: NAME=value words for the second run alone
    env ${SECOND_ENV:-} timeout "${BENCH_TIMEOUT:-330}" \
        python3 benchmarks/bench_speedup.py --mpirun "$MPIRUN" \
        --output "$OUT/bench_speedup_second.json" $SECOND 2>&1 | tee "$OUT/log_second.txt"
fi
if [ -n "${PAIRED:-}" ]; then
    # shellcheck disable=SC2086 # PAIRED is a list of arguments
    timeout "${BENCH_TIMEOUT:-330}" python3 benchmarks/bench_paired.py --mpirun "$MPIRUN" \
        --output "$OUT/bench_paired.json" $PAIRED 2>&1 | tee "$OUT/log_paired.txt"
fi
if [ -n "${TIMELINE:-}" ]; then
    # shellcheck disable=SC2086 # TIMELINE is a list of arguments
    timeout "${BENCH_TIMEOUT:-330}" python3 benchmarks/bench_timeline.py --mpirun "$MPIRUN" \
        --output "$OUT/bench_timeline.json" $TIMELINE 2>&1 | tee "$OUT/log_timeline.txt"
fi
if [ -n "${WIRE:-}" ]; then
    timeout 120 python3 benchmarks/bench_wire.py --modes yield --mpirun "$MPIRUN" \
        --output "$OUT/bench_wire.json" 2>&1 | tee "$OUT/log_wire.txt"
fi
