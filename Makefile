# dllm-bench: `make install` once, then `make test`. Everything runs inside .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
export OMP_NUM_THREADS ?= 2

.PHONY: install test test-fast lint regress regress-update bench-engine bench-mechanisms bench-serve bench-server \
	bench-simulate bench-validate validate-data bench bench-gpu clean train-seeds train-synth-cot train-dream accuracy-fig6 \
	docs docs-results docs-simulated docs-memory docs-measured

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

bench-simulate:
	$(BIN)/python benchmarks/bench_simulate.py

# The serving headline on the scale-similar default (docs/SERVE.md): every rate of Fig 3-4 plus
# saturation, 3 workload seeds, the engine also with the dual cache.
bench-serve:
	$(BIN)/dllm-bench serve --rps 0.25,0.5,1.0,inf --repeats 3 \
		--systems engine,engine:cache=dual,fast-dllm,sparse-dllm,dllm-cache

# `calibrate && simulate` against measured `serve` on this machine (docs/SIMULATE.md, "Validation"):
# the engine and Fast-dLLM saturated (4 cpu-default requests at once, gen 64, 2 workload seeds);
# the serve points read the speed gauge, so the validation also prints each cell at the machine's
# measured speed. VALIDATE_ID names the profile and the two runs.
VALIDATE_SYSTEMS := engine,fast-dllm
VALIDATE_SETTING := --preset cpu-default --systems $(VALIDATE_SYSTEMS) --rps inf --num-prompts 4 --gen-length 64 --repeats 2
VALIDATE_CALIBRATE := --preset cpu-default --systems $(VALIDATE_SYSTEMS) --sizes 1,2,4
ifndef VALIDATE_ID
VALIDATE_ID := validate-$(shell date -u +%Y%m%dT%H%M%SZ)
endif
bench-validate:
	$(BIN)/dllm-bench calibrate $(VALIDATE_CALIBRATE) --name $(VALIDATE_ID)
	DLLM_BENCH_SPEED_GAUGE=1 $(BIN)/dllm-bench serve $(VALIDATE_SETTING) --no-projection --run-id $(VALIDATE_ID)
	$(BIN)/dllm-bench simulate --hardware $(VALIDATE_ID) $(VALIDATE_SETTING) --run-id $(VALIDATE_ID)-sim \
		--validate $(VALIDATE_ID)

# The same check committed for tests/test_simulate_cpu_run.py: the calibration, the traced serve
# run pruned to what the test reads (config.json, metrics.csv, each point's summary.json,
# requests.jsonl and steps.jsonl) and simulate's validation.md, in VALIDATE_DATA (~12 min on 2 idle
# cores; run it on an idle machine: the test holds the simulator to 15 % tok/s, 20 % mean E2EL).
VALIDATE_DATA ?= tests/data/cpu-$(shell date -u +%Y-%m-%d)
validate-data:
	rm -rf $(VALIDATE_DATA).tmp $(VALIDATE_DATA) && mkdir -p $(VALIDATE_DATA).tmp $(VALIDATE_DATA)/points
	$(BIN)/dllm-bench calibrate $(VALIDATE_CALIBRATE) --out $(VALIDATE_DATA).tmp/calibrate.json
	DLLM_BENCH_SPEED_GAUGE=1 $(BIN)/dllm-bench serve $(VALIDATE_SETTING) --trace-steps --no-projection \
		--result-dir $(VALIDATE_DATA).tmp --run-id run
	$(BIN)/dllm-bench simulate --hardware $(VALIDATE_DATA).tmp/calibrate.json $(VALIDATE_SETTING) \
		--result-dir $(VALIDATE_DATA).tmp --run-id sim --validate $(VALIDATE_DATA).tmp/run
	cp $(VALIDATE_DATA).tmp/calibrate.json $(VALIDATE_DATA).tmp/sim/validation.md $(VALIDATE_DATA).tmp/run/config.json \
		$(VALIDATE_DATA).tmp/run/metrics.csv $(VALIDATE_DATA)/
	for p in $(VALIDATE_DATA).tmp/run/points/*; do d=$(VALIDATE_DATA)/points/$$(basename $$p); mkdir -p $$d && \
		cp $$p/summary.json $$p/requests.jsonl $$p/steps.jsonl $$d/ || exit 1; done
	printf '%s\n' "# A measured CPU serve run and the calibration taken right before it" "" \
		"Made by \`make validate-data\` at commit $$(git rev-parse --short HEAD) on $$(date -u +%Y-%m-%d) (the machine: \`config.json\`'s" \
		"environment, \`calibrate.json\`'s description). \`tests/test_simulate_cpu_run.py\` replays every point on the" \
		"calibration: the same steps as \`steps.jsonl\`, each system within 15 % tok/s and 20 % mean E2EL." "" \
		"* \`calibrate.json\`: \`dllm-bench calibrate $(VALIDATE_CALIBRATE)\`" \
		"* the run: \`DLLM_BENCH_SPEED_GAUGE=1 dllm-bench serve $(VALIDATE_SETTING) --trace-steps --no-projection\`," \
		"  pruned to \`config.json\`, \`metrics.csv\` and each point's \`summary.json\`, \`requests.jsonl\`, \`steps.jsonl\`" \
		"* \`validation.md\`: \`dllm-bench simulate --hardware calibrate.json $(VALIDATE_SETTING) --validate RUN\`" \
		> $(VALIDATE_DATA)/README.md
	rm -rf $(VALIDATE_DATA).tmp

bench: bench-engine bench-mechanisms

# The one run for a CUDA machine (docs/GPU.md): every step in one results directory with
# summary.md, sized to --time-budget (600 s unless BENCH_GPU_ARGS says otherwise). BENCH_GPU_ARGS passes options (--model DIR, --out DIR,
# --only serve-full,profile); without .venv (a machine with torch already) the system python3 runs it.
BENCH_GPU_PY := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
bench-gpu:
	$(BENCH_GPU_PY) -m dllm_bench.cli bench-gpu $(BENCH_GPU_ARGS)

# Trained models (docs/ACCURACY.md): seeds 0-2 of tiny-math and synth-cot are committed;
# `train-synth-cot` and `train-seeds` remake missing ones, one model at a time on one thread
# (synth-cot: 8,000 batch-32 steps). Existing assets are kept; the same seed gives the same weights.
SEEDS ?= 1 2
comma := ,
space := $() $()
ACC_MODELS_SYNTH ?= $(subst $(space),$(comma),tiny-math $(foreach s,$(SEEDS),tiny-math-s$(s)))
ACC_MODELS_COT ?= $(subst $(space),$(comma),synth-cot $(foreach s,$(SEEDS),synth-cot-s$(s)))
ACC_R := 0.05,0.1,0.2,0.3,0.5
train-seeds: $(foreach s,$(SEEDS),dllm_bench/assets/tiny-math-s$(s)/model.safetensors dllm_bench/assets/synth-cot-s$(s)/model.safetensors)

dllm_bench/assets/tiny-math-s%/model.safetensors:
	$(BIN)/dllm-bench train --out $(@D) --seed $* --threads 1 --force

COT_RECIPE := --task synth-cot --batch-size 32 --lr 1e-3 --steps 8000 --eval-every 1000 --threads 1 --force
train-synth-cot: dllm_bench/assets/synth-cot/model.safetensors

dllm_bench/assets/synth-cot/model.safetensors:
	$(BIN)/dllm-bench train $(COT_RECIPE) --seed 0 --out $(@D)

dllm_bench/assets/synth-cot-s%/model.safetensors:
	$(BIN)/dllm-bench train $(COT_RECIPE) --seed $* --out $(@D)

# The committed Dream (tiny-math-dream): tiny-math's recipe as a Dream, 2,000 steps.
DREAM_RECIPE := --model-type Dream --n-kv-heads 2 --steps 2000 --eval-every 250 --threads 1 --force
train-dream: dllm_bench/assets/tiny-math-dream/model.safetensors

dllm_bench/assets/tiny-math-dream/model.safetensors:
	$(BIN)/dllm-bench train $(DREAM_RECIPE) --seed 0 --out $(@D)

# Fig. 6 on both tasks with every seed, the held-out way: the scoring rule is chosen on dev and
# both rules are reported on test (docs/ACCURACY.md lists the run ids and the timings).
accuracy-fig6:
	$(BIN)/dllm-bench accuracy --model $(ACC_MODELS_SYNTH) --split dev --limit 100 --retention $(ACC_R) \
		--score-query mean,max --no-r1 --threads 1 --run-id fig6-synth-dev
	$(BIN)/dllm-bench accuracy --model $(ACC_MODELS_SYNTH) --split test --limit 200 --retention $(ACC_R) \
		--score-query mean,max --no-r1 --threads 1 --dev-run fig6-synth-dev --run-id fig6-synth-test
	$(BIN)/dllm-bench accuracy --model $(ACC_MODELS_COT) --split dev --limit 100 --retention $(ACC_R) \
		--score-query mean,max --no-r1 --threads 1 --run-id fig6-synth-cot-dev
	$(BIN)/dllm-bench accuracy --model $(ACC_MODELS_COT) --split test --limit 200 --retention $(ACC_R) \
		--score-query mean,max --no-r1 --threads 1 --dev-run fig6-synth-cot-dev --run-id fig6-synth-cot-test

# The docs' current-results tables (docs/REPORT.md): `make docs` renders each from the committed
# files it names; `make docs-results` first remakes those files, each a fresh run whose table's
# files `report --keep` copies into results/current/: the simulated ones (any machine), the memory
# runs (byte counts, any machine), then the measured ones (timings: run them on an idle machine).
DLLM := $(BIN)/dllm-bench
keep = rm -rf results/runs/$(1) && $(DLLM) $(2) --result-dir results/runs --run-id $(1) && \
	$(DLLM) report --keep results/runs/$(1)
keep_script = rm -rf results/runs/$(1) && $(BIN)/python $(2) --result-dir results/runs --run-id $(1) && \
	$(DLLM) report --keep results/runs/$(1)
PARALLEL_SIM := simulate --hardware rtx4090 --preset paper --max-num-batched-tokens 4000 --max-num-logits 2048 \
	--systems engine:cache=sparse,engine:cache=sparse,tensor_parallel_size=2 \
	--dataset livebench,osc,burstgpt --rps 1.0 --max-num-seqs 512

docs:
	$(DLLM) report --docs docs

# docs/SCHEDULER.md: phase against look-ahead at the paper's token budgets, the 4090's on the L40S,
# and parallel decoding (report table `scheduler` over results/current/scheduler-*).
SCHED_SIM = simulate --preset paper --hardware $(1) --max-num-batched-tokens $(2) --max-num-logits 2048 --max-num-seqs 512 \
	--systems engine:cache=sparse,engine:cache=sparse,scheduler=lookahead --dataset livebench,osc,burstgpt \
	--num-prompts 2000 --rps $(3)
SCHED_THRESHOLD := --decoding threshold:0.9 --steps-per-block 4,8,12,16
# docs/MEMORY.md: the longest canvas measured on tiny, and derived to LLaDA-8B from similar-1024.
MEMORY_SYSTEMS := $(subst $(space),$(comma),engine:max_num_batched_tokens=1024 \
	engine:cache=sparse,max_num_batched_tokens=1024 engine:cache=none,max_num_batched_tokens=1024 \
	engine:cache=dual,max_num_batched_tokens=1024 llada fast-dllm dllm-cache sparse-dllm)

# docs/MODELS.md: LLaDA-8B against Dream-7B (by shape) on each GPU profile, saturated on livebench:
# the engine, the three baselines and the ablation ladder's engine rungs (dllm_bench.ablate.ladder,
# the logit-budget rung at MODELS_SIM's logit budget), 3 workload seeds. Their CPU counterparts are
# docs-measured's serve-cpu-default, serve-similar-dream, ablate and ablate-similar-dream.
MODELS_SYSTEMS := engine,fast-dllm,dllm-cache,sparse-dllm,engine:scheduler=request,max_num_logits=none,cache=sparse,selection=head,engine:scheduler=phase,max_num_logits=none,cache=sparse,selection=head,engine:scheduler=phase,max_num_logits=2048,cache=sparse,selection=head
MODELS_SIM = simulate --preset paper --model $(2) --hardware $(1) --dataset livebench --rps inf --num-prompts 200 \
	--repeats 3 --max-num-logits 2048 --systems $(MODELS_SYSTEMS)

docs-simulated:
	$(call keep,parallel-rtx4090,$(PARALLEL_SIM))
	$(call keep,models-rtx4090-llada-8b,$(call MODELS_SIM,rtx4090,llada-8b))
	$(call keep,models-rtx4090-dream-7b,$(call MODELS_SIM,rtx4090,dream-7b))
	$(call keep,models-l40s-llada-8b,$(call MODELS_SIM,l40s,llada-8b))
	$(call keep,models-l40s-dream-7b,$(call MODELS_SIM,l40s,dream-7b))
	$(call keep,models-h100-llada-8b,$(call MODELS_SIM,h100,llada-8b))
	$(call keep,models-h100-dream-7b,$(call MODELS_SIM,h100,dream-7b))
	$(call keep,scheduler-l40s-16384,$(call SCHED_SIM,l40s,16384,0.5$(comma)0.6$(comma)0.7$(comma)0.8))
	$(call keep,scheduler-rtx4090-4000,$(call SCHED_SIM,rtx4090,4000,0.35$(comma)0.4$(comma)0.5$(comma)0.6))
	$(call keep,scheduler-l40s-4000,$(call SCHED_SIM,l40s,4000,0.5$(comma)0.6$(comma)0.7$(comma)0.8))
	$(call keep,scheduler-l40s-16384-threshold,$(call SCHED_SIM,l40s,16384,0.6$(comma)0.8$(comma)1.0$(comma)1.5) \
		$(SCHED_THRESHOLD))
	$(call keep,scheduler-l40s-4000-threshold,$(call SCHED_SIM,l40s,4000,0.6$(comma)0.8$(comma)1.0$(comma)1.5) \
		$(SCHED_THRESHOLD))

docs-memory:
	$(call keep,memory-tiny,memory --model tiny --memory-budget 8MiB --max-length 16384 --resolution 128 \
		--length 2048 --systems engine$(comma)engine:cache=sparse$(comma)engine:cache=none$(comma)llada$(comma)fast-dllm$(comma)dllm-cache$(comma)sparse-dllm)
	$(call keep,memory-similar-1024,memory --model similar-1024 --memory-budget 1300MiB --max-length 2048 \
		--length 2048 --resolution 128 --systems $(MEMORY_SYSTEMS) --derive llada-8b:24GiB --threads 1)

docs-measured:
	$(call keep,ablate,ablate --repeats 3)
	$(call keep,ablate-similar-dream,ablate --preset similar-dream --datasets livebench --cache-rows none \
		--num-prompts 3 --repeats 3)
	$(call keep,serve-cpu-default,serve --preset cpu-default --rps inf --num-prompts 8 --repeats 3)
	$(call keep,serve-similar-dream,serve --preset similar-dream --rps inf --num-prompts 8 --repeats 3)
	$(call keep,sweep-input-len,sweep --vary input-len --gen-length 128 --num-prompts 4 --repeats 3)
	$(call keep,sweep-output-len,sweep --vary output-len --num-prompts 2 --repeats 3)
	$(call keep,frontier-synth-cot,frontier --model synth-cot)
	rm -rf results/runs/fig6-synth-dev results/runs/fig6-synth-test results/runs/fig6-synth-cot-dev \
		results/runs/fig6-synth-cot-test
	$(MAKE) accuracy-fig6
	$(DLLM) report --keep results/runs/fig6-synth-cot-test
	$(call keep_script,bench-mechanisms,benchmarks/bench_mechanisms.py)
	$(call keep_script,bench-engine,benchmarks/bench_engine.py)
	$(call keep_script,bench-server,benchmarks/bench_server.py --repeats 3)

docs-results: docs-simulated docs-memory docs-measured
	$(MAKE) docs

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
