#!/usr/bin/env bash
# Set up a fresh machine for dsv41rt: a virtual environment in .venv with the build tools, the test
# and oracle packages, and dsv41rt itself built and installed. Safe to re-run (it only rebuilds).
# Usage: source-free; `bash scripts/setup.sh` (other scripts call it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${DSV41RT_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.deps-$(sha1sum scripts/requirements-dev.txt | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "== installing Python dependencies"
  python -m pip install -q --upgrade pip
  python -m pip install -q -r scripts/requirements-dev.txt
  # NeMo Automodel is the independent V4.1 reference (oracle tests). Its full dependency set is heavy
  # and GPU-oriented; the V4.1 model needs only what requirements-dev.txt installs.
  python -m pip install -q --no-deps nemo-automodel==0.7.0
  touch "$stamp"
fi

# GoogleTest for the C++ suites (Debian package; CI runs as root on a fresh machine).
if [ ! -f /usr/include/gtest/gtest.h ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing libgtest-dev"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev) >/dev/null
  else
    echo "warning: libgtest-dev missing and not root; C++ tests will not build" >&2
  fi
fi

echo "== building and installing dsv41rt"
python -m pip install -q --no-build-isolation --no-deps .
