#!/usr/bin/env bash
# Usage: tools/sanitize.sh (what make sanitize runs); TOOLS="memcheck ...", MODES="kernel graphs",
#        SAN_TIMEOUT=600, SAN_PARALLEL=1 and PY=python3 narrow or change the runs.
# The kernel and graph workloads under compute-sanitizer, one tool per run. SAN_PARALLEL=1
# starts every run at once (each is its own process and CUDA context on the one GPU), so the
# whole matrix takes as long as its slowest run.
# Prints one summary line per tool and run; exits non-zero if any run reported an error.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
CS=$(command -v compute-sanitizer || find /usr/local/cuda*/bin /opt/nvidia -name compute-sanitizer -type f 2>/dev/null | head -n 1)
if [ -z "$CS" ]; then
  echo "make sanitize needs a CUDA GPU and the CUDA toolkit's compute-sanitizer, not found on PATH or under /usr/local/cuda*/bin"
  exit 2
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

one_run() {  # tool mode: run it, leave its log, exit status and seconds in $logs
  local tool=$1 mode=$2 cache start
  # kernel: exact-size allocations; graphs: the caching allocator (graph pools need it).
  # torch reads the variable's presence, so it is set or unset, never "0".
  if [ "$mode" = kernel ]; then cache=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1); else cache=(env -u PYTORCH_NO_CUDA_MEMORY_CACHING); fi
  start=$(date +%s)
  "${cache[@]}" timeout "${SAN_TIMEOUT:-600}" "$CS" --tool "$tool" --error-exitcode 99 \
    --print-limit 20 "$PY" tools/sanitize_workload.py "$mode" >"$logs/$tool.$mode.log" 2>&1
  echo $? >"$logs/$tool.$mode.rc"
  echo $(( $(date +%s) - start )) >"$logs/$tool.$mode.s"
}

runs=()
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  for mode in ${MODES:-kernel graphs}; do
    runs+=("$tool $mode")
    if [ "${SAN_PARALLEL:-0}" = 1 ]; then one_run "$tool" "$mode" & else one_run "$tool" "$mode"; fi
  done
done
wait
status=0
for run in "${runs[@]}"; do
  set -- $run
  log="$logs/$1.$2.log"
  rc=$(cat "$logs/$1.$2.rc")
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
  echo "sanitize $1/$2: rc=$rc ${summary:-no summary} ($(cat "$logs/$1.$2.s")s)"
  if [ "$rc" -ne 0 ]; then status=1; tail -n 40 "$log"; fi
done
exit $status
