# Loadout: `make run` opens the app, `make test` runs the whole suite headless.
# Both create .venv on first use. torch is installed first, pinned, and the same pin (constraints.txt)
# goes to every later pip call: an unpinned torch would pull several GB of CUDA packages.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PIPC   := $(PIP) install -c constraints.txt
STAMP  := $(VENV)/.loadout-installed

.PHONY: run test test-engine fuzz bench bench-check bench-full bench-baseline lint format sysdeps setup clean demo package install-desktop screenshots

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

# Hostile files through the command line (tests/support/fuzz.py): N seeded cases per target, every
# run must end as the exit-code contract says. `make test` runs a few of each; this runs many.
N ?= 150
SEED ?= 0
fuzz: setup
	$(PY) -m tests.support.fuzz -n $(N) --seed $(SEED) $(TARGETS)

# Benchmarks (timings: never part of `make test`). `bench` runs the default set once and writes
# benchmarks/results/latest.jsonl; `bench-check` takes each figure's best of ROUNDS runs and compares it
# with benchmarks/baseline.jsonl (more than 20 % worse, or a missed goal, still so after CONFIRM more
# rounds of the benchmarks behind it: exit 1); `bench-full` adds the
# VAE at width 128, the 2048^2 tiled decode, the TAEF2 round trip and the SD1.5 step (bench_step); `bench-baseline` makes the last
# check's best figures the baseline (commit it on its own, saying why).
ROUNDS ?= 3
CONFIRM ?= 2

bench: setup
	$(PY) benchmarks/check.py --rounds 1 --no-compare

bench-check: setup
	$(PY) benchmarks/check.py --rounds $(ROUNDS) --confirm $(CONFIRM)

bench-full: setup
	$(PY) benchmarks/check.py --rounds $(ROUNDS) --confirm $(CONFIRM) --full

bench-baseline:
	cp benchmarks/results/best.jsonl benchmarks/baseline.jsonl
	@echo "benchmarks/baseline.jsonl updated: commit it on its own, with the reason and the machine's state"

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
