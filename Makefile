# Every target installs what it needs, so each works on a fresh machine.
PYTHON ?= python3
# pytest-xdist workers for the unit tests (make test TEST_WORKERS=8 on a bigger machine)
TEST_WORKERS ?= 2

.PHONY: install test unit integration lint binaries prometheus demo bench cluster-up cluster-down kind

install:  ## the package, its test tools and the trace extra (torch), in editable mode
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test,trace]'

lint: install  ## ruff, the import contracts that keep the core pure and layered, mypy
	$(PYTHON) -m ruff check controller tests e2e benchmarks
	lint-imports
	$(PYTHON) -m mypy

unit: install
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --maxschedchunk 1 tests/unit

binaries:  ## etcd, kube-*, kwok, helm, kubectl from the Go module proxy (cached)
	$(PYTHON) -m e2e.build

prometheus: install  ## prometheus and promtool: the distribution's package (apt, as root), if missing
	$(PYTHON) -m e2e.prometheus install

integration: install binaries prometheus
	$(PYTHON) -m pytest tests/integration

# Unit tests first, on TEST_WORKERS processes (tests/unit/conftest.py puts the long trace
# tests first so the workers share them), then the integration tests in one process: they
# share one control plane, and their timings want the CPU it leaves. Both run whatever the
# other's result; the target fails if either does.
test: install lint binaries prometheus  ## the whole suite: unit and integration against a real API server
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --maxschedchunk 1 tests/unit; unit=$$?; \
	$(PYTHON) -m pytest tests/integration; integration=$$?; \
	exit $$(( unit || integration ))

bench: install
	$(PYTHON) -m benchmarks.bench_estimator

cluster-up: install binaries
	$(PYTHON) -m e2e.cluster up

cluster-down:
	$(PYTHON) -m e2e.cluster down

kind: install binaries  ## the image and the chart on a kind cluster (needs Docker and kind; else skipped)
	$(PYTHON) -m e2e.kind

demo: install binaries prometheus  ## control plane, simulated GPUs, agents, operator, Prometheus, example jobs; Ctrl-C stops all
	$(PYTHON) -m e2e.demo
