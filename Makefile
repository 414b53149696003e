# Every target installs what it needs, so each works on a fresh machine.
PYTHON ?= python3
# pytest-xdist workers for the unit tests (make test TEST_WORKERS=8 on a bigger machine)
TEST_WORKERS ?= 2

# The locks: every package pinned with its hashes, resolved for Python 3.11 on x86_64 Linux.
# requirements/dev.txt is what `make install` installs (the package's dependencies, its test
# tools, the trace extra); runtime.txt and trace.txt are the image's (Dockerfile). The package's
# own ranges in pyproject.toml stay open for users. `make lock` re-resolves after a change to
# them, keeping every pin that still fits; `make lock-upgrade` moves every pin to the newest
# release. Then `make test`, and commit the locks with the change.
LOCK_TOOL ?= uv==0.13.9
LOCK_FLAGS ?=
LOCK_INPUTS = pyproject.toml requirements/build.in
LOCK_COMPILE = $(PYTHON) -m uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-unknown-linux-gnu --custom-compile-command 'make lock' $(LOCK_FLAGS)
PIP = $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: install lock lock-upgrade test unit integration lint binaries prometheus demo bench cluster-up cluster-down kind

# The locked versions, each file checked against its hash, then the package alone (editable,
# built by the locked setuptools).
install:  ## the locked test environment (requirements/dev.txt), then the package in editable mode
	$(PIP) --require-hashes --no-deps -r requirements/dev.txt
	$(PIP) --no-deps --no-build-isolation -e .

lock:  ## re-resolve requirements/*.txt after a change to pyproject.toml's dependencies
	$(PIP) '$(LOCK_TOOL)'
	$(LOCK_COMPILE) --extra test --extra trace -o requirements/dev.txt $(LOCK_INPUTS)
	$(LOCK_COMPILE) -c requirements/dev.txt -o requirements/runtime.txt $(LOCK_INPUTS)
	$(LOCK_COMPILE) -c requirements/dev.txt --extra trace -o requirements/trace.txt $(LOCK_INPUTS)

lock-upgrade:  ## every pin in requirements/*.txt to the newest release pyproject.toml allows
	$(MAKE) lock LOCK_FLAGS=--upgrade

lint: install  ## ruff, the import contracts that keep the core pure and layered, mypy
	$(PYTHON) -m ruff check controller tests e2e benchmarks scripts
	$(PYTHON) -m ruff format --check .
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
