#!/usr/bin/env bash
# Run every test: C++ (GoogleTest via ctest; again under ASan + UBSan on the CPU path) and Python
# (pytest). Sets up the machine first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${DSV41RT_VENV:-.venv}/bin/activate"

# A tiny checkpoint for the C API tests (generated deterministically; reused when present).
export DSV41RT_TEST_CHECKPOINT=${DSV41RT_TEST_CHECKPOINT:-$PWD/build/tiny-v41-seed0}
[ -f "$DSV41RT_TEST_CHECKPOINT/engram_tables.st" ] ||
  dsv41rt make-checkpoint --preset tiny-v41 --seed 0 --out "$DSV41RT_TEST_CHECKPOINT" >/dev/null
# A tiny DeepSeek-V4 checkpoint for the V4 weight tests (tests/cpp/test_v4_weights.cc).
export DSV41RT_TEST_V4_CHECKPOINT=${DSV41RT_TEST_V4_CHECKPOINT:-$PWD/build/tiny-v4-seed0}
[ -f "$DSV41RT_TEST_V4_CHECKPOINT/dsv41rt_generated.json" ] ||
  dsv41rt make-checkpoint --preset tiny-v4 --seed 0 --out "$DSV41RT_TEST_V4_CHECKPOINT" >/dev/null
# V4's quantised cache rows hold head_dim 512 only: tiny-v4 at that width (test_v4_forward).
export DSV41RT_TEST_V4_D512_CHECKPOINT=${DSV41RT_TEST_V4_D512_CHECKPOINT:-$PWD/build/tiny-v4-d512-seed0}
[ -f "$DSV41RT_TEST_V4_D512_CHECKPOINT/dsv41rt_generated.json" ] ||
  dsv41rt make-checkpoint --preset tiny-v4-d512 --seed 0 --out "$DSV41RT_TEST_V4_D512_CHECKPOINT" >/dev/null

# ctest with the skip policy of the Python suites: only the CUDA instances of the backend op
# tests may skip (no GPU here); any other skipped test fails the run.
# run_ctest DIR [VAR=value ...] [-- ctest args ...]
run_ctest() {
  local dir=$1
  shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    envs+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  env "${envs[@]}" ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" "$@" | tee "$dir/ctest.log"
  local unexpected
  unexpected=$(grep -F '***Skipped' "$dir/ctest.log" | grep -vE '/cuda |BackendCuda' || true)
  if [ -n "$unexpected" ]; then
    printf 'ctest skip policy: unexpected skips:\n%s\n' "$unexpected"
    return 1
  fi
  echo "ctest skip policy: 0 unexpected skips (CUDA instances aside)"
}

echo "== C++ tests"
# Prints whether the CUDA sources are compiled (they are whenever nvcc exists, GPU or not).
cmake -S . -B build/cpp-tests -G Ninja -DDSV41RT_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release | grep "dsv41rt:"
cmake --build build/cpp-tests -j"$(nproc)"
run_ctest build/cpp-tests

echo "== examples/cpp_host against a plain CMake install (the wheel's package is tested by pytest)"
cmake --install build/cpp-tests --prefix build/install >/dev/null
cmake -S examples/cpp_host -B build/cpp_host -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/cpp_host
printf '0 671 6102 13462\n0 5 6 7 8 9 10\n0 1000\n' >build/cpp_host/prompts.txt
build/cpp_host/cpp_host "$DSV41RT_TEST_CHECKPOINT" build/cpp_host/prompts.txt | grep -E "^(result|stats)"

echo "== C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU path)"
cmake -S . -B build/cpp-asan -G Ninja -DDSV41RT_BUILD_TESTS=ON -DDSV41RT_SANITIZE=ON -DDSV41RT_WITH_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo | grep "dsv41rt:"
cmake --build build/cpp-asan -j"$(nproc)"
run_ctest build/cpp-asan ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}" UBSAN_OPTIONS=print_stacktrace=1

echo "== C++ tests under ThreadSanitizer (CPU path: engine thread, C API, CP ranks, communicators)"
cmake -S . -B build/cpp-tsan -G Ninja -DDSV41RT_BUILD_TESTS=ON -DDSV41RT_TSAN=ON -DDSV41RT_WITH_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo | grep "dsv41rt:"
cmake --build build/cpp-tsan -j"$(nproc)"
# Tests labelled single_thread start no thread (tests/cpp/CMakeLists.txt): nothing for TSan to see.
run_ctest build/cpp-tsan TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}" \
  -- -LE single_thread

echo "== type check (mypy, configured in pyproject.toml; _core's stubs are checked by pytest)"
python -m mypy

echo "== Python tests"
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::DeprecationWarning}
python -m pytest -q tests/python "$@"
