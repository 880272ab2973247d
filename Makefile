# The two commands the README promises on a fresh machine: `make demo` and `make test`.
# Each one creates .venv, installs the pinned dependencies and provisions CRIU before running.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-gpu test-quick test-cgroup2 lint typecheck criu prometheus chromium slurm venv clean bench docs

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

criu: $(STAMP)
	$(PY) -m tidal.mechanisms.criu.provision

# Prometheus (Debian's package), which tests/system/test_metrics.py scrapes a live control plane with: installed
# where missing (as root, non-interactive), its own service never started.
prometheus:
	sh tests/tools/provision-prometheus.sh

# Chromium (Debian's package), the real browser tests/system/test_dashboard.py drives with Playwright (which
# downloads no browser): installed where missing (as root, non-interactive).
# Where it cannot be installed, the suite goes on and those tests are skipped, saying why.
chromium:
	sh tests/tools/provision-chromium.sh || echo "[chromium] not installed: the dashboard's browser tests will be skipped"

# Slurm, munge, and slurmdbd with MariaDB for Slurm's accounting (Debian's packages), which
# tests/system/test_slurm.py runs temporary clusters with: installed where missing (as root, non-interactive), the
# packages' own services never started. Where only slurmdbd or MariaDB cannot be installed, the tests that need
# accounting are skipped, saying why.
slurm:
	sh tests/tools/provision-slurm.sh

# ruff, mypy, and the import contracts of pyproject.toml ([tool.importlinter]: the layers and the CLI's door
# to the control plane).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache --no-logo

test: criu prometheus chromium slurm lint
	$(PY) -m pytest -p no:cacheprovider --durations=15 --ignore=tests/gpu tests

# The GPU tests (tests/gpu), on a machine with an NVIDIA GPU; skipped, saying why, where there is none.
# The venv's torch is the CPU build: GPU_PYTHON is a Python with CUDA torch and Tidal's dependencies
# (e.g. `make test-gpu GPU_PYTHON=/opt/torch/bin/python3`), with this checkout's src on its path.
GPU_PYTHON ?= $(PY)
test-gpu: $(if $(filter $(PY),$(GPU_PYTHON)),criu)
	PYTHONPATH=$(CURDIR)/src:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m pytest -p no:cacheprovider \
		-rs -v --durations=10 tests/gpu

# Everything but the tests marked slow (DDP, torch, demos, chaos): a few minutes, for working on the code.
test-quick: criu prometheus chromium slurm lint
	$(PY) -m pytest -p no:cacheprovider -m "not slow" --ignore=tests/gpu tests

# The ranks' and the agent's integration tests again, in a cgroup2-only view of this machine (a private mount
# namespace, see tests/integration/cgroup2_view.py): what a host that mounts cgroup v2 only runs.
test-cgroup2: criu
	unshare --mount --propagation private $(PY) -m tests.integration.cgroup2_view --pytest -p no:cacheprovider \
		tests/integration/mechanisms/criu tests/integration/agent

# docs/cli.md: every command and flag, generated from the parser (tests/unit/cli/test_reference.py checks it).
docs: $(STAMP)
	$(VENV)/bin/tidal cli-reference > docs/cli.md

# The first story's cluster stays up DEMO_KEEP_FOR seconds after it (its dashboard's address is printed):
# `make demo DEMO_KEEP_FOR=60`.
DEMO_KEEP_FOR ?= 0
demo: criu
	$(VENV)/bin/tidal demo --keep-for $(DEMO_KEEP_FOR)
	$(VENV)/bin/tidal demo --distributed

bench: criu
	$(PY) benchmarks/checkpoint.py --json bench-results/checkpoint.json
	$(PY) benchmarks/api.py --json bench-results/api.json
	$(PY) benchmarks/load.py --json bench-results/load.json
	$(PY) benchmarks/policy.py --json bench-results/policy.json
	$(PY) benchmarks/interpose.py --json bench-results/interpose.json
	$(PY) benchmarks/work_object.py --json bench-results/work_object.json
	$(PY) benchmarks/elastic.py --restore-from both --json bench-results/elastic.json
	$(PY) benchmarks/cluster_pause.py --json bench-results/cluster_pause.json
	$(PY) benchmarks/crosshost.py --json bench-results/crosshost.json
	$(PY) benchmarks/crossregion.py --json bench-results/crossregion.json
	$(PY) benchmarks/cli_startup.py --json bench-results/cli_startup.json

clean:
	rm -rf $(VENV) build *.egg-info
