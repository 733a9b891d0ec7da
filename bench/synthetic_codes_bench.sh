#!/bin/bash
# Builds bench/kernels/synthetic_codes_bench.cu with nvcc alone (kernel, CPU reference, status) and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}/synthetic_codes_bench
nvcc -std=c++20 -O3 -arch=sm_90a -Xcompiler=-fopenmp -Icpp -Icpp/include -Itests/cpp \
  bench/kernels/synthetic_codes_bench.cu cpp/kernels/cuda/synthetic_codes.cu cpp/kernels/cpu/synthetic_codes.cc \
  cpp/core/status.cc -o "$out" -lgomp
"$out"
