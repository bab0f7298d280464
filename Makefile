# Two commands: `make run` (set up and start the app) and `make test` (set up with dev tools, run all tests).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEPS   := pyproject.toml installer/llama_wheel.sh

.PHONY: run test chat bench screenshots clean dist dist-test

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
# The window's X11 libraries are checked first (seconds, with the system's python3), not after the
# minutes of set-up; then again against the installed Qt plugin itself.
run:
	@$(PYTHON) app/ggufdesk/ui/platform_check.py
	@$(MAKE) --no-print-directory $(VENV)/.run
	@if [ "$$(uname -s)" = Linux ] && [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && [ -z "$$QT_QPA_PLATFORM" ]; then \
	  echo "make run: no display found; starting the terminal chat on the starter model (ggufdesk chat)"; \
	  exec $(VENV)/bin/ggufdesk chat; \
	fi; \
	$(PY) -m ggufdesk.ui.platform_check || exit 1; \
	exec $(VENV)/bin/ggufdesk

chat: $(VENV)/.run
	$(VENV)/bin/ggufdesk chat

# Static checks first (seconds with their caches): layer contracts, ruff, mypy (see pyproject.toml),
# complexity (radon's, through xenon: no function above 20).
test: $(VENV)/.dev
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check app tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/xenon --max-absolute C app/ggufdesk
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest

bench: $(VENV)/.dev
	$(PY) bench/engine.py

screenshots: $(VENV)/.dev
	$(PY) bench/screenshots.py

# The self-contained bundle and .deb (installer/build_bundle.sh; GGUFDESK_VARIANT=cpu|cuda|vulkan,
# GGUFDESK_STARTER=0 for a bundle without the starter model). Niced: it is a long, CPU-heavy build.
dist:
	PYTHON=$(PYTHON) nice -n 10 installer/build_bundle.sh

# Smoke test of what `make dist` built, in a clean environment (installer/smoke.sh); the tiny model for
# its run step comes from tests/fixtures/ggufs.py (the venv has the gguf writer). dist/built.txt names
# the archive and .deb that the last `make dist` wrote.
dist-test: dist $(VENV)/.run
	$(PY) -c "from pathlib import Path; from tests.fixtures import ggufs; ggufs.write_tiny_llama(Path('dist/smoke-tiny.gguf'))"
	for f in $$(cat dist/built.txt); do SMOKE_MODEL=$$PWD/dist/smoke-tiny.gguf installer/smoke.sh "$$f" || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info app/*.egg-info
