# Sourced by the set-up scripts: `step || missing "what failed; how to get it"` for a component that
# only some tests need. Those tests then skip, unless SRT_REQUIRE_ALL=1 (set by .ci/run): there a
# failed step stops the set-up, so that no integration's tests vanish into skips on a green run.
missing() {
  if [ "${SRT_REQUIRE_ALL:-0}" = 1 ]; then
    echo "error: $1 (SRT_REQUIRE_ALL=1: every integration's tests must run)" >&2
    exit 1
  fi
  echo "note: $1; its tests will skip" >&2
}
