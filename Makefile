# policylink: `make demo` (the main job) and `make test`. Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
APT_PKGS := libegl1 libgl1 libosmesa6
STAMP := $(VENV)/.policylink-installed
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: install demo test lint format lerobot clean help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/ -/'

$(PY):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (policylink targets Python 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

apt:  ## headless MuJoCo rendering libraries (only the missing ones)
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; fi

$(STAMP): $(PY) pyproject.toml setup.py
	$(MAKE) --no-print-directory apt
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[dev,ray]"
	$(PIP) install -q --no-deps "openpi-client==0.1.2"  # declares numpy<2, works with numpy 2 (DESIGN.md 5)
	touch $(STAMP)

install: $(STAMP)  ## venv + apt libs + package (editable) with dev tools

demo: install  ## the main job: record demos, train policies, evaluate N x M, write a report
	$(VENV)/bin/policylink --help
	$(PY) -c "from policylink.adapters import registry; print('environments:', registry.available_envs()); print('policies:', registry.available_policies())"

lint: install  ## ruff lint + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install  ## apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: install lint  ## the whole test suite (CI runs this)
	$(PY) -m pytest -q

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache
