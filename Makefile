# Two commands set everything up from the repo's own files:
#   make book   build the book (notebooks executed) into _build/html
#   make test   run the test suite (it builds the book too), less the full compile matrix
#   make test-all   the same with the full compile matrix (tests marked slow)
# Both create .venv from requirements-dev.txt on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test test-all test-fast gpu-test gpu-check bench clean venv

venv: $(STAMP)

$(STAMP): requirements-dev.txt pyproject.toml
	@echo "First run: creating $(VENV) with the pinned environment (PyTorch, Triton, Jupyter Book;"
	@echo "about 2 GB on disk, more with a CUDA build of PyTorch). pip is quiet; this takes minutes."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# The notebooks' executions are cached by their code (_config.yml); the cache does not see the
# library under them, so it is dropped when a file of src/ is newer than its database.
NB_CACHE := _build/.jupyter_cache
book: $(STAMP)
	@if [ -f $(NB_CACHE)/global.db ] && [ -n "$$(find src -newer $(NB_CACHE)/global.db \
	    -type f -print -quit)" ]; then \
	  echo "src/ changed since the notebooks last ran: executing them all again"; \
	  rm -rf $(NB_CACHE); fi
	$(BIN)/jupyter-book build . -W -n --keep-going

# the full compile matrix is marked slow: what cuda_attention ships still compiles here through NVRTC (the
# runtime's compiler) for sm_75, sm_80 and sm_90a, and every kernel file at its defaults through nvcc.
# The tests spread over the cores (pytest-xdist, -n auto); the book builds once, beside them.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n auto

# everything, the full compile matrix included
test-all: $(STAMP)
	$(BIN)/python -m pytest -n auto

# everything but the book build and the browser test
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not book and not slow" -n auto

# on a GPU machine whose python already has torch/triton/cupy (no venv). Triton autotuning is
# off (each kernel compiles its first configuration) so the suite takes minutes, not an hour of
# compiles; the benchmark (python -m flashtut.bench) autotunes.
gpu-test:
	PYTHONPATH=src FLASHTUT_TRITON_AUTOTUNE=0 $(PYTHON) -m pytest -m gpu -q -rfE

# the default benchmark sweep of this machine (the protocol on a GPU, a scaled-down one on the CPU),
# then its figures
bench: $(STAMP)
	$(BIN)/python -m flashtut.bench run --out bench-results.json
	$(BIN)/python -m flashtut.figures plot bench-results.json --out-dir bench-figures

# the whole GPU check (tests, compute-sanitizer, protocol sweep; STAGES= picks) into $(OUT)
OUT ?= .gpu_out
gpu-check:
	OUT=$(OUT) bash tools/gpu_check.sh

clean:
	rm -rf _build .pytest_cache bench-figures
