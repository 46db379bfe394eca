# Two commands on a fresh machine:  `make run` (the default job)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch is what the default job needs; set TORCH="torch==2.13.0" --index-url ... for GPUs.
TORCH ?= torch==2.13.0
CORES ?= 2
# pytest-xdist workers of `make test`: a test file is a unit (tests/conftest.py); 1 runs in one process.
TEST_WORKERS ?= 2

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH)"
	$(VENV)/bin/pip install -q -e ".[test,cluster]"
	touch $@

.PHONY: install run test lint
install: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/snakemake --cores $(CORES)

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests scripts bench tools
	$(VENV)/bin/ruff format --check src tests scripts bench tools
	$(VENV)/bin/snakefmt --check Snakefile rules
	$(VENV)/bin/snakemake --lint

# tests/sglang/ in a second venv with a real sglang 0.5.23 importable on CPU (~6 GB, ~3 min the first time).
.PHONY: test-sglang
test-sglang:
	bash tests/sglang/install_env.sh
	.venv-sglang/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests/sglang tests/faults/test_sglang_engine_death.py

# tests/speculators/ in a third venv with the real speculators 0.9.0 and vLLM 0.33.0's config code on
# CPU (~2.4 GB, ~5 min the first time): eyas's speculators export as speculators and vLLM read it, offline.
.PHONY: test-speculators
test-speculators:
	bash tests/speculators/install_env.sh
	HF_HUB_OFFLINE=1 .venv-speculators/bin/python -m pytest -q tests/speculators

# tests/specforge/ in a fourth venv with the real SpecForge 0.2.0 (its offline EAGLE-3 trainer) on CPU
# (~2.1 GB, ~3 min the first time): it trains on eyas stores and its drafter comes back as an eyas one.
.PHONY: test-specforge
test-specforge:
	bash tests/specforge/install_env.sh
	HF_HUB_OFFLINE=1 .venv-specforge/bin/python -m pytest -q tests/specforge
