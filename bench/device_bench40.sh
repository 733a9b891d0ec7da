#!/usr/bin/env bash
# bench-40 on the GPU machine: build, generate the checkpoint (released 40-layer V4.1-Flash
# schedule and widths, 32 experts), load it on the GPU executor (BF16 weights dequantised on the
# device), run the 6-forward dequant trace with reuse on and off, then the executor benchmark at
# the sizes this FP32 path can afford in one device session. Outputs to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/dsv41rt-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=/tmp/dsv41rt-build . >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "== executor tests (BF16 device weights)"
PYTHONWARNINGS=ignore timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda -k "executor or graph" tests/python 2>&1 | tail -3
echo "== generate bench-40"
start=$(date +%s)
python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 2>&1 | tail -1
echo "generated in $(( $(date +%s) - start )) s"
echo "== 6-forward dequant trace + executor benchmark (bench-40)"
DSV41RT_COMMIT=${COMMIT:-} timeout ${BENCH_TIMEOUT:-300} python3 -u bench/bench_executor.py --checkpoint /tmp/bench-40 \
  --prefill 1024 --repeats 1 --contexts 256,1024 --batches 1,8 --max-decode-tokens 2100 --steps 5 \
  --kv-memory $((8 << 30)) --token-budget 2048 --trace --out "$OUT/bench40.json" 2>&1 | tail -24; nvidia-smi --query-gpu=memory.used --format=csv,noheader
