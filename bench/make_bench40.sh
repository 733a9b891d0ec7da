#!/usr/bin/env bash
# Generate the bench-40 checkpoint on the GPU machine (released V4.1-Flash widths, 40 layers,
# 32 experts; ~34 GB) and validate it, recording wall time and peak host memory: the generator must
# stream (never hold the model in memory). Usage: bash bench/make_bench40.sh [OUT_DIR]
set -uo pipefail
OUT=${OUT:-/tmp/dsv41rt-out}; mkdir -p "$OUT"
DIR=${1:-/tmp/bench-40}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=/tmp/dsv41rt-build-g++ . >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
df -h /tmp | tail -1
/usr/bin/time -v python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out "$DIR" 2>"$OUT/time.log" | tail -3
grep -E "Elapsed|Maximum resident" "$OUT/time.log"
du -sh "$DIR"
/usr/bin/time -v python3 -m dsv41rt inspect "$DIR" 2>"$OUT/inspect_time.log" | grep -E "Tensors in|F8_E4M3|I8 |B/token" 
grep -E "Elapsed|Maximum resident" "$OUT/inspect_time.log"
