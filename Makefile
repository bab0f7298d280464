# Two commands: `make run` (set up and start the app) and `make test` (set up with dev tools, run all tests).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEPS   := pyproject.toml installer/llama_wheel.sh

.PHONY: run test chat bench screenshots clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# llama-cpp-python comes from a wheel built once per (version, flags) and cached outside the clone.
$(VENV)/.llama: $(DEPS) | $(PY)
	$(PY) -m pip install -q "$$(installer/llama_wheel.sh $(PY))"
	touch $@

$(VENV)/.run: $(VENV)/.llama $(DEPS)
	$(PY) -m pip install -q -e '.[starter]'
	-installer/install_desktop.sh $(VENV)
	touch $@

$(VENV)/.dev: $(VENV)/.llama $(DEPS)
	$(PY) -m pip install -q -e '.[starter,dev]'
	touch $@ $(VENV)/.run

run: $(VENV)/.run
	$(VENV)/bin/ggufdesk

chat: $(VENV)/.run
	$(VENV)/bin/ggufdesk chat

test: $(VENV)/.dev
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/lint-imports
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest

bench: $(VENV)/.dev
	$(PY) bench/engine.py

screenshots: $(VENV)/.dev
	$(PY) bench/screenshots.py

clean:
	rm -rf $(VENV) build *.egg-info app/*.egg-info
