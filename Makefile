# Loadout: `make run` opens the app, `make test` runs the whole suite headless.
# Both create .venv on first use. torch is installed first, pinned, and the same pin (constraints.txt)
# goes to every later pip call: an unpinned torch would pull several GB of CUDA packages.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PIPC   := $(PIP) install -c constraints.txt
STAMP  := $(VENV)/.loadout-installed

.PHONY: run test test-engine bench lint format sysdeps setup clean demo package install-desktop screenshots

setup: $(STAMP) sysdeps

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIPC) torch==2.13.0
	$(PIPC) -e '.[test]'
	touch $(STAMP)

# Qt's system libraries (and Xvfb for screenshots): installed when missing and running as root,
# otherwise the script prints the apt-get line to run.
sysdeps:
	@bash packaging/system-deps.sh

run: setup
	$(VENV)/bin/loadout $(ARGS)

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-engine: setup
	$(PY) -m pytest tests/engine

bench: setup
	@for b in benchmarks/bench_*.py; do echo "# $$b" >&2; $(PY) $$b || exit 1; done

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

demo: setup
	$(VENV)/bin/loadout demo $(or $(DIR),demo-library)

# The README's screenshots, taken from a scripted session of the real window on a demo library
# (Qt's offscreen platform when there is no display; SHOTS=DIR writes elsewhere).
screenshots: setup
	@if [ -n "$$DISPLAY" ]; then $(PY) packaging/screenshots.py $(SHOTS); \
	else QT_QPA_PLATFORM=offscreen $(PY) packaging/screenshots.py $(SHOTS); fi

# A one-folder app in dist/Loadout (PyInstaller; minutes, and ~1-2 GB with torch). Not part of `make test`.
package: setup
	$(PIPC) 'pyinstaller>=6'
	@start=$$(date +%s); $(VENV)/bin/pyinstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller \
	  packaging/loadout.spec && echo "Built dist/Loadout in $$(( $$(date +%s) - start )) s: $$(du -sh dist/Loadout | cut -f1)"

# Menu entry, icons and double-click MIME types for the current user (no root).
install-desktop: setup
	bash packaging/linux/install-desktop.sh

clean:
	rm -rf $(VENV) build dist .pytest_cache
