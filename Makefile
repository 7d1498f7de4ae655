# Two entry points, both self-contained on a machine with only Python 3.11 and pip:
#   make run   — set up, then compile the zoo's ResNet-50, check it and time it against onnxruntime
#   make test  — set up with the test extras, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test lint bench report clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "polytile needs Python 3.11 or newer: run make PYTHON=python3.11 ..."; exit 1; }
	@$(PYTHON) -m venv $(VENV) || \
		{ echo "creating $(VENV) failed: install the venv module (Debian: python3-venv)"; exit 1; }
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

# OpenVINO, the optional peer of the models table: without a wheel for this platform the
# table leaves its columns out
$(VENV)/.installed-peers: pyproject.toml | $(VENV)/.installed-test
	$(BIN)/python -m pip install --quiet -e '.[openvino]' || \
		echo "openvino did not install: the models table leaves it out"
	touch $@

run: $(VENV)/.installed-run
	$(BIN)/polytile bench resnet50 --vs onnxruntime --repeat 10

test: $(VENV)/.installed-test
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q -n auto

bench: $(VENV)/.installed-peers
	$(BIN)/python benchmarks/frontend_bench.py
	$(BIN)/python benchmarks/model_bench.py

# every table and figure of benchmarks/results for this host, with its fingerprint and
# each part's wall time (hours of tuning are replayed from the recorded files, not redone)
report: $(VENV)/.installed-peers
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) build dist *.egg-info
