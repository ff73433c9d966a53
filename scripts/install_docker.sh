#!/usr/bin/env bash
# Make a Docker engine answer and build the Docker sandbox's image without a registry (idempotent).
#   bash scripts/install_docker.sh          engine + image (a no-op when both are there and current)
#   bash scripts/install_docker.sh --stop   stop an engine this script started (nothing else)
# An engine that already answers is used as it is. Otherwise, as root: Debian's docker.io (and mmdebstrap)
# are installed when dockerd is missing, and dockerd is started in the background without a bridge network
# or iptables rules (sandbox containers run with --network none; nothing else on the machine changes); its
# pid goes to $SRT_DOCKERD_PIDFILE, its log to $SRT_DOCKERD_LOG. The image (srt-agent-sandbox:bookworm,
# DockerSandbox's default) is Debian bookworm's minimal root file system from its package mirror
# (mmdebstrap, a faster debootstrap) with python3, the sandbox runtime's libraries (those of the local sandbox:
# srt_agent/tools/sandbox_runtime.txt) and no folder an unprivileged user may write to; it is rebuilt when
# this script or the pins change. Where Docker cannot run (not root and no engine answers, or the kernel
# refuses dockerd), it says so in one line and exits 0: the Docker sandbox's tests then skip as a machine skip.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=srt-agent-sandbox:bookworm  # DockerSandbox's default (DEFAULT_IMAGE)
PIDFILE=${SRT_DOCKERD_PIDFILE:-/run/srt-agent-dockerd.pid}
LOG=${SRT_DOCKERD_LOG:-/var/log/srt-agent-dockerd.log}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
REQUIREMENTS=srt_agent/tools/sandbox_runtime.txt

if [ "${1:-}" = --stop ]; then
  pid=$(cat "$PIDFILE" 2>/dev/null) || exit 0
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
    kill -TERM "$pid"
    for _ in $(seq 60); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
  fi
  rm -f "$PIDFILE"
  exit 0
fi

. scripts/phase.sh
answers() { command -v docker >/dev/null && docker version >/dev/null 2>&1; }
cannot_run() { echo "note: Docker cannot run here ($1): the Docker sandbox's tests will skip"; exit 0; }
apt_install() { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; }

start_engine() {
  [ "$(id -u)" = 0 ] || cannot_run "no engine answers and starting one needs root"
  if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null || ! command -v mmdebstrap >/dev/null; then
    phase "Docker engine and mmdebstrap (apt: docker.io)" apt_install docker.io mmdebstrap debian-archive-keyring
  fi
  setsid dockerd --iptables=false --ip6tables=false --bridge=none >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  for _ in $(seq 60); do
    answers && return 0
    [ -d "/proc/$(cat "$PIDFILE")" ] || break
    sleep 0.5
  done
  bash "$0" --stop
  cannot_run "dockerd did not start: $(tail -n 1 "$LOG")"
}

# The runtime's libraries: copied from the local sandbox's runtime when it runs the same Python, else pip.
add_runtime() {  # ROOTFS
  local version site runtime pip_python
  version=$(chroot "$1" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  site="$1/usr/local/lib/python$version/dist-packages"
  runtime=$(realpath -m "${SRT_SANDBOX_RUNTIME:-.sandbox-venv}")
  mkdir -p "$site"
  if [ -d "$runtime/lib/python$version/site-packages" ] && cmp -s "$REQUIREMENTS" "$runtime/srt-requirements.txt"; then
    cp -a "$runtime/lib/python$version/site-packages/." "$site/"
  else
    pip_python=$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$pip_python" -m pip install -q --only-binary=:all: --target "$site" \
      --python-version "$version" --implementation cp --abi "cp${version/./}" -r "$REQUIREMENTS"
  fi
  chmod -R a+rX "$site"
}

# `python` is python3; SandboxFusion's /mnt lies in the working directory; no apt lists or docs; the program's
# uid may write nowhere but /tmp, which every run covers with a size-capped tmpfs (Docker gives the tmpfs the
# mode of the folder below it).
finish_rootfs() {  # ROOTFS
  ln -sf python3 "$1/usr/bin/python"
  rmdir "$1/mnt" && ln -s /tmp/.mnt "$1/mnt"
  rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/usr/share/{doc,man,info,locale}
  find "$1" -xdev -path "$1/tmp" -prune -o \( -type d -o -type f \) -perm -o+w -exec chmod o-w {} +
}

import_image() {  # ROOTFS RECIPE
  local old
  old=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  tar -C "$1" -c . | docker import --change "LABEL srt-agent.recipe=$2" - "$IMAGE"
  [ -z "$old" ] || docker rmi "$old" || true  # the image this one replaced, unless a container uses it
}

answers || start_engine
recipe=$(cat "$0" "$REQUIREMENTS" | sha256sum | cut -c1-16)
[ "$(docker image inspect -f '{{index .Config.Labels "srt-agent.recipe"}}' "$IMAGE" 2>/dev/null)" = "$recipe" ] && exit 0
[ "$(id -u)" = 0 ] || { echo "error: building $IMAGE needs root (mmdebstrap)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || phase "mmdebstrap (apt)" apt_install mmdebstrap debian-archive-keyring
ROOTFS=$(mktemp -d /var/tmp/srt-sandbox-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
phase "Debian bookworm with python3 (mmdebstrap from $MIRROR)" \
  mmdebstrap --variant=minbase --include=python3 bookworm "$ROOTFS" "$MIRROR"
phase "the sandbox runtime's libraries" add_runtime "$ROOTFS"
finish_rootfs "$ROOTFS"
phase "image $IMAGE (docker import)" import_image "$ROOTFS" "$recipe"
echo "Docker sandbox image ready: $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | numfmt --to=iec))"
