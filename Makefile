# Two commands on a fresh machine:  make demo   (the main job on the embedded local cluster)
#                                   make test   (the test suite)
# Both set everything up themselves: Debian packages (as root), .venv, pinned Python packages.
SHELL := /bin/bash
# Independent steps at once: on a fresh machine apt-get (deps-debian) runs beside pip (setup), and lint's mypy
# beside apt-get; each target still waits for what it names.
MAKEFLAGS += -j2
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# Extra pip arguments for torch (e.g. --index-url https://download.pytorch.org/whl/cpu on a machine
# whose default index would give a CUDA build you do not want).
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=
# Arguments for `make lab` (e.g. --tcp where sshd forbids forwarding to a Unix socket).
LAB_ARGS ?=
DEBIAN_PACKAGES := slurmctld slurmd slurm-client munge iproute2 util-linux chromium shellcheck

.PHONY: setup deps-debian demo test test-fast lint lab recipes cluster-up cluster-down clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements/constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# torch first, so nothing else pulls a CUDA build of it
	$(BIN)/python -m pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	@touch $@
	@echo "installed: $(BIN)/cookbook"

deps-debian:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "Debian packages missing:$$missing (install them as root, or run make as root)"; exit 1; fi; \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

cluster-up: setup deps-debian
	$(BIN)/cookbook cluster up

cluster-down:
	@test -x $(BIN)/cookbook && $(BIN)/cookbook cluster down || true
	@test -x $(BIN)/cookbook && $(BIN)/cookbook cluster down --name gpu || true

demo: setup deps-debian
	$(BIN)/python -m cookbook.demo

test: setup deps-debian lint
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not cluster and not slow and not browser" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check cookbook slurm-recipes/cookbook_runtime tests benchmarks
	$(BIN)/ruff format --check cookbook slurm-recipes/cookbook_runtime tests benchmarks
	$(BIN)/mypy

lab: setup
	$(BIN)/python -m cookbook.lab $(LAB_ARGS)

recipes: setup
	$(BIN)/cookbook generate-recipes slurm-recipes

clean: cluster-down
	rm -rf out .cluster

# The GPU check (issue #31, benchmarks/README.md "GPU check"): on a lent GPU machine, which has torch but no package
# registry. Here first: `bash benchmarks/gpu_check_wheels.sh` (the wheels it lacks, into GPU_WHEELS); carry GPU_WHEELS
# and .cache/tiny. There: a venv over the machine's own python3 and its packages (torch), the wheels installed into it,
# then benchmarks/gpu_check.py (results in benchmarks/results/, and in $OUT when set). No GPU: `--cpu` mode.
GPU_PYTHON ?= python3
GPU_VENV ?= out/gpu-venv
GPU_WHEELS ?= out/gpu_check_wheels
GPU_CHECK_ARGS ?=
.PHONY: gpu-check
gpu-check:
	@ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1 || { echo "no wheels in $(GPU_WHEELS): bash benchmarks/gpu_check_wheels.sh"; exit 1; }
	$(GPU_PYTHON) -m venv --system-site-packages --without-pip $(GPU_VENV)
	@# a venv made by a venv's python sees the base interpreter's packages, not that venv's (torch): add them after its own
	$(GPU_PYTHON) -c 'import site; print("\n".join(site.getsitepackages()))' \
	  > "$$($(GPU_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpu_check_parent.pth"
	$(GPU_PYTHON) -m pip --python $(GPU_VENV)/bin/python install -q --no-index --no-deps --no-compile --ignore-installed \
	  --find-links $(GPU_WHEELS) $(GPU_WHEELS)/*.whl
	PYTHONUNBUFFERED=1 $(GPU_VENV)/bin/python benchmarks/gpu_check.py --command "make gpu-check" \
	  $${OUT:+--copy-to "$$OUT"} $(GPU_CHECK_ARGS)
