#!/usr/bin/env bash
# Where does the extension's static libstdc++ come from on the GPU machine? Then test the fix.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
env | grep -i -E "flags|ld_|cxx|cc=" | cut -c1-200
echo "int main(){}" > /tmp/m.cc; g++ -### /tmp/m.cc -shared -o /tmp/m.so 2>&1 | tr ' ' '\n' | grep -i -E "static|stdc" | head
python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ON -C build-dir=/tmp/b-ON . >/tmp/build.log 2>&1 || tail -30 /tmp/build.log
grep -i -E "LINKER_FLAGS:|static-libstdc" /tmp/b-ON/CMakeCache.txt | head; grep -i "removing" /tmp/build.log
ldd /tmp/ON/dsv41rt/_core*.so | grep -E "std|gcc"
cat > /tmp/exc.py <<'PY'
import numpy as np
from dsv41rt import _core
try:
    _core.ops.compress_pool(np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32), 2)
except Exception as e:
    print("OK raised", type(e).__name__, e)
PY
PYTHONPATH=/tmp/ON:$PYTHONPATH python3 /tmp/exc.py 2>&1 | tail -3
