#!/usr/bin/env bash
# One batched device session: build dsv41rt with CUDA (sm_90a) against the machine's torch and
# build tools, then run the test suites there. Usage on the device machine (repo root):
#   bash bench/device_run.sh            (expects wheels for missing packages in .whl/)
# Writes logs under $OUT when set.
set -uo pipefail
OUT=${OUT:-/tmp/dsv41rt-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi -L
echo "== build (pip, CUDA sm_90a)"
time python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tee "$OUT/build.log" | tail -20
python3 -c "from dsv41rt import _core; print('cuda devices seen by libdsv41rt:', _core.cuda_device_count())"
echo "== python tests"
PYTHONWARNINGS=ignore python3 -m pytest -q tests/python -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -25
