#!/usr/bin/env bash
# Set up, then run the whole test suite (slow tests included) on all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/missing.sh
# Snowflake's arctic-inference (the C++ SuffixDecoding drafter) builds from source in ~20 s.
has_arctic() { .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; }
if ! has_arctic; then
  log=$(mktemp)
  bash scripts/install_arctic.sh >"$log" 2>&1 || { tail -n 30 "$log" >&2; missing "arctic-inference did not build (scripts/install_arctic.sh)"; }
  rm -f "$log"
fi
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-auto}" --timeout 600 "$@"
