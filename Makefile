# The two commands of the README: `make train` (the embedded default, offline, on CPU) and
# `make test` (the test suite). Both install into ./.venv first when needed.
VENV ?= .venv
STAMP := $(VENV)/.polyrl-installed
SOURCES := $(wildcard core/pyproject.toml plugins/*/pyproject.toml) scripts/install.sh
# Offline and quiet: no hub downloads, no usage reporting, wandb offline, gloo on loopback.
export RAY_AUTH_MODE = disabled
export RAY_USAGE_STATS_ENABLED = 0
export MASTER_ADDR = 127.0.0.1
export WANDB_MODE = offline
export HF_HUB_OFFLINE = 1

.PHONY: install train test lint

install: $(STAMP)

$(STAMP): $(SOURCES)
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/polyrl train $(ARGS)

# pytest exits 5 when nothing was collected (e.g. a filter matched no test): not a failure here.
# The suite runs in TEST_JOBS processes (pytest-xdist), a test file to a process: most of an
# end-to-end test is start-up (imports, workers) that leaves a core idle, so two processes fill
# a 2-core machine (three ran no faster and crowded memory: Ray's memory monitor killed a
# worker). Files go out in collection order (conftest.py puts the end-to-end ones first), not
# xdist's default of the files with most tests first, which left the one-test chaos and fault
# files for last. `make test TEST_JOBS=0` runs it in this process alone. Each process and the
# runs it starts compute with one thread unless OMP_NUM_THREADS says otherwise: two processes
# of two threads each on two cores spend their time waiting for each other's threads.
TEST_JOBS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(VENV)/bin/python -m pytest -n $(TEST_JOBS) \
		--dist loadfile --no-loadscope-reorder $(ARGS) || [ $$? -eq 5 ]

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
