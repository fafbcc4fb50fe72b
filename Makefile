# policylink: `make demo` (the main job) and `make test`. Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
APT_PKGS := libegl1 libgl1 libosmesa6
STAMP := $(VENV)/.policylink-installed
# LeRobot 0.4.4 caps torch<2.11, hub<0.36, av<16, draccus==0.10: install it --no-deps, plus the packages its
# dataset code imports (from its METADATA; versions checked here with torch 2.14.1 / numpy 2.4 / hub 2.x)
# torchcodec 0.17.0 decodes LeRobot's mp4 videos (torchvision's VideoReader is gone) with Debian's FFmpeg 5.1 libs.
LEROBOT_NODEPS := lerobot==0.4.4 datasets==4.8.5 multiprocess==0.70.19 xxhash==4.1.0 jsonlines==4.0.0 \
	einops==0.8.2 deepdiff==8.6.2 orderly-set==5.5.0 termcolor==3.3.0 pyserial==3.5 torchcodec==0.17.0
LEROBOT_DEPS := accelerate==1.15.0 httpx==0.28.1
FFMPEG_PKGS := libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8 libswscale6 libswresample4
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: install demo test lint format lerobot clean help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/ -/'

$(PY):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (policylink targets Python 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

apt:  ## headless MuJoCo rendering libraries (only the missing ones; APT_PKGS="..." for others)
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; fi

$(STAMP): $(PY) pyproject.toml setup.py
	$(MAKE) --no-print-directory apt
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[all,dev]"  # all = every extra (cli, data, sim, train, real, openpi, ray, genesis)
	$(PIP) install -q --no-deps "openpi-client==0.1.2"  # declares numpy<2 but works with numpy 2
	$(MAKE) --no-print-directory lerobot
	touch $(STAMP)

install: $(STAMP)  ## venv + apt libs + package (editable) with every extra + dev, openpi-client, lerobot

lerobot: $(PY)  ## LeRobot 0.4.4 + torchcodec (dataset interop tests) without touching the torch/numpy pins
	$(MAKE) --no-print-directory apt APT_PKGS="$(FFMPEG_PKGS)"
	$(PIP) install -q --no-warn-conflicts $(LEROBOT_DEPS)
	$(PIP) install -q --no-deps $(LEROBOT_NODEPS)
	@# lerobot's own pins (torch<2.11, av<16, hub<0.36...) are overridden on purpose: pip check lists them, harmless
	$(PY) -c "import torch, numpy, torchcodec, lerobot.datasets.lerobot_dataset; \
	assert torch.__version__.startswith('2.14.1'), torch.__version__; \
	print('lerobot', lerobot.__version__, '| torchcodec', torchcodec.__version__, '| torch', torch.__version__, \
	'| numpy', numpy.__version__)"

demo: install  ## the main job: record demos, train policies, evaluate N x M, write a report
	$(VENV)/bin/policylink demo $(DEMO_ARGS)

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
