#!/usr/bin/env bash
# Device session for the GPU executor: build (as bench/device_run.sh), the `cuda`-marked tests
# (op suite + executor vs CPU), then the GPU half of the NeMo oracle check
# (bench/cuda_oracle.py dump; run `compare` on the CPU machine). Logs and the logits go to $OUT.
#   bash bench/device_cuda_tests.sh [pytest -k expression]
set -uo pipefail
OUT=${OUT:-/tmp/dsv41rt-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -v -C build-dir=/tmp/dsv41rt-build . >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; tail -30 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
K=${1:-}
echo "== cuda-marked tests ${K:+(-k $K)}"
PYTHONWARNINGS=ignore timeout 420 python3 -m pytest -q -p no:cacheprovider -m cuda ${K:+-k "$K"} -s tests/python 2>&1 | tee "$OUT/pytest_cuda.log" | grep -vE "^\s*$" | tail -60
if [ -z "$K" ] || [ "${ORACLE_DUMP:-0}" = 1 ]; then
  echo "== GPU half of the NeMo oracle check"
  timeout 300 python3 bench/cuda_oracle.py dump --out "$OUT/cuda_vs_cpu.npz" 2>&1 | tail -8
fi
if [ -n "${BENCH_TINY:-}" ]; then
  echo "== executor benchmark (tiny-v41)"
  DSV41RT_COMMIT=${COMMIT:-} timeout 420 python3 -u bench/bench_executor.py --preset tiny-v41 --out "$OUT/bench_tiny.json" 2>&1 | tail -40
fi
