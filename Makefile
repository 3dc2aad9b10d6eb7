# Two commands on a fresh clone:  make study   and   make test
# Each bootstraps .venv from the package index on first use.

PYTHON     ?= python3
VENV       ?= .venv
# What .venv gets (README "Install"); switching on one clone: make clean-venv first.
#   STACK=cpu     torch 2.13.0 + Triton 3.7.1 (constraints-cpu.txt): the CPU tier, CI. A CPU-only
#                 torch: TORCH_INDEX=https://download.pytorch.org/whl/cpu (the index's is the CUDA build)
#   STACK=nvidia  what the H200 measured: torch 2.11.0 (CUDA 13.0) + Triton 3.6.0 and the gpu
#                 extra (QuACK, CuTe DSL, FlashInfer, SGLang's JIT deps) (constraints-gpu.txt)
#   STACK=node    the node's own PyTorch and Triton (VENV_FLAGS=--system-site-packages; ROCm:
#                 no ROCm torch is on the index): only the toolchain is installed (constraints.txt)
STACK      ?= cpu
ifeq ($(STACK),nvidia)
CONSTRAINTS ?= constraints-gpu.txt
TORCH_SPEC ?= torch==2.11.0
EXTRAS     ?= notebooks,test,peers,gpu
else ifeq ($(STACK),node)
CONSTRAINTS ?= constraints.txt
TORCH_SPEC ?=
EXTRAS     ?= notebooks,test,peers
VENV_FLAGS ?= --system-site-packages
else ifeq ($(STACK),cpu)
CONSTRAINTS ?= constraints-cpu.txt
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= notebooks,test,peers
else
$(error STACK must be cpu, nvidia or node, got '$(STACK)')
endif
TORCH_INDEX ?=
VENV_FLAGS ?=
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.installed
NBVAL      := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg
# The peer cache as one absolute folder for every process started here (nbval's kernels
# run in notebooks/, where a relative path would name another folder).
ifneq ($(ROPE_PEERS_DIR),)
export ROPE_PEERS_DIR := $(abspath $(patsubst ~/%,$(HOME)/%,$(ROPE_PEERS_DIR)))
endif

.PHONY: study test test-newest test-gpu notebooks lab clean-venv

$(STAMP): pyproject.toml constraints.txt $(CONSTRAINTS)
	@echo "Installing the study's environment ($(STACK)) into $(VENV) (once; 2-4 min measured, README Quick start) ..."
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(TORCH_SPEC),$(PY) -m pip install -q -c $(CONSTRAINTS) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)")
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	$(PY) -m ipykernel install --sys-prefix --name rope-study --display-name "Python (rope-study)" >/dev/null
	@echo "Installed; the notebooks' kernel is \"Python (rope-study)\"."
	touch $@

# Run every notebook for this machine's device; reports/<device>/, data/<device>/.
# Writes nothing git tracks unless this device's results are committed; ARGS=--verbose
# streams every cell's output.
# The engines' pinned peer files come first (the headline peers are absent without them);
# offline, it stops with one line saying how; PEERS=skip runs without them.
PEERS      ?= fetch
study: $(STAMP)
ifneq ($(PEERS),skip)
	@out=$$($(PY) -m rope_kernels peers fetch 2>&1) || { echo "make study: the engines' peer files could not be fetched ($$(echo "$$out" | tail -n 1)); offline: python -m rope_kernels peers fetch --wheels DIR (the pinned vLLM/SGLang wheels), or copy a fetched .peers/ here (or set ROPE_PEERS_DIR), or make study PEERS=skip" >&2; exit 2; }
endif
	$(PY) -m rope_kernels run $(ARGS)

# CPU tier (Triton interpreter) + nbval regression of the notebooks.
test: $(STAMP)
	@$(PY) -m rope_kernels peers fetch || echo "make test: the engines' pinned peer files could not be fetched; their tests skip" >&2
	TRITON_INTERPRET=1 $(PY) -m pytest -q tests
	TRITON_INTERPRET=1 $(PY) -m pytest -q $(NBVAL) notebooks

# The same tests (pytest + nbval) with the newest torch (and the Triton it requires) on the
# index, in their own venv: the stored outputs must not depend on the torch build. Not in CI
# (a third full pass); a pip cap (pip config's constraint) still applies.
NEWEST_VENV ?= .venv-newest
test-newest:
	$(MAKE) test VENV=$(NEWEST_VENV) CONSTRAINTS=constraints.txt TORCH_SPEC=torch

# The same tests compiled for the GPU, plus the GPU tier (large shapes, graphs, profiler).
test-gpu: $(STAMP)
	$(PY) -m pytest -q tests

# Re-execute the notebooks with their default (CPU) parameters and store the outputs nbval compares.
notebooks: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m rope_kernels refresh-notebooks

# JupyterLab in the study's environment; the kernel "Python (rope-study)" is registered.
# Without a GPU the notebooks' kernels run in Triton's interpreter, which Triton picks when
# a kernel is defined: the kernel process gets TRITON_INTERPRET=1 from the start.
lab: $(STAMP)
	$(if $(filter 0,$(shell $(PY) -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)),TRITON_INTERPRET=1,) $(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

clean-venv:
	rm -rf $(VENV) $(NEWEST_VENV)
