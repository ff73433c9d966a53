#!/usr/bin/env bash
# Set up, then run the whole test suite (slow tests included) on all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Snowflake's arctic-inference (the C++ SuffixDecoding drafter) builds from source in ~20 s; its tests
# skip when it is missing, so a failed build costs coverage, not the run.
has_arctic() { .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; }
has_arctic || bash scripts/install_arctic.sh >/dev/null 2>&1 || echo "note: arctic-inference did not build; its tests will skip" >&2
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-auto}" --timeout 600 "$@"
