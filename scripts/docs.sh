#!/usr/bin/env bash
# Build the documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link, a page missing
# from the nav or a nav entry without its page fails the build. mkdocs-material goes into .venv (the
# environment scripts/setup.sh makes; created here when it is missing). Extra arguments go to mkdocs build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export NO_MKDOCS_2_WARNING=1  # mkdocs-material's banner about MkDocs 2; the build's own warnings still show
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import material, mkdocs" 2>/dev/null; then
  .venv/bin/python -m pip install -q "mkdocs-material>=9,<10"
fi
exec .venv/bin/python -m mkdocs build --strict --site-dir site "$@"
