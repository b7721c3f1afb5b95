# pagegraph: make test | run | lint | bench | profile | soak | fuzz | mutate | sanitize | sglang | vllm | wild
#
# With an interpreter that already has torch, triton and pytest (a GPU machine), everything
# runs with it from src/ and nothing is installed. Otherwise a virtual environment is made in
# .venv, with the CPU build of torch 2.13.0 (found on local disk) unless a torch is already
# there, and pagegraph installed into it in place (pip install -e .): .venv/bin/pagegraph and
# the pytest plugin then work from any folder.

SHELL := /bin/bash
# One probe, at every make: whether python3 has torch, triton and pytest. It finds them
# without importing them (a torch import costs seconds on a fresh machine), so a torch that
# is installed but cannot be imported is found too: the tests then fail on it, loudly.
SYSTEM_STACK := $(shell python3 -c "from importlib.util import find_spec as f; print(all(f(m) for m in ('torch', 'triton', 'pytest')))" 2>/dev/null)
ifeq ($(SYSTEM_STACK),True)
PY := python3
SETUP :=
else
PY := .venv/bin/python
SETUP := .venv/.installed
endif
export PYTHONPATH := $(CURDIR)/src$(if $(PYTHONPATH),:$(PYTHONPATH))
export PYTHONUNBUFFERED := 1

SCENARIO ?= graphs/default.toml
# SGLang's metadata kernels, the real clients (pagegraph.clients.sglang): installed without
# its serving stack, which the kernel files do not need.
SGLANG_WHEEL ?= sglang==0.5.23
# vLLM's GPU block-table kernel files (pagegraph.clients.vllm): only those files, unpacked
# from the wheel into .venv/vllm-lite by tools/fetch_vllm_files.sh (never fails the setup).
DURATIONS ?= 15
PYTEST := $(PY) -m pytest -p no:cacheprovider --durations=$(DURATIONS)

.PHONY: test test-heavy run lint format bench profile soak fuzz mutate sanitize clean setup sglang vllm wild

setup: $(SETUP)

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/python -m pip install -q --upgrade pip
	.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
	.venv/bin/python -c "import triton" 2>/dev/null || .venv/bin/python -m pip install -q triton==3.6.0
	.venv/bin/python -m pip install -q numpy nvtx pytest pytest-xdist pytest-benchmark hypothesis matplotlib ruff mypy
	.venv/bin/python -m pip install -q --no-deps $(SGLANG_WHEEL) || echo "sglang not installed: its client tests will skip"
	PYTHON=.venv/bin/python tools/fetch_vllm_files.sh .venv/vllm-lite
	.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

# With pytest-xdist: several workers, one per CPU core (at most TEST_WORKERS, the suite's small
# kernels share a GPU) and at least one per GPU (tests/conftest.py pins each worker to one).
# The GPUs are counted from CUDA_VISIBLE_DEVICES when it is set, else by nvidia-smi, else by
# torch. Many tests mostly wait for child processes, so a worker a core pays on a GPU host
# (profiles/gpu-test.log) and on a CPU one alike (the heavy tests start first, conftest.py).
# The sm_90 compile tests come in parts, one fixture each: --dist loadgroup keeps a part in
# one worker. TEST_WORKERS=1: one process, no xdist.
TEST_WORKERS ?= 16
# The shell lines both test targets start with: g GPUs, w workers, x pytest-xdist's options.
TEST_SHELL_SETUP = if [ -n "$${CUDA_VISIBLE_DEVICES+set}" ]; then g=$$(tr ',' '\n' <<< "$$CUDA_VISIBLE_DEVICES" | grep -c '^[^-]'); \
	elif command -v nvidia-smi >/dev/null; then g=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); \
	else g=$$($(PY) -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0); fi; \
	c=$$(nproc 2>/dev/null || echo 2); w=$$(( c < $(TEST_WORKERS) ? c : $(TEST_WORKERS) )); \
	w=$$(( w > g ? w : g )); x=""; \
	if [ "$$w" -ge 2 ] && $(PY) -c "import xdist" 2>/dev/null; then x="-n $$w --dist loadgroup"; fi;
test: $(SETUP)
	@$(TEST_SHELL_SETUP) \
	m="not gpu_heavy"; if [ "$${g:-0}" -lt 1 ]; then m="not cpu_heavy"; fi; \
	echo "$(PYTEST) tests $$x -m '$$m'"; $(PYTEST) tests $$x -m "$$m"

# The tests make test leaves out: without CUDA those long under the Triton interpreter (marker
# cpu_heavy: the CPU kill tables, the fuzzers, the warm-worker and emulated-graph comparisons),
# with CUDA those over about 6 s on the H200 (marker gpu_heavy: child processes, end-to-end
# jobs, sm_90 compiles; tests/conftest.py lists them). CI on a CPU runs both targets.
test-heavy: $(SETUP)
	@$(TEST_SHELL_SETUP) \
	m="gpu_heavy"; if [ "$${g:-0}" -lt 1 ]; then m="cpu_heavy"; fi; \
	echo "$(PYTEST) tests -m $$m $$x"; $(PYTEST) tests -m $$m $$x

run: $(SETUP)
	$(PY) -m pagegraph kernel-table
	$(PY) -m pagegraph check $(SCENARIO)

# mypy --strict (pyproject.toml's [tool.mypy]) on the whole package, src/pagegraph.
lint: $(SETUP)
	$(PY) -m ruff check src tests benchmarks tools
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m mypy src/pagegraph

format: $(SETUP)
	$(PY) -m ruff format src tests benchmarks
	$(PY) -m ruff check --fix src tests benchmarks

bench: $(SETUP)
	$(PY) -m pagegraph bench --out profiles/bench
	$(PYTEST) benchmarks --benchmark-only --benchmark-json=profiles/bench/pytest-benchmark.json

# The decode step end to end (builder + paged attention in one CUDA graph, both formats: the
# verdict and the device time per bucket) and the attention against the DRAM floor.
.PHONY: bench-decode
bench-decode: $(SETUP)
	mkdir -p profiles/decode-step
	$(PY) -m pagegraph check decode-step decode-step-csr --json profiles/decode-step/decode-step.json --markdown profiles/decode-step/decode-step.md
	$(PY) -m pagegraph bench --consumer-floor --out profiles/decode-step

profile: $(SETUP)
	$(PY) -m pagegraph profile $(SCENARIO) --out profiles

SOAK_REPLAYS ?= 100000
soak: $(SETUP)
	$(PY) -m pagegraph check graphs/sglang-h200.toml --replays $(SOAK_REPLAYS) --detectors cupti --json profiles/soak-sglang-h200.json
	$(PY) -m pagegraph check graphs/swa-hybrid.toml --replays $(SOAK_REPLAYS) --detectors cupti --json profiles/soak-swa-hybrid.json

# The checker against the mutant zoo: every mutant must die, the controls stay SAFE. Builders
# run one a core, at most 12 (the checks too big for every worker at once share a few slots of
# memory: pagegraph.jobs.mutate.memory_slots). A mutant stops at its first kill, its cheap
# scenarios first; MUTATE_FLAGS=--every-scenario checks it everywhere (the whole matrix).
MUTATE_SCENARIOS ?= $(wildcard graphs/*.toml)
MUTATE_FLAGS ?=
MUTATE_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 12 ? n : 12 )))
mutate: $(SETUP)
	$(PY) -m pagegraph mutate $(MUTATE_SCENARIOS) --jobs $(MUTATE_JOBS) --json profiles/mutate.json --markdown profiles/mutate.md $(MUTATE_FLAGS)

# SGLang's metadata kernels on every scenario that fits them, and the findings' reproducers
# (examples/) run again: exit 0 when the job ran, whatever it found.
sglang: $(SETUP)
	$(PY) -m pagegraph.jobs.sglang_job --out profiles/sglang-0.5.23.md --json profiles/sglang-0.5.23.json

# vLLM's block-table gather (eager, before the graph) and slot mapping (in the graph) on every
# scenario of their kinds: exit 0 when the job ran, whatever it found.
vllm: $(SETUP)
	$(PY) -m pagegraph.jobs.vllm_job --out profiles/vllm-0.34.0.md --json profiles/vllm-0.34.0.json

# The corpus of bugs from the wild (pagegraph.wild): each entry's buggy twin UNSAFE through its
# property, its fixed twin SAFE; the table by class in profiles/wild.md, each twin's report in
# profiles/wild/. Exit 1 when an entry did not hold.
wild: $(SETUP)
	$(PY) -m pagegraph wild --markdown profiles/wild.md --json profiles/wild.json --reports profiles/wild

fuzz: $(SETUP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-gpu} $(PYTEST) tests -k "property or fuzz"

# SAN_PARALLEL=1 runs the eight tool/workload runs at once.
sanitize:
	tools/sanitize.sh

clean:
	rm -rf .venv build dist src/*.egg-info .pytest_cache .ruff_cache .hypothesis .benchmarks
