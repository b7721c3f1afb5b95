#!/usr/bin/env bash
# Usage: tools/gpu_validate.sh OUT_DIR STEP...   (e.g. tools/gpu_validate.sh /tmp/v test bench)
# Run the GPU-side validation steps and keep every log under one folder.
# Steps: env test launch run sync traces scenarios profile bench bench-sections tune sanitize
#        soak soak-short fuzz mutate
# Time limits: LIMIT_<step> overrides a step's default (seconds), e.g. LIMIT_test=170.
# Each step has its own time limit, logs to OUT_DIR/STEP.log and prints a summary line, so a
# slow or failing step never hides the others.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
mkdir -p "$out"
PY=${PY:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # name limit command...
  local name=$1 limit=$2; shift 2
  local override="LIMIT_${name//[^A-Za-z0-9_]/_}"  # e.g. analyze_nsys_clean.sqlite
  limit=${!override:-$limit}
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s"
  tail -n "${TAILN:-6}" "$out/$name.log"
}

nsys_trace() {  # name mode
  nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node \
    --force-overwrite=true -o "$out/$1" "$PY" tools/record_test_traces.py "$2" &&
  nsys export --type sqlite --force-overwrite=true -o "$out/$1.sqlite" "$out/$1.nsys-rep"
}

export -f nsys_trace
export out PY

for s in "$@"; do
  case $s in
    env) step env 30 bash -c "nvidia-smi; $PY -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'; which nsys compute-sanitizer; $PY -m pip list 2>/dev/null | grep -i -E 'nvtx|cupti|xdist|cuda-python|cuda-bindings'" ;;
    test) TAILN=25 step test 270 make test ;;
    launch) TAILN=45 step launch 90 "$PY" benchmarks/test_launch_overhead.py ;;
    run) TAILN=30 step run 180 make run ;;
    sync) TAILN=25 step sync 60 "$PY" -m pagegraph sync-table --json "$out/sync.json" ;;
    traces)
      step trace_clean 75 bash -c "nsys_trace nsys_clean clean"
      step trace_planted 75 bash -c "nsys_trace nsys_planted planted"
      step trace_torch 60 "$PY" tools/record_test_traces.py torch "$out"
      for f in nsys_clean.sqlite nsys_planted.sqlite torch_clean.json torch_planted.json; do
        step "analyze_$f" 30 "$PY" -m pagegraph trace "$out/$f" --forbid-sync 'replay/*'
      done ;;
    scenarios) TAILN=12 step scenarios 420 "$PY" -m pagegraph check graphs/*.toml --json "$out/scenarios.json" --markdown "$out/scenarios.md"
      step host_max 120 "$PY" -m pagegraph check graphs/sglang-h200.toml --replays 50 --builder host_max_gather ;;
    profile) TAILN=20 step profile 240 "$PY" -m pagegraph profile graphs/default.toml --out "$out/profile" ;;
    bench) TAILN=60 step bench 600 "$PY" -m pagegraph bench --out "$out/bench" ;;
    bench-sections)  # only the replay-overhead, decode-metadata and checker sections
      TAILN=60 step bench_sections 420 "$PY" -m pagegraph bench --only replay metadata checker --out "$out/bench_sections" ;;
    tune) TAILN=60 step tune 300 "$PY" -m pagegraph bench --tune --out "$out/tune" ;;
    sanitize) TAILN=12 step sanitize 540 tools/sanitize.sh ;;
    soak) TAILN=40 step soak 540 make soak ;;
    soak-short)  # SOAK_REPLAYS per scenario, the same checks as make soak
      r=${SOAK_REPLAYS:-2000}
      TAILN=16 step soak_sglang 240 "$PY" -m pagegraph check graphs/sglang-h200.toml --replays "$r" --detectors torch,cupti --json "$out/soak_sglang.json"
      TAILN=16 step soak_swa 240 "$PY" -m pagegraph check graphs/swa-hybrid.toml --replays "$r" --detectors cupti --json "$out/soak_swa.json" ;;
    fuzz) TAILN=10 step fuzz 300 make fuzz ;;
    mutate)  # the kill table over every shipped scenario, MUTATE_REPLAYS a scenario
      TAILN=50 step mutate 420 "$PY" -m pagegraph mutate graphs/*.toml --jobs "${MUTATE_JOBS:-8}" \
        --replays "${MUTATE_REPLAYS:-60}" --timeout "${MUTATE_TIMEOUT:-120}" \
        --json "$out/mutate.json" --markdown "$out/mutate.md" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
