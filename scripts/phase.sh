# Sourced by the set-up scripts: `phase LABEL COMMAND...` runs one set-up phase with its output in the
# set-up log and prints one line, `LABEL … N s`; on failure it prints the log's last lines and its path.
SETUP_LOG=${SETUP_LOG:-$PWD/.setup.log}
phase() {
  local label=$1 start=$SECONDS status=0
  shift
  echo "== $label ($(date '+%F %T'))" >>"$SETUP_LOG"
  "$@" >>"$SETUP_LOG" 2>&1 || status=$?
  if [ "$status" = 0 ]; then
    printf '%s … %d s\n' "$label" $((SECONDS - start))
  else
    printf '%s failed after %d s (exit %d); the last lines of %s:\n' "$label" $((SECONDS - start)) "$status" "$SETUP_LOG" >&2
    tail -n 15 "$SETUP_LOG" | sed 's/^/  /' >&2
  fi
  return "$status"
}
