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
# python3-venv: the virtualenv; prometheus: /usr/bin/promtool, which checks and
# unit-tests etc/prometheus/crawld-alerts.yml (tests/test_observability_files.py).
APT_PACKAGES := redis-server python3-venv python3-doc postgresql-doc-15 sqlite3-doc git-doc prometheus
PYTEST_ARGS ?=

VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' crawld/__init__.py)
DEB_BUILD_PACKAGES := debhelper dh-virtualenv python3-venv build-essential lintian

.PHONY: all sysdeps venv test test-fast demo bench deb clean

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

# test files run on JOBS processes (pytest-xdist, one file per process at a
# time); JOBS=1 runs them in order in one process
JOBS ?= 2
XDIST = $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

test: sysdeps venv
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# the fast set, for work in progress (CI runs everything)
test-fast: sysdeps venv
	$(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

demo: sysdeps venv
	$(PY) tools/demo.py

bench: sysdeps venv
	$(PY) bench/cpu_per_page.py

# A .deb for Debian 12: a virtualenv under /opt/venvs/crawld (dh-virtualenv),
# the systemd units and /etc/crawl-workers; lintian errors fail the build.
deb:
	@missing=""; for p in $(DEB_BUILD_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	rm -rf build/deb && mkdir -p build/deb/crawld-$(VERSION) dist
	git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -x -C build/deb/crawld-$(VERSION)
	cp -r packaging/debian build/deb/crawld-$(VERSION)/debian
	cd build/deb/crawld-$(VERSION) && dpkg-buildpackage -us -uc -b
	lintian --fail-on error --suppress-tags-from-file packaging/lintian-suppressed build/deb/crawld_$(VERSION)_*.deb
	cp build/deb/crawld_$(VERSION)_*.deb dist/
	@ls -l dist/crawld_$(VERSION)_*.deb

clean:
	rm -rf $(VENV) crawl-output demo-output .pytest_cache build dist
