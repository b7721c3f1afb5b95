#!/usr/bin/env bash
# Try FlashInfer's XQA decode kernel on pagegraph's page table (see tools/xqa_try.py).
# On the GPU machine, from the repo root:  source .device/prelude.sh && bash tools/xqa_try.sh
# Unpacks .device/xqa/flashinfer-slim.tgz to /tmp/fi, installs its apache-tvm-ffi wheel there
# (no network needed), then runs the check under a 480 s timeout. Full log: $OUT/xqa_try.log.
# Env knobs passed through: XQA_PAGE_SIZES (default 64,16), XQA_MODULE (jit|prebuilt),
# XQA_REPLAYS, MAX_JOBS.
set -u
cd "$(dirname "$0")/.." || exit 1
FI=/tmp/fi
TGZ=.device/xqa/flashinfer-slim.tgz
LOG_DIR="${OUT:-/tmp}"
mkdir -p "$LOG_DIR" "$FI"
echo "xqa_try.sh: unpacking $TGZ ($(du -h "$TGZ" 2>/dev/null | cut -f1)) to $FI"
rm -rf "$FI/flashinfer-slim" "$FI/site"
tar -xzf "$TGZ" -C "$FI" || { echo "xqa_try.sh: FAILED to unpack $TGZ"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$FI/site" "$FI"/flashinfer-slim/wheels/*.whl \
  || { echo "xqa_try.sh: FAILED to install the carried wheels"; exit 1; }
# nvidia-ml-py (pynvml, imported by flashinfer.utils) and typing_extensions>=4.13 (tvm_ffi needs
# get_annotations) are in the machine's image; install the carried copies only if they are not.
if ! python3 -c "import pynvml" 2>/dev/null; then
  echo "xqa_try.sh: pynvml missing, installing the carried nvidia-ml-py"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$FI/site" "$FI"/flashinfer-slim/optional-wheels/nvidia_ml_py-*.whl
fi
if ! python3 -c "from typing_extensions import get_annotations" 2>/dev/null; then
  echo "xqa_try.sh: typing_extensions too old or missing, installing the carried one"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$FI/site" "$FI"/flashinfer-slim/optional-wheels/typing_extensions-*.whl
fi
export PYTHONPATH="$FI/flashinfer-slim/pkg:$FI/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export XQA_SLIM="$FI/flashinfer-slim"
set -o pipefail
timeout -k 10 ${XQA_TIMEOUT:-480} python3 tools/xqa_try.py "$@" 2>&1 | tee "$LOG_DIR/xqa_try.log"
rc=$?
echo "xqa_try.sh: exit code $rc (124 = killed by the 480 s timeout); full log $LOG_DIR/xqa_try.log"
exit $rc
