# ponytail: `make demo` sets up and runs the main job, `make test` sets up and runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup system-packages test demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]' --config-settings editable_mode=compat
	touch $@

system-packages:
	./scripts/install-system-packages.sh

setup: system-packages $(VENV)/.installed

test: setup
	$(PY) -m pytest -q

demo: setup
	$(PY) scripts/demo.py

clean:
	rm -rf $(VENV) build dist demo *.egg-info
