#!/usr/bin/env bash
# One batched device call. Builds a dsv41rt wheel for the device's Python (copied to $OUT/wheel so
# the next call can carry it in .whl/ and skip the build), or installs the carried one, then runs
# the steps named in $STEPS (default "tests"):
#   gtest    the GoogleTest suites built on the CPU machine with CUDA and carried in .devcarry/gtest
#            (test binaries + libdsv41rt.so; DSV41RT_REQUIRE_CUDA=1: CUDA instances must run)
#   gtestdev the GoogleTest suites built here, with the wheel (BUILD=1; GoogleTest's sources carried
#            in .devcarry/googletest, e.g. a copy of Debian's /usr/src/googletest): GTESTS names the
#            binaries to run (default all; GTEST_TIMEOUT seconds each); KEEP_GTEST=1 copies binaries
#            + library to $OUT/gtest for later calls
#   tests    cuda-marked pytest (-k "$K" when set)
#   suite    every cuda-marked test (the op suite + executor)
#   oracle   GPU half of the NeMo oracle check (bench/cuda_oracle.py dump)
#   tiny     executor benchmark on tiny-v41 (both precisions)
#   bench40  generate bench-40 and run the executor benchmark on it (precisions BENCH_PRECISIONS, default bf16;
#            decode modes BENCH_MODES, comma-separated, default all)
#   comm     NCCL communicator and context-parallel tests/timings
#   prefix   TTFT of a PREFIX_TOKENS (default 32768) prompt cold, re-sent with a new 200-token suffix, and
#            re-sent after eviction to the host tier (bench/prefix_ttft.py, precisions BENCH_PRECISIONS)
#   profile  per-kernel device time of one bench-40 prefill and of eager decode steps (B 1, 8, 64), with
#            kernels per step (after bench40, or generates it); PROFILE_TOKENS, PROFILE_BATCHES,
#            PROFILE_PRECISION, PROFILE_KV_MEMORY (bytes; 32k tokens need ~26 GiB)
#   spec     DSpark speculation at batch 1 on bench-40 (bench/spec_decode_bench.py: fixed acceptance lengths,
#            the real drafter, plain greedy; SPEC_PRECISION, SPEC_PROMPT, SPEC_TOKENS)
#   specb    DSpark speculation in the engine at batches SPECB_BATCHES (default 1,16,64) on bench-40
#            (bench/spec_decode_engine_bench.py: tok/s per request, plain / fixed acceptance lengths /
#            the real drafter fixed and self-tuned; SPEC_PRECISION, SPEC_PROMPT, SPECB_TOKENS, SPECB_REPEATS,
#            SPECB_ACCEPTANCE, set empty for plain and the real drafter only)
#   disagg   prefill/decode disaggregation on one GPU vs one server on bench-40 (bench/disagg_bench.py:
#            TTFT, TPOT, handoff time and bytes per DISAGG_PROMPT-token request; DISAGG_PRECISION,
#            DISAGG_MEMORY device|host; needs the serve extras and nixl_cu13 carried as wheels in .whl)
#   kbench   the kernel microbenchmarks carried in .devcarry/bench (bench/kernels/*_bench.cu), then
#            those of this call's build named in KBENCH_BUILT (e.g. "moe_decode_bench"; needs gtestdev)
#   cp2      (2 GPUs) CP 2 over NCCL vs CP 1 on the tiny presets, threads and one process per GPU
#   bf16diag GPU precision bf16 vs the CPU emulation of it, per position (errors saved for analysis)
#   serve    `dsv41rt serve` on bench-40 (SERVE_PRECISION, default fp8) + `dsv41rt bench`: concurrency 1, then
#            16 with each prefill cap in SERVE_CAPS (default "0 32") and each max-decode-slowdown in
#            SERVE_SLOWDOWNS (default "2"); needs the serve extras carried as wheels in .whl
#   tpep2    (2 GPUs) TP/EP over NCCL: test_tensor_expert_parallel_cuda.py, then bench-40 TP/EP 2 vs one GPU
#            (bench/tp_ep_check.py; TPEP_SIZES, default 2x1,1x2,2x2)
#   cp2bench (2 GPUs) bench-40 prefill, CP 2 one process per GPU vs CP 1 (CP_MODES processes|threads, CP_TOKENS,
#            CP1_TOKENS, REPEATS)
# Usage (device machine, repo root):  STEPS="tests tiny" K="fork" bash bench/device_session.sh
# (what the call carries: bash bench/device_prepare.sh on the CPU machine, carry .whl and .devcarry)
set -uo pipefail
OUT=${OUT:-/tmp/dsv41rt-out}
mkdir -p "$OUT" /tmp/site
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONWARNINGS=ignore
# A GPU run must not pass by skipping: cuda-marked tests (and the CUDA GoogleTest instances) fail
# instead of skipping when they cannot use the GPU.
export DSV41RT_REQUIRE_CUDA=1
for w in .whl/*.whl; do
  case "$w" in
    *dsv41rt-*) ;;
    *) [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$w" ;;
  esac
done
# The image's default compiler (/opt/gcc) links libstdc++ statically into the extension, beside the
# libstdc++.so.6 other extensions load: every C++ exception would then crash. The system g++ links
# it dynamically.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# The device's copy of the checkout may carry a stale .git: pass COMMIT (the literal hash, taken on
# the machine that sends the call; a $(git rev-parse ...) inside the call runs here and is stale too).
if [ -z "${COMMIT:-}" ]; then echo "warning: COMMIT not given; this checkout's git HEAD may be stale"; fi
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}
wheel=$(ls .whl/dsv41rt-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ] && [ "${BUILD:-0}" != 1 ]; then
  echo "== installing the carried $wheel"
else
  echo "== building the wheel"
  start=$(date +%s)
  test_defs=()
  if [ -d .devcarry/googletest ] && [[ " ${STEPS:-} " == *" gtestdev "* ]]; then
    # GoogleTest from source (the image has none), then the C++ suites in the wheel's build tree.
    cmake -S .devcarry/googletest -B /tmp/gtest-build -G Ninja -DBUILD_GMOCK=OFF -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=/tmp/gtest >/dev/null && cmake --build /tmp/gtest-build --target install >/dev/null ||
      echo "googletest build failed"
    test_defs=(-C cmake.define.DSV41RT_BUILD_TESTS=ON -C cmake.define.GTest_ROOT=/tmp/gtest)
  fi
  # xgrammar's source (grammar-constrained decoding): the machine cannot download it, so it is
  # carried as the pinned sdist (cmake/Xgrammar.cmake), e.g. build/_downloads/xgrammar-*.tar.gz.
  xg=$(ls .devcarry/xgrammar-*.tar.gz 2>/dev/null | head -1)
  [ -n "$xg" ] && test_defs+=(-C cmake.define.DSV41RT_XGRAMMAR_SOURCE="$PWD/$xg")
  python3 -m pip wheel --no-build-isolation --no-deps -v -w "$OUT/wheel" -C build-dir=/tmp/dsv41rt-build "${test_defs[@]}" . \
    >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -20; tail -20 "$OUT/build.log"; exit 1; }
  echo "built in $(($(date +%s) - start)) s"
  wheel=$(ls "$OUT"/wheel/dsv41rt-*.whl | head -1)
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$wheel" || exit 1

# Runs the GoogleTest binaries test_* of folder $1 (those named in GTESTS when set, each within
# GTEST_TIMEOUT seconds), printing one line per binary and the failures' lines.
run_gtests() {
  export DSV41RT_TEST_CHECKPOINT=/tmp/tiny-v41-seed0
  [ -f $DSV41RT_TEST_CHECKPOINT/engram_tables.st ] ||
    python3 -m dsv41rt make-checkpoint --preset tiny-v41 --seed 0 --out $DSV41RT_TEST_CHECKPOINT >/dev/null
  export DSV41RT_TEST_V4_CHECKPOINT=/tmp/tiny-v4-seed0  # test_v4_weights
  [ -f $DSV41RT_TEST_V4_CHECKPOINT/dsv41rt_generated.json ] ||
    python3 -m dsv41rt make-checkpoint --preset tiny-v4 --seed 0 --out $DSV41RT_TEST_V4_CHECKPOINT >/dev/null
  local fails=0 t name
  for t in "$1"/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    if [ -n "${GTESTS:-}" ] && [[ " $GTESTS " != *" $name "* ]]; then continue; fi
    # test_v4_ops reads golden values that ctest's fixture makes with transformers (CPU references
    # only; the device image has no transformers): run only when they were carried or generated.
    if [ "$name" = test_v4_ops ] && [ -z "${DSV41RT_V4_GOLDEN:-}" ]; then
      echo "$name: not run (CPU references against transformers' goldens; set DSV41RT_V4_GOLDEN)"
      continue
    fi
    if ! timeout "${GTEST_TIMEOUT:-300}" "$t" >"$OUT/gtest_one.log" 2>&1; then
      fails=$((fails + 1))
      grep -E "Failure|FAILED|error|Expected|Which is|actual|seed" "$OUT/gtest_one.log" | head -30
    fi
    echo "$name: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/gtest_one.log" | tr '\n' ' ')"
    cat "$OUT/gtest_one.log" >>"$OUT/gtest.log"
  done
  rm -f "$OUT/gtest_one.log"
  echo "gtest binaries failing: $fails"
}

for step in ${STEPS:-tests}; do
  case "$step" in
    gtest)
      echo "== GoogleTest suites (carried binaries)"
      LD_LIBRARY_PATH=$PWD/.devcarry/gtest/lib run_gtests ".devcarry/gtest"
      ;;
    gtestdev)
      echo "== GoogleTest suites (built here with the wheel)"
      if [ "${KEEP_GTEST:-0}" = 1 ]; then  # binaries + library back for later calls
        mkdir -p "$OUT/gtest/lib"
        cp /tmp/dsv41rt-build/cpp/libdsv41rt.so* "$OUT/gtest/lib/" 2>/dev/null
        cp /tmp/dsv41rt-build/tests/cpp/test_* "$OUT/gtest/" 2>/dev/null
        strip "$OUT"/gtest/test_* "$OUT"/gtest/lib/* 2>/dev/null
      fi
      run_gtests /tmp/dsv41rt-build/tests/cpp
      ;;
    tests | suite)
      K=${K:-}
      [ "$step" = suite ] && K=""
      echo "== cuda-marked tests ${K:+(-k $K)}"
      # Modules whose imports need the serve extras (not carried) fail to collect; they hold no
      # cuda-marked test, so collection errors do not stop the run.
      timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -rs -p no:cacheprovider --continue-on-collection-errors \
        -m "cuda and not multi_gpu" ${K:+-k "$K"} -s tests/python \
        2>&1 | tee "$OUT/pytest_$step.log" | grep -E "passed|failed|error|Error|assert|bf16 n|seed|max|SKIPPED" | tail -40
      ;;
    oracle)
      echo "== GPU half of the NeMo oracle check"
      timeout 300 python3 bench/cuda_oracle.py dump --out "$OUT/cuda_vs_cpu.npz" 2>&1 | tail -8
      ;;
    tiny)
      for prec in fp32 bf16; do
        echo "== executor benchmark (tiny-v41, precision $prec)"
        DSV41RT_COMMIT=$commit timeout 300 python3 -u bench/bench_executor.py --preset tiny-v41 --precision $prec \
          --prefill 1024,8192 --contexts 4096,32768 --steps 10 --kv-memory $((16 << 30)) \
          --out "$OUT/bench_tiny_$prec.json" 2>&1 | tail -34
      done
      ;;
    bench40)
      echo "== generate bench-40"
      start=$(date +%s)
      python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 2>&1 | tail -1
      echo "generated in $(($(date +%s) - start)) s"
      for prec in ${BENCH_PRECISIONS:-bf16}; do
        echo "== executor benchmark (bench-40, precision $prec)"
        DSV41RT_COMMIT=$commit timeout "${BENCH_TIMEOUT:-420}" python3 -u bench/bench_executor.py --checkpoint /tmp/bench-40 \
          --precision "$prec" --prefill "${PREFILL-1024,8192}" --contexts "${CONTEXTS:-4096,32768}" --batches "${BATCHES:-1,8,64}" \
          --steps "${DECODE_STEPS:-5}" --repeats 3 --kv-memory $((22 << 30)) --token-budget 8192 --max-context 33000 \
          ${BENCH_MODES:+--modes "$BENCH_MODES"} --out "$OUT/bench40_$prec.json" 2>&1 | tail -40
      done
      nvidia-smi --query-gpu=memory.used --format=csv,noheader
      ;;
    prefix)
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 | tail -1
      for prec in ${BENCH_PRECISIONS:-fp8}; do
        echo "== prefix cache TTFT (bench-40, precision $prec)"
        DSV41RT_COMMIT=$commit timeout "${BENCH_TIMEOUT:-420}" python3 -u bench/prefix_ttft.py --checkpoint /tmp/bench-40 \
          --precision "$prec" --tokens "${PREFIX_TOKENS:-32768}" --out "$OUT/prefix_ttft_$prec.json" 2>&1 | tail -12
      done
      ;;
    profile)
      echo "== where a bench-40 prefill spends its time"
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 | tail -1
      timeout 200 python3 -u bench/profile_prefill.py --checkpoint /tmp/bench-40 --tokens "${PROFILE_TOKENS:-4096}" \
        --precision "${PROFILE_PRECISION:-bf16}" --kv-memory "${PROFILE_KV_MEMORY:-$((8 << 30))}" \
        --decode-batches "${PROFILE_BATCHES:-1,8,64}" 2>&1 | tee "$OUT/profile.log" | tail -80
      ;;
    spec)
      echo "== DSpark speculation at batch 1: fixed acceptance lengths and the real drafter"
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 | tail -1
      DSV41RT_COMMIT=$commit timeout "${SPEC_TIMEOUT:-400}" python3 -u bench/spec_decode_bench.py --checkpoint /tmp/bench-40 \
        --precision "${SPEC_PRECISION:-fp8}" --prompt "${SPEC_PROMPT:-1024}" --new-tokens "${SPEC_TOKENS:-128}" \
        --out "$OUT/spec_decode.json" 2>&1 | tail -12
      ;;
    specb)
      echo "== DSpark speculation in the engine: batches, fixed acceptance lengths, the real drafter"
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 | tail -1
      DSV41RT_COMMIT=$commit timeout "${SPECB_TIMEOUT:-500}" python3 -u bench/spec_decode_engine_bench.py \
        --checkpoint /tmp/bench-40 --precision "${SPEC_PRECISION:-fp8}" --prompt "${SPEC_PROMPT:-1024}" \
        --new-tokens "${SPECB_TOKENS:-48}" --batches "${SPECB_BATCHES:-1,16,64}" --repeats "${SPECB_REPEATS:-2}" \
        --acceptance "${SPECB_ACCEPTANCE-1,2,3,3.51,4,5,6}" \
        --out "$OUT/spec_decode_engine.json" 2>&1 | tail -40
      ;;
    disagg)
      echo "== disaggregation on one GPU (bench-40, ${DISAGG_PROMPT:-8192}-token prompts) vs one server"
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 | tail -1
      DSV41RT_COMMIT=$commit timeout "${DISAGG_TIMEOUT:-500}" python3 -u bench/disagg_bench.py --checkpoint /tmp/bench-40 \
        --precision "${DISAGG_PRECISION:-fp8}" --prompt "${DISAGG_PROMPT:-8192}" --memory "${DISAGG_MEMORY:-device}" \
        --requests "${DISAGG_REQUESTS:-3}" --out "$OUT/disagg_bench.json" 2>&1 | grep -v "requests:" | tail -20
      ;;
    kbench)
      echo "== kernel microbenchmarks (carried in .devcarry/bench, built on the CPU machine)"
      for b in .devcarry/bench/*_bench; do
        [ -x "$b" ] || continue
        echo "-- $(basename "$b")"
        LD_LIBRARY_PATH=$PWD/.devcarry/gtest/lib timeout 300 "$b" ${KBENCH_ARGS:-} 2>&1 | tee "$OUT/$(basename "$b").md" | tail -60
      done
      # Benchmarks built with the tests in this call's wheel build (gtestdev), named in KBENCH_BUILT.
      for name in ${KBENCH_BUILT:-}; do
        b=/tmp/dsv41rt-build/bench/kernels/$name
        [ -x "$b" ] || { echo "-- $name: not built (needs gtestdev in STEPS)"; continue; }
        echo "-- $name (built here)"
        timeout 300 "$b" ${KBENCH_ARGS:-} 2>&1 | tee "$OUT/$name.md" | tail -60
      done
      ;;
    cp2)
      echo "== CP over NCCL on 2 GPUs (nvidia-h200-x2): threads, then one process per GPU"
      export NCCL_NVLS_ENABLE=0
      timeout 200 python3 -u bench/cp_nccl_check.py --cp-size 2 2>&1 | tee "$OUT/cp_nccl_threads.log" | tail -9
      timeout 200 python3 -u bench/cp_nccl_check.py --cp-size 2 --processes 2>&1 | tee "$OUT/cp_nccl_processes.log" | tail -9
      timeout 200 python3 -m pytest -q -p no:cacheprovider -m cuda -k "over_nccl or nccl_equals" -s \
        tests/python/test_context_parallel.py 2>&1 | tee "$OUT/pytest_cp2.log" | tail -4
      ;;
    tpep2)
      echo "== TP/EP over NCCL on 2 GPUs (nvidia-h200-x2): tiny tests, then bench-40 vs one GPU"
      export NCCL_NVLS_ENABLE=0
      timeout 300 python3 -m pytest -q -p no:cacheprovider -m cuda -s \
        tests/python/test_tensor_expert_parallel_cuda.py 2>&1 | tee "$OUT/pytest_tpep2.log" | grep -E "Δ|passed|failed|Error|assert" | tail -40
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 24 | tail -1
      timeout "${TPEP_TIMEOUT:-400}" python3 -u bench/tp_ep_check.py --checkpoint /tmp/bench-40 --sizes "${TPEP_SIZES:-2x1,1x2,2x2}" \
        --out "$OUT/tp_ep_check.json" 2>&1 | grep -v Warning | tee "$OUT/tp_ep_check.log" | tail -20
      ;;
    cp2bench)
      export NCCL_NVLS_ENABLE=0
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 24 | tail -1
      for mode in ${CP_MODES:-processes}; do
        echo "== bench-40 prefill, CP 2 ($mode; tokens ${CP_TOKENS-8192,32768}) vs CP 1 (${CP1_TOKENS-8192})"
        DSV41RT_COMMIT=$commit timeout "${BENCH_TIMEOUT:-540}" python3 -u bench/cp_prefill_bench.py --checkpoint /tmp/bench-40 \
          --cp-size 2 $([ "$mode" = processes ] && echo --processes) --tokens "${CP_TOKENS-8192,32768}" \
          --cp1-tokens "${CP1_TOKENS-8192}" --repeats "${REPEATS:-3}" --out "$OUT/cp_prefill_$mode.json" 2>&1 |
          grep -v Warning | tail -6
      done
      ;;
    serve)
      echo "== serving bench-40 (${SERVE_PRECISION:-fp8}, ${SERVE_IN:-1024} in / ${SERVE_OUT:-128} out)"
      [ -d /tmp/bench-40 ] || python3 -m dsv41rt make-checkpoint --preset bench-40 --seed 0 --out /tmp/bench-40 --workers 16 | tail -1
      export DEVICE=cuda PRECISION=${SERVE_PRECISION:-fp8} KV_MEMORY=${SERVE_KV_MEMORY:-8G} INPUT_LEN=${SERVE_IN:-1024} OUTPUT_LEN=${SERVE_OUT:-128} PYTHON=python3
      echo "-- concurrency 1"
      CONCURRENCY=1 NUM_PROMPTS=${SERVE_C1_PROMPTS:-4} timeout 300 bash bench/serve_itl_cap.sh 0 8100 /tmp/bench-40
      for cap in ${SERVE_CAPS:-0 32}; do
        echo "-- concurrency 16, prefill cap $cap"
        CONCURRENCY=16 NUM_PROMPTS=16 timeout 400 bash bench/serve_itl_cap.sh "$cap" $((8101 + cap)) /tmp/bench-40
      done
      for sd in ${SERVE_SLOWDOWNS:-2}; do
        echo "-- concurrency 16, max decode slowdown $sd"
        SLOWDOWN=$sd CONCURRENCY=16 NUM_PROMPTS=16 timeout 400 bash bench/serve_itl_cap.sh 0 $((8200 + ${sd%.*})) /tmp/bench-40
      done
      ;;
    bf16diag)
      echo "== GPU bf16 vs its CPU emulation, per position"
      timeout 300 python3 -u bench/bf16_emulation_diag.py --out "$OUT/bf16_diag.npz" 2>&1 | tail -14
      ;;
    comm)
      echo "== communicator + context parallel"
      timeout 300 python3 -m pytest -q -p no:cacheprovider -m cuda -s tests/python/test_nccl_comm.py \
        tests/python/test_context_parallel.py 2>&1 | tee "$OUT/pytest_comm.log" | tail -30
      timeout 200 python3 -u bench/cp_overlap.py --compare --out "$OUT/cp_overlap_tiny.json" 2>&1 | tail -20
      ;;
    *) echo "unknown step $step" ;;
  esac
done
