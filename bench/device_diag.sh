#!/usr/bin/env bash
# Diagnose C++ exceptions crossing into Python on the GPU machine (they segfaulted there), then run
# the CUDA op suite. Builds with CUDA on and off to separate the cause.
set -uo pipefail
OUT=${OUT:-/tmp/dsv41rt-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 --version; g++ --version | head -1; python3 -c "import nanobind; print('nanobind', nanobind.__version__)"
cat > /tmp/exc.py <<'PY'
import numpy as np
from dsv41rt import _core
try:
    _core.ops.compress_pool(np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32), 2)
except Exception as e:
    print("OK raised", type(e).__name__, e)
PY
for mode in ON OFF; do
  echo "== build CUDA=$mode"
  t=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/$mode -C build-dir=/tmp/b-$mode \
    -C cmake.define.DSV41RT_WITH_CUDA=$mode . >"$OUT/build_$mode.log" 2>&1 || { tail -30 "$OUT/build_$mode.log"; }
  echo "built in $(( $(date +%s) - t )) s"
  PYTHONPATH=/tmp/$mode:$PYTHONPATH python3 -X faulthandler /tmp/exc.py 2>&1 | tail -12
done
ldd /tmp/ON/dsv41rt/_core*.so | grep -E "std|gcc|dsv41rt|python"
if command -v gdb >/dev/null; then
  PYTHONPATH=/tmp/ON:$PYTHONPATH gdb -q -batch -ex run -ex bt --args python3 /tmp/exc.py 2>&1 | tail -25
fi
echo "== CUDA op suite (CUDA=ON build)"
PYTHONPATH=/tmp/ON:$PYTHONPATH PYTHONWARNINGS=ignore python3 -m pytest -q -p no:cacheprovider -m cuda -k "not reject" tests/python 2>&1 | tee "$OUT/pytest_cuda.log" | tail -15
