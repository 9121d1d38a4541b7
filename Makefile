# crawld developer entry points.  Every target installs what it needs.
#   make demo   a real multi-shard crawl of four real documentation sites
#   make test   the test suite (real redis-server, real HTTP, real HTML)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# redis-server: the frontier; *-doc: the real sites of the demo and tests;
# python3-venv: the virtualenv.
APT_PACKAGES := redis-server python3-venv python3-doc postgresql-doc-15 sqlite3-doc git-doc
PYTEST_ARGS ?=

.PHONY: all sysdeps venv test test-fast demo bench clean

all: test

sysdeps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

$(STAMP): requirements.txt requirements-dev.txt setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

venv: $(STAMP)

test: sysdeps venv
	$(PY) -m pytest $(PYTEST_ARGS)

# the fast set, for work in progress (CI runs everything)
test-fast: sysdeps venv
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: sysdeps venv
	$(PY) tools/demo.py

bench: sysdeps venv
	$(PY) bench/cpu_per_page.py

clean:
	rm -rf $(VENV) crawl-output demo-output .pytest_cache
