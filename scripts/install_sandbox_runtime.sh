#!/usr/bin/env bash
# Create (idempotently) the sandbox runtime: a Python virtual environment for model-written code,
# with the pinned libraries of srt_agent/tools/sandbox_runtime.txt and nothing of the project's.
# Where: $SRT_SANDBOX_RUNTIME, else .sandbox-venv in the repository (git-ignored). It is built on
# /usr/bin/python3 when present: a sandbox started by root runs as an unprivileged uid that must be
# able to read the interpreter, which a pyenv or home-directory Python is not.
# Run by root in a checkout other users cannot enter (e.g. under /root), it builds the runtime under
# /var/lib/srt-agent instead and makes .sandbox-venv a link to it: those programs run as unprivileged uids.
set -euo pipefail
RUNTIME=$(realpath -m "${SRT_SANDBOX_RUNTIME:-$(dirname "$0")/../.sandbox-venv}")  # relative: to where it is run from
cd "$(dirname "$0")/.."
others_reach() { setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$1" 2>/dev/null; }
if [ -z "${SRT_SANDBOX_RUNTIME:-}" ] && [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1 \
  && [ ! -d .sandbox-venv ] && ! others_reach "$PWD"; then
  OPEN="/var/lib/srt-agent/sandbox-runtime-$(printf %s "$PWD" | sha1sum | cut -c1-12)"
  mkdir -p "$OPEN" && chmod a+rx /var/lib/srt-agent
  ln -sfn "$OPEN" .sandbox-venv
  echo "note: other users cannot enter $PWD, so the sandbox runtime lives in $OPEN (.sandbox-venv links to it)" >&2
  RUNTIME=$OPEN
fi
REQUIREMENTS=srt_agent/tools/sandbox_runtime.txt
BASE=${SANDBOX_BASE_PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
STAMP="$RUNTIME/srt-requirements.txt"
if [ -x "$RUNTIME/bin/python" ] && cmp -s "$REQUIREMENTS" "$STAMP"; then
  exit 0  # already built from these pins
fi
[ -x "$RUNTIME/bin/python" ] || "$BASE" -m venv --without-pip "$RUNTIME"
# pip stays outside the runtime (a lean start-up for every sandboxed program): the project's, else the base's.
PIP_PYTHON=$([ -x .venv/bin/python ] && echo .venv/bin/python || echo "$BASE")
PIP_DISABLE_PIP_VERSION_CHECK=1 "$PIP_PYTHON" -m pip --python "$RUNTIME/bin/python" install -q \
  --only-binary=:all: -r "$REQUIREMENTS"
cp "$REQUIREMENTS" "$STAMP"
chmod -R a+rX "$RUNTIME"
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1 \
  && ! setpriv --reuid=65534 --regid=65534 --clear-groups test -r "$RUNTIME/pyvenv.cfg"; then
  echo "note: other users cannot reach $RUNTIME (a folder above it lacks o+x): sandboxes started by root run" \
    "each program as its own uid and will not use it; build it elsewhere with SRT_SANDBOX_RUNTIME=<path>" >&2
fi
echo "sandbox runtime ready: $RUNTIME/bin/python"
