#!/bin/bash
# vLLM's GPU block-table and TRITON_ATTN kernel files for pagegraph.clients.vllm and
# pagegraph.clients.vllm_attention, without vLLM itself: the wheel
# (about 240 MB) goes to a temporary folder and only the files the kernels need are unpacked
# into DEST (default .venv/vllm-lite), with their paths in the wheel. It never fails: without a
# network it says so in one line, and the vLLM client tests skip.
#   usage: [PYTHON=python3] [VLLM_VERSION=0.34.0] tools/fetch_vllm_files.sh [DEST]
set -u
dest=${1:-.venv/vllm-lite}
version=${VLLM_VERSION:-0.34.0}
py=${PYTHON:-python3}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
# Keep in step with pagegraph.clients.vllm_files.KERNEL_FILES / PAD_SLOT_FILE and
# pagegraph.clients.vllm_attention.ATTENTION_FILES / BACKEND_FILE.
files='vllm/v1/worker/gpu/block_table.py vllm/v1/worker/gpu/buffer_utils.py vllm/v1/attention/backends/utils.py
vllm/v1/attention/ops/triton_reshape_and_cache_flash.py vllm/v1/attention/ops/triton_unified_attention.py
vllm/v1/attention/ops/triton_attention_helpers.py vllm/v1/attention/backends/triton_attn.py
vllm/v1/kv_cache_interface.py'
if "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$t" "vllm==$version" >/dev/null 2>&1 &&
  "$py" - "$t" "$dest" $files <<'PY'
import glob, shutil, sys, zipfile
tmp, dest, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(glob.glob(f"{tmp}/vllm-*.whl")[0]) as wheel:
    shutil.rmtree(dest, ignore_errors=True)
    for name in names:
        wheel.extract(name, dest)
PY
then
  echo "vLLM $version kernel files in $dest"
else
  echo "vLLM $version kernel files not fetched (no network or no such wheel): the vLLM client tests will skip"
fi
exit 0
