#!/usr/bin/env bash
# Serving latency under a prefill cap: starts `dsv41rt serve` with max_prefill_tokens_while_decoding
# = CAP, runs `dsv41rt bench` at concurrency 16 (random prompts of INPUT_LEN tokens, OUTPUT_LEN out),
# stops the server. Usage (repo root): bash bench/serve_itl_cap.sh CAP PORT [CHECKPOINT]
# Env: SLOWDOWN (max_decode_slowdown, the measured cap; default 0 = off), PYTHON (default python3), DEVICE (default: the server's), PRECISION (default: the server's),
# INPUT_LEN (512), OUTPUT_LEN (32), NUM_PROMPTS (32), CONCURRENCY (16), KV_MEMORY (default: the server's),
# OUT (result JSON directory, default /tmp).
set -u
CAP=$1 PORT=$2 CKPT=${3:-build/tiny-v41-seed0}
SLOWDOWN=${SLOWDOWN:-0}
TAG=cap$CAP
[ "$SLOWDOWN" != 0 ] && TAG=cap${CAP}_slowdown$SLOWDOWN
PY=${PYTHON:-python3}
$PY -m dsv41rt serve "$CKPT" --port "$PORT" --max-num-batched-tokens 512 --max-num-seqs 16 \
  --max-prefill-tokens-while-decoding "$CAP" --max-decode-slowdown "$SLOWDOWN" ${DEVICE:+--device "$DEVICE"} ${PRECISION:+--precision "$PRECISION"} ${KV_MEMORY:+--kv-memory "$KV_MEMORY"} \
  >"${OUT:-/tmp}/serve_$TAG.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null' EXIT  # never leave the server (and its GPU memory) behind
ready=0
for _ in $(seq 300); do
  if ! kill -0 "$server" 2>/dev/null; then  # the server exited: say why instead of waiting
    echo "serve_itl_cap: the server exited during start-up:" >&2
    tail -5 "${OUT:-/tmp}/serve_$TAG.log" >&2
    exit 1
  fi
  $PY -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/v1/models')" 2>/dev/null && ready=1 && break
  sleep 1
done
if [ "$ready" != 1 ]; then
  echo "serve_itl_cap: the server did not answer within 300 s" >&2
  kill "$server"
  exit 1
fi
timeout 1800 $PY -m dsv41rt bench --base-url "http://127.0.0.1:$PORT" --input-len "${INPUT_LEN:-512}" \
  --output-len "${OUTPUT_LEN:-32}" --num-prompts "${NUM_PROMPTS:-32}" --max-concurrency "${CONCURRENCY:-16}" --seed 1 \
  --out "${OUT:-/tmp}/itl_${TAG}_c${CONCURRENCY:-16}.json" --no-plot 2>&1 | grep -E "duration|ttft|tpot|itl|failed"
kill "$server"
wait "$server" 2>/dev/null
