# The two commands a newcomer runs: `make bench` and `make test`. Each installs what it needs
# into .venv. On a machine without a CUDA GPU, torch is pinned to a CPU build (TORCH_PIN) so the
# install stays small; set TORCH_PIN= to let pip choose.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install bench test check gate clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if [ -n "$(TORCH_PIN)" ] && ! $(PY) -c "import torch" 2>/dev/null; then $(PY) -m pip install -q "$(TORCH_PIN)"; fi
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The main job: the default sweep (moebench/bench/sweeps/quick.yaml on a GPU; cpu.yaml, a tiny shape, on the
# Triton interpreter where there is no GPU). Run folders go under results/, which git ignores.
bench: install
	$(PY) -m moebench sweep

# Two pytest-xdist workers: the 2-core CI machine's cores (TEST_JOBS=N for more; the tests own their temp paths).
TEST_JOBS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_JOBS)

check: install
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

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
