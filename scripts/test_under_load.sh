#!/usr/bin/env bash
# Run CI's command (.ci/run) beside LOAD busy loops (default 2), RUNS times (default 1), and say how each run
# ended and how long it took: the suite must pass on a machine that is doing other work too.
#   LOAD=2 RUNS=3 bash scripts/test_under_load.sh
set -uo pipefail
cd "$(dirname "$0")/.."
LOAD=${LOAD:-2}
RUNS=${RUNS:-1}
hogs=()
stop_hogs() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done; }
trap stop_hogs EXIT
for _ in $(seq "$LOAD"); do
  (while :; do :; done) &
  hogs+=($!)
done
echo "$LOAD busy loop(s) running: ${hogs[*]}"
failed=0
for run in $(seq "$RUNS"); do
  log=$(mktemp --suffix=.log)
  start=$(date +%s)
  bash .ci/run >"$log" 2>&1
  rc=$?
  echo "run $run/$RUNS: exit $rc in $(( $(date +%s) - start )) s ($(grep -oE '[0-9]+ (passed|failed)[^=]*' "$log" | tr '\n' ';')) log: $log"
  [ "$rc" = 0 ] || failed=1
done
exit $failed
