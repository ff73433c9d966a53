#!/usr/bin/env bash
# Run SandboxFusion's own Python runner and isolation tests against srt-agent's server, unchanged.
#
#   git clone https://github.com/bytedance/SandboxFusion /path/to/SandboxFusion   # fetched by you
#   bash scripts/sandbox_fusion_peer_tests.sh /path/to/SandboxFusion [pytest arguments]
#
# The tests import SandboxFusion's server app, request/response models and status enums; a stand-in
# `sandbox` package, written to a temporary folder beside copies of the two test files, gives them
# srt-agent's app (srt_agent.tools.server.create_app on the local sandbox) and models instead, and
# their own TestClient drives it. Its async test needs pytest-asyncio (`pip install pytest-asyncio`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SF=${1:?usage: $0 /path/to/SandboxFusion [pytest arguments]}
shift
TESTS="$SF/sandbox/tests/runners"
[ -f "$TESTS/test_python.py" ] || { echo "no $TESTS/test_python.py: is $SF a SandboxFusion checkout?" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/sandbox/runners" "$WORK/sandbox/server"
cp "$TESTS/test_python.py" "$TESTS/test_isolation.py" "$WORK/"
touch "$WORK/sandbox/__init__.py" "$WORK/sandbox/server/__init__.py"
cat > "$WORK/sandbox/runners/__init__.py" <<'EOF'
from enum import Enum


class CommandRunStatus(str, Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"
EOF
cat > "$WORK/sandbox/server/sandbox_api.py" <<'EOF'
from enum import Enum

from srt_agent.tools.server import RunCodeRequest, RunCodeResponse  # noqa: F401


class RunStatus(str, Enum):
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"
EOF
cat > "$WORK/sandbox/server/server.py" <<'EOF'
from srt_agent.tools import LocalSandbox
from srt_agent.tools.server import ServerConfig, create_app

app = create_app(ServerConfig(LocalSandbox(timeout_s=10), workers=4))
EOF
cd "$WORK"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
"$PYTHON" -m pytest -p no:cacheprovider -o asyncio_mode=auto -v test_python.py test_isolation.py "$@"
