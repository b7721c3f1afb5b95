#!/bin/bash
# Copies the vLLM files pagegraph's engine clients load (the block-table kernels and the
# TRITON_ATTN reader: pagegraph.clients.vllm_attention.DEVICE_FILES) into DEST (default
# .device/vllm-lite), which the device machine (no network) carries with the working tree.
# SOURCE: a vllm-*.whl, or a folder holding vllm/ (default .venv/vllm-lite, which
# tools/fetch_vllm_files.sh fills). Exit 1 when a file is missing from SOURCE.
#   usage: [PYTHON=python3] tools/device_engine_files.sh [SOURCE] [DEST]
set -eu
src=${1:-.venv/vllm-lite}
dest=${2:-.device/vllm-lite}
py=${PYTHON:-python3}
PYTHONPATH=src "$py" - "$src" "$dest" <<'PY'
import shutil, sys, zipfile
from pathlib import Path

from pagegraph.clients.vllm_attention import DEVICE_FILES

src, dest = Path(sys.argv[1]), Path(sys.argv[2])
missing = []
wheel = zipfile.ZipFile(src) if src.is_file() else None
for name in DEVICE_FILES:
    target = dest / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if wheel is not None:
        if name not in wheel.namelist():
            missing.append(name)
            continue
        target.write_bytes(wheel.read(name))
    elif (src / name).is_file():
        shutil.copyfile(src / name, target)
    else:
        missing.append(name)
if missing:
    sys.exit(f"not in {src}: {', '.join(missing)}")
print(f"{len(DEVICE_FILES)} vLLM files in {dest}")
PY
