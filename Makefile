# `make demo` and `make test` work on a fresh clone: they create .venv and install the
# project first, again only when pyproject.toml changes.  `make demo` installs only the core
# (`pip install -e .`: what the demo and servers.swarm import, no torch), so a first demo is
# quick; `make test`, `make lint` and `make bench` install the dev extras (torch, the S3 and
# Redis clients, pytest, ruff, mypy, ...).  Each install has its stamp in .venv.
# `make test` runs `make lint` (ruff and mypy, configured in pyproject.toml) and installs the
# system services the tests use (`make services`: redis-server) before pytest.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CORE   := $(VENV)/.installed-core
DEV    := $(VENV)/.installed-dev

.PHONY: demo test lint services bench venv-mosaic install clean dlio dlio-test

demo: $(CORE)
	$(VENV)/bin/blobsdk demo
	$(PY) -m servers.swarm --clients 4 --size-mb 256

test: lint services
	$(PY) -m pytest -q

# System tools the tests use, from Debian's packages when missing (as root; CI runs as root):
# redis-server and redis-cli (the Redis tests start their own servers, each on a free port) and
# faketime (gc's clock-skew tests step a process's clock).
services:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v faketime >/dev/null || { \
		echo "installing redis-server and faketime (the tests start their own servers)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server faketime >/dev/null; \
		service redis-server stop >/dev/null 2>&1 || true; }

# All three always run, so one pass reports every kind of problem; any failure fails lint.
lint: $(DEV)
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status

bench: $(DEV)
	$(PY) -m benchmarks put_get --quick

# Mosaic Streaming's venv, for its rows in `python -m benchmarks ingest_s3` (skipped without it):
# mosaicml-streaming 0.13.0 pins numpy < 2.2 and xxhash < 4, so it gets its own numpy and
# xxhash and sees the project's other packages through a .pth file.  Not needed by CI.
venv-mosaic: $(DEV)
	$(PY) -m venv .venv-mosaic
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
		"$$(.venv-mosaic/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/project-venv.pth"
	.venv-mosaic/bin/python -m pip install --disable-pip-version-check "mosaicml-streaming==0.13.0"

install: $(DEV)

# MLPerf Storage's harness, DLIO (`python -m benchmarks dlio`, docs/dlio.md), in a venv of its
# own: it pulls TensorFlow and MPI, which neither `make test` nor CI installs.  dlio-benchmark
# 2.0.0 goes in with --no-deps: its nvidia-dali dependency is a stub that downloads from an
# index outside PyPI, and DLIO imports DALI only for its DALI loaders.  The `mpich` wheel gives
# mpi4py its libmpi.so.12 and `mpiexec`.  pydftracer 1.0.2: DLIO 2.0.0's fallback without it is broken.  s3torchconnector and s3dlio are the benchmark's peers; matplotlib draws its picture (benchmarks/_dlio_plot.py).
DLIO_VENV := .venv-dlio
DLIO_PY   := $(DLIO_VENV)/bin/python
DLIO      := $(DLIO_VENV)/.installed-dlio

dlio: $(DLIO)

$(DLIO): pyproject.toml | $(DLIO_PY)
	$(DLIO_PY) -m pip install --disable-pip-version-check --no-deps 'dlio-benchmark==2.0.0'
	$(DLIO_PY) -m pip install --disable-pip-version-check 'tensorflow-cpu>=2.16' 'mpich>=4.2' 'mpi4py>=4' \
		'h5py>=3.11' 'hydra-core>=1.3.2' 'omegaconf>=2.2' 'pandas>=1.5.1' 'psutil>=5.9.8' 'Pillow>=9.3' 'PyYAML>=6' \
		'pydftracer==1.0.2' 's3torchconnector>=1.5' 's3dlio>=0.10' 'matplotlib>=3.8' -e '.[torch,numpy,s3,seaweedfs]'
	touch $@

$(DLIO_PY):
	$(PYTHON) -m venv $(DLIO_VENV)

# The end-to-end run of DLIO with blobsdk's reader and checkpointing (skipped by `make test`
# when .venv-dlio is absent).
dlio-test: $(DLIO) $(DEV)
	$(PY) -m pytest -q tests/integrations/test_dlio.py

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "blobsdk needs Python >= 3.11; try: make PYTHON=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(CORE): pyproject.toml | $(PY)
	$(PY) -m pip install --disable-pip-version-check -e .
	touch $@

# The dev extras include the core: a venv made by `make test` needs no second install for the demo.
$(DEV): pyproject.toml | $(PY)
	$(PY) -m pip install --disable-pip-version-check -e '.[dev]'
	touch $(CORE) $@

clean:
	rm -rf $(VENV) $(DLIO_VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
