#!/usr/bin/env bash
# The main job. Until the server lands, this generates the built-in tiny V4.1 checkpoint and
# inspects it (layer plan, tensors validated against config.json, cache footprint).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${DSV41RT_VENV:-.venv}/bin/activate"
CK=${DSV41RT_CACHE:-.cache}/tiny-v41-seed0
[ -f "$CK/dsv41rt_generated.json" ] || dsv41rt make-checkpoint --preset tiny-v41 --seed 0 --out "$CK"
dsv41rt inspect "$CK"
