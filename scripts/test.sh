#!/usr/bin/env bash
# Run every test: C++ (GoogleTest via ctest) and Python (pytest). Sets up the machine first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${DSV41RT_VENV:-.venv}/bin/activate"

echo "== C++ tests"
# Prints whether the CUDA sources are compiled (they are whenever nvcc exists, GPU or not).
cmake -S . -B build/cpp-tests -G Ninja -DDSV41RT_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release | grep "dsv41rt:"
cmake --build build/cpp-tests -j"$(nproc)"
ctest --test-dir build/cpp-tests --output-on-failure -j"$(nproc)"

echo "== Python tests"
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::DeprecationWarning}
python -m pytest -q tests/python "$@"
