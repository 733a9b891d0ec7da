#!/usr/bin/env bash
# GPU half of the mutation check, test side. Runs on the GPU machine from the repository root, with
# .devcarry/gtest (the GoogleTest binaries built with CUDA) and .devcarry/mut (one gzipped
# libdsv41rt.so.0 per variant, from tests/mutations/build_gpu.py) carried there.
#
# For each variant (the unmutated baseline first), the library is unpacked into $UNPACK/<name>/ and
# every carried backend op suite (.devcarry/gtest/test_backend_*) runs with LD_LIBRARY_PATH there: the
# binaries find libdsv41rt.so.0 through RUNPATH, which LD_LIBRARY_PATH overrides, and this script
# checks with ldd that they load the variant's copy. DSV41RT_REQUIRE_CUDA=1: a CUDA instance that
# cannot use the GPU fails instead of skipping.
#   - the baseline runs every test (CPU and CUDA instances) and must pass them all;
#   - a mutation runs only the CUDA instances (--gtest_filter='*/cuda': the CPU code is the
#     baseline's) and is caught when at least one of them fails. STOP_AT_FIRST=1 (default) stops
#     at the first binary that catches it; STOP_AT_FIRST=0 runs them all.
# Env: ONLY="name ..." (variants besides the baseline), TIMEOUT (s per binary, default 300),
# OUT (report folder, default /tmp). Writes $OUT/mutations-gpu.md and the logs in $OUT/mutations-gpu/.
# Exit status: 0 when the baseline passes and every mutation is caught, else 1.
set -uo pipefail
MUT=${MUT_DIR:-.devcarry/mut}
GTEST=${GTEST_DIR:-.devcarry/gtest}
OUT=${OUT:-/tmp}
TIMEOUT=${TIMEOUT:-300}
UNPACK=${UNPACK:-/tmp/dsv41rt-mut}
STOP_AT_FIRST=${STOP_AT_FIRST:-1}
export DSV41RT_REQUIRE_CUDA=1
logs=$OUT/mutations-gpu
mkdir -p "$logs"

binaries=("$GTEST"/test_backend_*)
[ -x "${binaries[0]}" ] || { echo "no test binaries in $GTEST/test_backend_*" >&2; exit 1; }
[ -f "$MUT/baseline/libdsv41rt.so.0.gz" ] || { echo "no $MUT/baseline/libdsv41rt.so.0.gz (run build_gpu.py)" >&2; exit 1; }
variants=(baseline)
for d in "$MUT"/*/; do
  name=$(basename "$d")
  [ "$name" = baseline ] || [ ! -f "$d/libdsv41rt.so.0.gz" ] && continue
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  variants+=("$name")
done

describe() { # the manifest's description of a variant
  awk -F'\t' -v n="$1" '$1 == n { print $4 }' "$MUT/manifest.tsv" 2>/dev/null
}
cell() { # a markdown table cell: no pipes, no newlines, at most 160 characters
  printf '%s' "$1" | tr '\n|' ' /' | cut -c1-160
}
failure_text() { # the message of the first gtest failure in log $1: the lines after "...: Failure"
  awk '/: Failure$/ { on = 1; next } on && (/^\[/ || /^$/) { exit } on { printf "%s ", $0 }' "$1"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
built_from=$(grep -v '^#' "$MUT/manifest.tsv" 2>/dev/null | awk -F'\t' '$1 == "baseline" { print $2 }')
report=$OUT/mutations-gpu.md
{
  echo "# GPU mutation report"
  echo
  echo "- date: $(date -Iseconds); GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  echo "- libraries built from: ${built_from:-?}; test binaries: $GTEST/test_backend_* (${#binaries[@]})"
  echo "- baseline: every test; mutations: CUDA instances only (--gtest_filter='*/cuda'), DSV41RT_REQUIRE_CUDA=1"
  echo
  echo "| variant | bug | result | first failing CUDA test | error | binaries run | s |"
  echo "|---|---|---|---|---|---:|---:|"
} >"$report"

status_all=0
for name in "${variants[@]}"; do
  libdir=$UNPACK/$name
  mkdir -p "$libdir"
  gzip -dc "$MUT/$name/libdsv41rt.so.0.gz" >"$libdir/libdsv41rt.so.0" || exit 1
  loaded=$(LD_LIBRARY_PATH=$libdir ldd "${binaries[0]}" | awk '/libdsv41rt\.so\.0/ { print $3 }')
  if [ "$loaded" != "$libdir/libdsv41rt.so.0" ]; then
    echo "$name: the binaries would load '$loaded', not $libdir/libdsv41rt.so.0" >&2
    exit 1
  fi
  filter=()
  [ "$name" = baseline ] || filter=(--gtest_filter='*/cuda')
  result="" first="" error="" ran=0 start=$(date +%s)
  for bin in "${binaries[@]}"; do
    log=$logs/$name.$(basename "$bin").log
    LD_LIBRARY_PATH=$libdir timeout "$TIMEOUT" "$bin" --gtest_brief=1 "${filter[@]}" >"$log" 2>&1
    rc=$?
    ran=$((ran + 1))
    [ $rc -eq 0 ] && continue
    # Failed tests: "[  FAILED  ] Suite.Test/param, where GetParam() = ..." (the summary repeats them).
    failed=$(sed -nE 's/^\[  FAILED  \] ([^ ,]+\.[^ ,]+).*/\1/p' "$log" | awk '!seen[$0]++')
    cuda_failed=$(printf '%s\n' "$failed" | grep -E '/cuda$' || true)
    if [ "$name" = baseline ]; then
      result=FAILED
      if [ -z "$first" ]; then
        first=$(printf '%s\n' "$failed" | head -1)
        error=$(failure_text "$log")
        [ -z "$first" ] && first="$(basename "$bin") exit $rc" && error=$(tail -1 "$log")
      fi
      continue
    fi
    if [ -n "$first" ]; then
      : # caught by an earlier binary (STOP_AT_FIRST=0): the report names the first
    elif [ -n "$cuda_failed" ]; then
      result=caught
      first=$(printf '%s\n' "$cuda_failed" | head -1)
      error=$(failure_text "$log")
    else
      # Exit != 0 without a failed test: a crash, or timeout's 124. CI fails on it, so it counts
      # as caught, but not by an assertion.
      result="caught (binary exit $rc)"
      first="$(basename "$bin")"
      error=$(tail -1 "$log")
    fi
    [ "$STOP_AT_FIRST" = 1 ] && break
  done
  if [ -z "$result" ]; then
    result=$([ "$name" = baseline ] && echo passed || echo "NOT CAUGHT")
  fi
  case "$result" in
    passed | caught*) ;;
    *) status_all=1 ;;
  esac
  line="| $name | $(cell "$(describe "$name")") | $result | $(cell "$first") | $(cell "$error") | $ran | $(($(date +%s) - start)) |"
  echo "$line" >>"$report"
  echo "$name: $result ${first:+($first)}"
  if [ "$name" = baseline ] && [ "$result" != passed ]; then
    echo "the unmutated baseline fails: stopping (logs in $logs)" >&2
    break
  fi
done
echo
cat "$report"
exit $status_all
