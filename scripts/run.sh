#!/usr/bin/env bash
# The main job: set up, then serve the built-in tiny DeepSeek-V4.1 model (generated
# deterministically into .cache/ on first use) with the OpenAI-compatible API on
# http://127.0.0.1:8000, on CPU unless a config says otherwise. Extra arguments go to
# `dsv41rt serve` (e.g. `--port 8001`, `--config configs/h200.yaml`). Stop with Ctrl-C / SIGTERM
# (in-flight requests drain first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${DSV41RT_VENV:-.venv}/bin/activate"
exec dsv41rt serve --config configs/tiny-cpu.yaml --tiny-model-dir "${DSV41RT_CACHE:-.cache}/tiny-v41-seed0" "$@"
