#!/usr/bin/env bash
# Usage: tools/sanitize.sh (what make sanitize runs); TOOLS="memcheck ...", MODES="kernel graphs",
#        SAN_TIMEOUT=600 and PY=python3 narrow or change the runs.
# The kernel and graph workloads under compute-sanitizer, one tool per run.
# Prints one summary line per tool and run; exits non-zero if any run reported an error.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
CS=$(command -v compute-sanitizer || find /usr/local/cuda*/bin /opt/nvidia -name compute-sanitizer -type f 2>/dev/null | head -n 1)
if [ -z "$CS" ]; then echo "compute-sanitizer not found"; exit 2; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
status=0
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  for mode in ${MODES:-kernel graphs}; do
    log=$(mktemp)
    # kernel: exact-size allocations; graphs: the caching allocator (graph pools need it).
    # torch reads the variable's presence, so it is set or unset, never "0".
    if [ "$mode" = kernel ]; then cache=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1); else cache=(env -u PYTORCH_NO_CUDA_MEMORY_CACHING); fi
    start=$(date +%s)
    "${cache[@]}" timeout "${SAN_TIMEOUT:-600}" "$CS" --tool "$tool" --error-exitcode 99 \
      --print-limit 20 "$PY" tools/sanitize_workload.py "$mode" >"$log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
    echo "sanitize $tool/$mode: rc=$rc ${summary:-no summary} ($(( $(date +%s) - start ))s)"
    if [ $rc -ne 0 ]; then status=1; tail -n 40 "$log"; fi
    rm -f "$log"
  done
done
exit $status
