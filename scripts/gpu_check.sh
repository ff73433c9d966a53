#!/usr/bin/env bash
# The GPU check (`srt-agent bench gpu`, docs/benchmarks/gpu.md) on a CUDA machine without internet.
#
#   scripts/gpu_check.sh prepare        here, with PyPI: fills .gpu-check/ (git-ignored) with what the
#                                       target lacks, for CPython 3.12 on manylinux x86-64
#   scripts/gpu_check.sh run [OUT_DIR]  there: installs .gpu-check/wheels offline, loads or builds the C++
#                                       token tree, runs the check (default OUT_DIR: $OUT/gpu, else runs/gpu);
#                                       arguments after OUT_DIR go to `bench gpu` (e.g. --quick, --stage speed)
#   scripts/gpu_check.sh verify         here: the dry run in a fresh venv holding only the target's
#                                       packages, with the same wheels built for this machine's Python
#
# Carry: .gpu-check — the one ignored path the working tree needs beside it (the device tool's
# carry=[".gpu-check"]): 3.0 MiB as prepared on 2026-11-27 (`du -sb`: 3,176,175 bytes; the wheels of
# pydantic 2.14, pydantic-core 2.50, annotated-types, typing-inspection and typing-extensions 2.8 MiB, the
# compiled tree 0.3 MiB). With the tracked files (3.3 MiB) about 6.4 MiB travel, of the 64 MiB allowed.
#
# The target (docs/benchmarks/gpu.md): python3 3.12 with torch (CUDA), transformers, numpy, safetensors,
# tokenizers, huggingface_hub, typer, rich, psutil, pyyaml, pybind11; no pydantic. What `bench gpu` imports
# beyond those is pydantic and what it needs (srt_agent/config/); nothing of fastapi, uvicorn,
# gguf, math-verify, vLLM or verl. The models are random-weight ones built from configs: no weights and no
# tokenizer travel. The token tree: the extension built here against CPython 3.12's headers, else built
# there with its compiler, else the pure-Python tree (the check's summary names which one ran).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
CARRY=.gpu-check
PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)

wheels() {  # wheels PYTHON_VERSION DEST: pydantic and what it needs, for that CPython on manylinux x86-64
  local get=(python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$1"
    "${PLATFORMS[@]}" -d "$2")
  "${get[@]}" pydantic annotated-types typing-inspection typing-extensions
  # pydantic pins the one pydantic-core it was released with; typing-extensions travels because pydantic
  # needs a newer one than torch does.
  local pin
  pin=$(python3 - "$2" <<'PY'
import glob, re, sys, zipfile
wheel = zipfile.ZipFile(glob.glob(f"{sys.argv[1]}/pydantic-[0-9]*.whl")[0])
meta = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
print(re.search(r"^Requires-Dist: pydantic-core==([0-9.]+)", meta, re.M).group(1))
PY
)
  "${get[@]}" "pydantic-core==$pin"
}

pybind_include() {  # the pybind11 headers: PYTHON's pybind11, else one fetched into a temporary folder
  "$1" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null && return
  local tmp
  tmp=$(mktemp -d /tmp/gpu-check-pybind11.XXXX)
  python3 -m pip install -q --no-deps --target "$tmp" pybind11 >/dev/null && echo "$tmp/pybind11/include"
}

build_tree() {  # build_tree PYTHON OUT_DIR: compile srt_agent/drafting/trees/_tree.cpp for PYTHON (the flags of setup.py)
  local include pybind suffix
  include=$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  [ -f "$include/Python.h" ] || { echo "no Python.h for $1" >&2; return 1; }
  pybind=$(pybind_include "$1") || return 1
  suffix=$("$1" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  c++ -O2 -std=c++17 -fvisibility=hidden -shared -fPIC -I"$pybind" -I"$include" \
    srt_agent/drafting/trees/_tree.cpp -o "$2/_tree$suffix"
}

python312() {  # a CPython 3.12 here, if any (a pyenv shim that names no installed 3.12 does not count)
  local candidate
  for candidate in python3.12 "$(pyenv prefix 3.12 2>/dev/null | head -1)/bin/python3"; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$candidate"
      return
    fi
  done
  return 1
}

prepare() {
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
  wheels 3.12 "$CARRY/wheels"
  if py=$(python312) && build_tree "$py" "$CARRY"; then
    echo "built the token tree for $("$py" -V)"
  else
    echo "the tree is not built for CPython 3.12 here: the target builds it, or uses the pure-Python tree"
  fi
  du -sh "$CARRY"
  ls "$CARRY" "$CARRY/wheels"
}

install_tree() {  # the carried extension if it loads there, else one built there, else none (pure Python)
  local cache=srt_agent/drafting/trees
  cp "$CARRY"/_tree.*.so "$cache/" 2>/dev/null || true
  python3 -c 'from srt_agent.drafting.trees._tree import TokenTree' 2>/dev/null && return
  rm -f "$cache"/_tree.*.so
  if build_tree python3 "$cache" && python3 -c 'from srt_agent.drafting.trees._tree import TokenTree'; then
    return
  fi
  rm -f "$cache"/_tree.*.so
  echo "token tree: the pure-Python one (no extension loads or builds here)"
}

run() {
  local out=${1:-${OUT:-runs}/gpu}
  shift || true
  local site
  compgen -G "$CARRY/wheels/*.whl" >/dev/null || { echo "no $CARRY/wheels: run '$0 prepare' here and carry $CARRY" >&2; exit 1; }
  site=$(mktemp -d /tmp/gpu-check-site.XXXX)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$CARRY"/wheels/*.whl
  export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
  install_tree
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
  python3 -m srt_agent.cli bench gpu --out "$out" "$@" 2>&1 | tee "$out/check.log"
}

verify() {  # the target's packages only (+ the carried wheels for this Python): does the dry run import and run?
  local env=${GPU_CHECK_VENV:-/tmp/gpu-check-venv} site version
  version=$(python3 -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
  [ -x "$env/bin/python" ] || {
    python3 -m venv "$env"
    "$env/bin/pip" install -q torch==2.13.0 transformers numpy safetensors tokenizers huggingface_hub typer rich \
      psutil pyyaml pybind11
    # typer >= 0.2x brings pydantic along; the target's typer does not: take it out again
    "$env/bin/pip" uninstall -y -q pydantic pydantic-core annotated-types typing-inspection
  }
  site=$(mktemp -d /tmp/gpu-check-verify.XXXX)
  wheels "$version" "$site/wheels"
  "$env/bin/pip" install -q --no-index --no-deps --no-compile --target "$site/lib" "$site"/wheels/*.whl
  PYTHONPATH="$site/lib:$PWD" PYTHONNOUSERSITE=1 "$env/bin/python" - "$site/out" <<'PY'
import sys
from srt_agent.cli import app
try:
    app(["bench", "gpu", "--device", "cpu", "--quick", "--out", sys.argv[1]], prog_name="srt-agent")
except SystemExit as exc:
    code = exc.code
unwanted = {"fastapi", "uvicorn", "gguf", "math_verify", "vllm", "verl"} & {m.split(".")[0] for m in sys.modules}
print(f"exit {code}; imported of fastapi, uvicorn, gguf, math_verify, vllm, verl: {sorted(unwanted) or 'none'}")
sys.exit(1 if code or unwanted else 0)
PY
}

case "${1:-}" in
prepare) prepare ;;
run) shift; run "$@" ;;
verify) verify ;;
*) echo "usage: $0 prepare | run [OUT_DIR [bench gpu options]] | verify" >&2; exit 2 ;;
esac
