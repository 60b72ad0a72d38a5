# The two commands a newcomer runs: `make bench` and `make test`. Each installs what it needs into .venv:
# bench the package alone (torch, Triton and the libraries it imports), test and check the dev extra too (pytest,
# ruff, ray). On a machine without a CUDA GPU, torch is pinned to a CPU build (TORCH_PIN) so the install stays
# small; set TORCH_PIN= to let pip choose.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install bench first-run-note test check gate baseline-runs clean

install: $(STAMP)

# The package (`pip install -e .`): what bench and gate need.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if [ -n "$(TORCH_PIN)" ] && ! $(PY) -c "import torch" 2>/dev/null; then $(PY) -m pip install -q "$(TORCH_PIN)"; fi
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# The dev extra on top, for test and check; newer than the package's stamp, so a venv bench made (or a changed
# pyproject.toml, which remakes that stamp) still gets it on the next `make test`.
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(DEV_STAMP)

# The main job: the default sweep (moebench/bench/sweeps/quick.yaml on a GPU; cpu.yaml, a tiny shape, on the
# Triton interpreter where there is no GPU). Run folders go under results/, which git ignores. A first run says
# what it installs and how long that took where it was measured (`time make bench` in a fresh clone).
bench: first-run-note $(STAMP)
	$(PY) -m moebench sweep

first-run-note:
	@test -f $(STAMP) || echo "make bench: first run: installing torch, Triton and moebench into $(VENV), then the \
	sweep (2.2 GB; 2 to 3 min in all on a 2-core machine without a GPU, the sweep about 20 s of it)"

# Two pytest-xdist workers: the 2-core CI machine's cores (TEST_JOBS=N for more; the tests own their temp paths).
TEST_JOBS ?= 2
test: $(DEV_STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS)

check: $(DEV_STAMP)
	$(PY) -m ruff check moebench tests

# The regression gate (GPU): the quick sweep into a fresh folder, then compared with the committed H200
# baseline; exits 1 naming each point slower by more than GATE_PCT% and beyond the measured noise.
BASELINE ?= results/baselines/h200-quick-d62257d
GATE_PCT ?= 5
GATE_OUT ?= results/gate
gate: install
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 2)" || \
		{ echo "make gate: no CUDA GPU here; the baseline is an H200 run" >&2; exit 2; }
	rm -rf $(GATE_OUT)
	$(PY) -m moebench sweep quick --out $(GATE_OUT) --no-progress
	$(PY) -m moebench compare $(BASELINE) $(GATE_OUT) --fail-slower $(GATE_PCT)

# Runs for a new gate baseline (GPU; docs/reports.md: refreshing the baseline): BASELINE_RUNS quick sweeps, each its
# own process, into results/baselines/<gpu>-quick-<commit>/, then one more kept apart as a repeat in
# results/<gpu>-quick-repeat-<commit>/. Run it on two machine starts of the gate's GPU, then point BASELINE at it.
BASELINE_RUNS ?= 3
baseline-runs: install
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 2)" || \
		{ echo "make baseline-runs: no CUDA GPU here; a baseline is made on the gate's GPU" >&2; exit 2; }
	gpu=$$($(PY) -c "import re, torch; print(re.search(r'[A-Z][0-9]{3}', torch.cuda.get_device_name()).group().lower())") && \
	commit=$${MOEBENCH_GIT_COMMIT:-$$(git rev-parse --short HEAD)} && \
	for i in $$(seq $(BASELINE_RUNS)); do \
		MOEBENCH_GIT_COMMIT=$$commit $(PY) -m moebench sweep quick --out results/baselines/$$gpu-quick-$$commit \
			--no-progress --format csv >/dev/null || exit 1; done && \
	MOEBENCH_GIT_COMMIT=$$commit $(PY) -m moebench sweep quick --out results/$$gpu-quick-repeat-$$commit \
		--no-progress --format csv >/dev/null

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
