# ponytail: `make demo` sets up and runs the main job, `make test` sets up and runs every test (Hypothesis's
# thorough `ci` profile), `make test-unit` the pure tests of tests/unit (seconds, any user),
# `make lint` checks style, types and spelling (ruff, mypy, shellcheck, codespell; CI runs it before the tests), `make test-engines` runs
# the end-to-end tests against current engine releases from Debian's archive (sid's containerd, Docker, podman),
# `make binary` builds the self-contained executable dist/ponytail/ponytail, `make fresh-check` runs
# `make test` in a pristine Debian 12 root, `make gpu-check` checks a machine with a real NVIDIA GPU.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BINARY := dist/ponytail/ponytail

.PHONY: setup system-packages test test-unit test-engines test-real-driver lint demo binary bench bench-nvidia clean fresh-check gpu-check

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,binary,lint]' --config-settings editable_mode=compat
	touch $@

system-packages:
	./scripts/install-system-packages.sh

setup: system-packages $(VENV)/.installed

test: setup binary
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q

# tests/unit only (pytest -m unit): no root, no engines, no binary; what to run while editing
test-unit: $(VENV)/.installed
	$(PY) -m pytest -q -m unit

# the demo needs less than the tests: a few Debian packages (no container engine) and ponytail
# itself in the .venv (click, pyudev, tomli; no test or build tools); each step says what it installs
demo:
	./scripts/install-system-packages.sh demo
	@$(MAKE) -s $(VENV)/.demo-installed
	$(PY) scripts/demo.py

$(VENV)/.demo-installed: pyproject.toml
	@echo "make demo: installing ponytail and what it needs (click, pyudev, tomli) into $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e . --config-settings editable_mode=compat
	touch $@

binary: $(BINARY)

$(BINARY): $(VENV)/.installed packaging/ponytail.spec $(shell find ponytail -name '*.py')
	$(PY) -m PyInstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller packaging/ponytail.spec
	touch $@

# the end-to-end tests against current engine releases (pytest -m current_engines): Debian sid's containerd 2.1,
# runc 1.3, docker.io 28.5, podman 5.8 and crun 1.28, in a sid root that scripts/debian-root.sh --suite sid builds
# once and caches under $PONYTAIL_ROOT_CACHE (default /var/cache/ponytail-test-roots); each engine runs there in
# namespaces of its own (tests/support/sidroot.py), its hooks the binary of make binary. Root and debootstrap
# (make system-packages); skipped, saying why, where Debian's archive cannot be reached.
test-engines: setup binary
	$(PY) -m pytest -q -m current_engines --durations=5

# the real-driver tier (tests/realdriver, pytest -m real_driver): NVIDIA's user-mode drivers from Debian's
# non-free archive, in Debian 12 roots that scripts/debian-root.sh builds once and caches under
# $PONYTAIL_ROOT_CACHE (default /var/cache/ponytail-test-roots); skipped, saying why, where Debian's
# archive cannot be reached. Root, debootstrap, runc and podman (make system-packages).
test-real-driver: setup
	$(PY) -m pytest -q -m real_driver --durations=5 tests/realdriver

# ruff (style, bugs, security, imports) over the repository and mypy over ponytail/, both configured in
# pyproject.toml; shellcheck over the shell scripts (Debian's, from make system-packages) and codespell
# (the lint extra) over code and docs
SHELL_SCRIPTS := .ci/run $(wildcard scripts/*.sh bench/*.sh packaging/*.sh packaging/*/*.sh deploy/*.sh deploy/*/*.sh debian/*.postinst debian/*.prerm debian/*.postrm)
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	@command -v shellcheck >/dev/null || { echo "lint: no shellcheck: run make system-packages (Debian's shellcheck)" >&2; exit 1; }
	shellcheck $(SHELL_SCRIPTS)
	$(VENV)/bin/codespell . .ci/run

# the README's `make test` as a fresh machine runs it: a clean clone of what is committed, in a pristine
# Debian 12 root (cached, scripts/debian-root.sh) with its own mount and PID namespaces; then the unit tests as nobody
fresh-check:
	./scripts/fresh-machine-check.sh

# on a machine with a real NVIDIA GPU and driver: ponytail against nvidia-smi and real CUDA
gpu-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) scripts/gpu_check.py

bench: setup binary
	$(PY) bench/hookbench.py

# ponytail side by side with NVIDIA's own tools (nvidia-ctk, nvidia-cdi-hook, nvidia-container-runtime-hook,
# nvidia-container-cli) where NVIDIA's packages installed them ($NVIDIA_TOOLKIT_DIR, else PATH); without them it
# says so and measures ponytail alone (CONTRIBUTING.md, "Benchmarks"); BEFORE=PATH: an older ponytail command
# measured in the same run (before and after); writes bench/RESULTS.md
bench-nvidia: setup binary
	$(PY) bench/nvidiabench.py $(if $(BEFORE),--command before=$(BEFORE))

clean:
	rm -rf $(VENV) build dist demo *.egg-info

# the Debian package dist/ponytail_<version>_all.deb from what is committed, built offline with Debian's
# tools and Python modules (installed with apt-get where missing) and checked by lintian: scripts/build-deb.sh
.PHONY: deb test-deb
deb:
	./scripts/build-deb.sh

# the package built from a clean clone, installed, run, upgraded and purged in a pristine Debian 12 root
test-deb: $(VENV)/.installed
	$(PY) -m pytest -q -m deb

# the Kubernetes node installer image from the binary (podman, offline): make installer-image [IMAGE=NAME]
.PHONY: installer-image
installer-image: binary
	packaging/installer/build-image.sh $(IMAGE)
