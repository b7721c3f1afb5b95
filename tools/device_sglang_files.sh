#!/usr/bin/env bash
# Copy the SGLang 0.5.23 kernel files pagegraph loads by path into .device/sglang-lite/, with
# their wheel paths (sglang/kernels/ops/attention/<name>.py), for a machine without sglang:
# PYTHONPATH=.device/sglang-lite makes them findable (pagegraph.clients.sglang finds the
# folder with importlib.util.find_spec("sglang"), never importing the package).
#
#   tools/device_sglang_files.sh [SOURCE]
#
# SOURCE: an sglang wheel (.whl) or a folder holding sglang/; default: the installed sglang
# of $PY (the repo's .venv python), else /tmp/wheels/sglang-0.5.23-*.whl.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
SUB=sglang/kernels/ops/attention
# builders (pagegraph.clients.sglang.KERNEL_FILES) + the triton_decode reader's
# (pagegraph.clients.sglang_attention.ATTENTION_FILES)
FILES="trtllm_mha_page_table trtllm_mha_graph_metadata kv_indices metadata pa_page_table decode_attention score_mod"
DEST=.device/sglang-lite
src=${1:-}
if [ -z "$src" ]; then
  src=$("$PY" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("sglang"); print(pathlib.Path(list(s.submodule_search_locations)[0]).parent if s else "")' 2>/dev/null || true)
fi
if [ -z "$src" ]; then
  src=$(ls /tmp/wheels/sglang-0.5.23-*.whl 2>/dev/null | head -1 || true)
fi
[ -n "$src" ] || { echo "no sglang found: pass a wheel or a folder holding sglang/" >&2; exit 1; }
mkdir -p "$DEST/$SUB"
for f in $FILES; do
  if [ -d "$src" ]; then
    cp "$src/$SUB/$f.py" "$DEST/$SUB/$f.py"
  else
    unzip -p "$src" "$SUB/$f.py" > "$DEST/$SUB/$f.py"
  fi
  echo "$SUB/$f.py"
done
echo "-> $DEST (from $src)"
