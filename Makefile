# ponytail: `make demo` sets up and runs the main job, `make test` sets up and runs every test,
# `make binary` builds the self-contained executable dist/ponytail/ponytail.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BINARY := dist/ponytail/ponytail

.PHONY: setup system-packages test demo binary bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,binary]' --config-settings editable_mode=compat
	touch $@

system-packages:
	./scripts/install-system-packages.sh

setup: system-packages $(VENV)/.installed

test: setup binary
	$(PY) -m pytest -q

demo: setup
	$(PY) scripts/demo.py

binary: $(BINARY)

$(BINARY): $(VENV)/.installed packaging/ponytail.spec $(shell find ponytail -name '*.py')
	$(PY) -m PyInstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller packaging/ponytail.spec
	touch $@

bench: setup binary
	$(PY) bench/hookbench.py

clean:
	rm -rf $(VENV) build dist demo *.egg-info

# the Kubernetes node installer image from the binary (podman, offline): make installer-image [IMAGE=NAME]
.PHONY: installer-image
installer-image: binary
	packaging/installer/build-image.sh $(IMAGE)
