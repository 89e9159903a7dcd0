# mv_assets — the two commands of the quick start are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
export LANCE_LOG ?= error
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: install lint test test-fast test-spark demo demo-append demo-python demo-stop bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,connect,lint]"
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

## Linters: ruff (pyflakes, isort, bugbear, tidy-imports), pyright (standard), import contracts.
lint: install
	$(VENV)/bin/ruff check mv_assets tests bench definitions.py
	$(VENV)/bin/pyright
	$(VENV)/bin/lint-imports

## Full suite (after the linters): pure planning, real Lance, real Spark, property tests, doctests.
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

## Quick loop: everything that does not start a JVM.
test-fast: install
	$(PY) -m pytest -m "not spark and not e2e" $(PYTEST_ARGS)

## Only the Spark tests.
test-spark: install
	$(PY) -m pytest -m spark $(PYTEST_ARGS)

DEMO_PORT ?= 3000
DEMO_SPARK_PORT ?= 15002
DEMO_LOCAL_BELOW_ROWS ?= 1000
## Seed the demo catalog and start the Dagster UI (webserver + daemon, sensors on).
## The demo's dagster.yaml (immediate run launch) and Spark Connect server are its own:
## anything else found on those paths or ports is refused, never reused.
demo: install
	$(PY) -m mv_assets.demo seed
	$(PY) -m mv_assets.dagster.devserver prepare $(CURDIR)/.demo/dagster_home $(DEMO_PORT)
	@REMOTE=$$($(PY) -m mv_assets.execution.connect_server start --port $(DEMO_SPARK_PORT) --state-dir .demo/spark-connect) || exit 1; \
	echo ""; \
	echo "  mv_assets demo: Dagster UI at http://127.0.0.1:$(DEMO_PORT)"; \
	echo "  Spark: $${REMOTE:-local JVM per run} (refreshes of <= $(DEMO_LOCAL_BELOW_ROWS) rows run in the run process)"; \
	echo "  The documents_changes sensor refreshes the views; change the source with 'make demo-append'."; \
	echo ""; \
	echo $$$$ > .demo/dagster.pid; \
	exec env DAGSTER_HOME=$(CURDIR)/.demo/dagster_home MV_ASSETS_DB=$(CURDIR)/.demo/catalog MV_ASSETS_VIEWS=mv_assets.demo \
		MV_ASSETS_SPARK_REMOTE=$$REMOTE \
		MV_ASSETS_LOCAL_BELOW_ROWS=$(DEMO_LOCAL_BELOW_ROWS) \
		DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=$${DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS:-1} \
		DAGSTER_EVENT_BATCH_SIZE=$${DAGSTER_EVENT_BATCH_SIZE:-1000} \
		$(VENV)/bin/dagster dev -h 127.0.0.1 -p $(DEMO_PORT) -w workspace.yaml

## Append, update and delete demo source rows (the running sensor picks them up).
demo-append: install
	MV_ASSETS_DB=$(CURDIR)/.demo/catalog $(PY) -m mv_assets.demo change

## The engine walkthrough from Python, without Dagster.
demo-python: install
	$(PY) -m mv_assets.demo

bench: install
	$(PY) bench/bench_refresh.py
	$(PY) bench/bench_backfill.py
	$(PY) bench/bench_dagster.py
	$(PY) bench/bench_demo_ui.py
	$(PY) bench/bench_scale.py
	$(PY) bench/bench_checkpoints.py
	$(PY) bench/bench_small_refresh.py
	$(PY) bench/bench_partitions.py
	$(PY) bench/bench_lancedb.py
	$(PY) bench/bench_chunks.py
	$(PY) bench/bench_udtf.py
	$(PY) bench/bench_search.py

## Stop the demo: its Dagster UI (webserver, daemon, code servers) and its Spark Connect server.
demo-stop:
	$(PY) -m mv_assets.dagster.devserver stop .demo/dagster.pid
	$(PY) -m mv_assets.execution.connect_server stop --state-dir .demo/spark-connect

clean:
	rm -rf $(VENV) .demo .pytest_cache .hypothesis .spark-connect
