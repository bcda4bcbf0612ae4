# dllm-bench: `make install` once, then `make test`. Everything runs inside .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
export OMP_NUM_THREADS ?= 2

.PHONY: install test test-fast lint regress regress-update bench-engine bench-mechanisms bench-serve bench-server bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# On a CUDA machine keep the torch that is already there; without CUDA install the CPU build
# of torch $(TORCH_VERSION) first (pip finds it locally), so nothing pulls a multi-GB CUDA wheel.
install: $(BIN)/python
	@if $(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
		echo "CUDA torch present: keeping it"; \
	elif $(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
		echo "system CUDA torch found: reusing it in the venv"; \
		rm -rf $(VENV); $(PY) -m venv --system-site-packages $(VENV); $(BIN)/pip install -q --upgrade pip; \
	else \
		$(BIN)/pip install -q torch==$(TORCH_VERSION); \
	fi
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/python -c "from dllm_bench.accuracy.lm_eval_hook import write_pth; print('wrote', write_pth())"
	@echo "installed: activate with 'source $(VENV)/bin/activate' (or call $(BIN)/dllm-bench)"

test:
	$(BIN)/python -m pytest -x -p no:cacheprovider -n 2 tests
	$(MAKE) regress

test-fast:
	$(BIN)/python -m pytest -x -q -m "not slow" tests

lint:
	$(BIN)/ruff check dllm_bench engine baselines workloads tests benchmarks

regress:
	$(BIN)/python -m dllm_bench.regression check

regress-update:
	$(BIN)/python -m dllm_bench.regression update

bench-engine:
	$(BIN)/python benchmarks/bench_engine.py

bench-mechanisms:
	$(BIN)/python benchmarks/bench_mechanisms.py

bench-server:
	$(BIN)/python benchmarks/bench_server.py

bench-serve:
	$(BIN)/dllm-bench serve --rps 0.25,0.5,1.0

bench: bench-engine bench-mechanisms

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
