#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
ls /usr/bin/g++* /usr/bin/c++ 2>&1 | head -3; ls /opt/gcc/lib64/ 2>&1 | grep -E "stdc|gcc_s" | head
S=$(ls /tmp/ON/dsv41rt/_core*.so); nm -D --defined-only "$S" | grep -c -E "__cxa|_ZSt" ; nm -D "$S" | grep -E " U (__cxa_throw|_Unwind_RaiseException|__gxx_personality)" 
ldd "$S"
if [ -x /usr/bin/g++ ]; then
  echo "== build with the system g++"
  CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ python3 -m pip install --no-build-isolation --no-deps -q --upgrade --target /tmp/SYS -C build-dir=/tmp/b-SYS . >/tmp/bsys.log 2>&1 || tail -20 /tmp/bsys.log
  ldd /tmp/SYS/dsv41rt/_core*.so | grep -E "std|gcc"
  PYTHONPATH=/tmp/SYS:$PYTHONPATH python3 /tmp/exc.py 2>&1 | tail -2
fi
