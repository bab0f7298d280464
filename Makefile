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
	whl=$$(installer/llama_wheel.sh $(PY)) && $(PY) -m pip install -q "$$whl"
	touch $@

$(VENV)/.run: $(VENV)/.llama $(DEPS)
	$(PY) -m pip install -q -e '.[starter]'
	-installer/install_desktop.sh $(VENV)
	touch $@

$(VENV)/.dev: $(VENV)/.llama $(DEPS)
	$(PY) -m pip install -q -e '.[starter,dev]'
	touch $@ $(VENV)/.run

# The GUI needs a display; on a headless Linux machine `make run` opens the terminal chat instead.
run: $(VENV)/.run
	@if [ "$$(uname -s)" = Linux ] && [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && [ -z "$$QT_QPA_PLATFORM" ]; then \
	  echo "make run: no display found; starting the terminal chat on the starter model (ggufdesk chat)"; \
	  exec $(VENV)/bin/ggufdesk chat; \
	fi; \
	if [ "$$(uname -s)" = Linux ] && ! ldconfig -p 2>/dev/null | grep -q libxcb-cursor.so.0; then \
	  echo "make run: Qt needs libxcb-cursor0 for X11 windows (Debian/Ubuntu: sudo apt-get install libxcb-cursor0)"; \
	fi; \
	exec $(VENV)/bin/ggufdesk

chat: $(VENV)/.run
	$(VENV)/bin/ggufdesk chat

# Static checks first (seconds with their caches): layer contracts, ruff, mypy (see pyproject.toml).
test: $(VENV)/.dev
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check app tests bench
	$(VENV)/bin/mypy
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest

bench: $(VENV)/.dev
	$(PY) bench/engine.py

screenshots: $(VENV)/.dev
	$(PY) bench/screenshots.py

clean:
	rm -rf $(VENV) build *.egg-info app/*.egg-info
