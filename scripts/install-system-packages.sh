#!/usr/bin/env bash
# Installs the Debian packages ponytail's tests and demo use, if any is missing:
# gcc (fake driver libraries), python3-venv (the .venv), libpython3.X (PyInstaller's binary embeds the
# system python3's shared library: `make binary`), busybox-static (test rootfs; Debian's
# dynamically linked busybox works too: the test rootfs carries its libraries), util-linux (unshare, nsenter),
# the container engines the end-to-end tests start containers with (containerd for the CRI test),
# strace (a test injects SIGKILL at one exact syscall with it), musl with musl-tools (a musl test image),
# the shellcheck linter (make lint), debootstrap (the Debian roots of make fresh-check, make test-real-driver
# and tests/deb, and the Debian sid root of make test-engines: scripts/debian-root.sh), and what `make deb`
# builds the Debian package with (scripts/build-deb.sh --deps-only: debhelper, dh-python, Debian's Python
# modules, lintian).
#
# With the argument `demo`, only what `make demo` needs: gcc and libc6-dev (the simulated driver's
# libraries and the demo's CUDA check program), python3-venv, busybox (the demo rootfs) and util-linux
# (unshare); no container engine is installed or started.
set -euo pipefail
for_what=${1:-tests}
case "$for_what" in tests|demo) ;; *) echo "usage: $0 [tests|demo]" >&2; exit 2 ;; esac
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have gcc || need+=(gcc libc6-dev)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
[ -x /bin/busybox ] || need+=(busybox-static)
have unshare || need+=(util-linux)
if [ "$for_what" = demo ] && [ ${#need[@]} -eq 0 ]; then
    echo "make demo: the Debian packages it needs are there (gcc, libc6-dev, python3-venv, busybox, util-linux)"
    exit 0
fi
[ "$for_what" = demo ] || {  # the tests' packages
pyver=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
ldconfig -p | grep "libpython$pyver\.so\.1\.0 " >/dev/null || need+=("libpython$pyver")  # make binary (PyInstaller)
have runc || need+=(runc)
have crun || need+=(crun)
have podman || need+=(podman)
have dockerd || need+=(docker.io)
have containerd || need+=(containerd)  # the Kubernetes node test (CRI): containerd 1.6 and ctr
have strace || need+=(strace)
have musl-gcc || need+=(musl musl-tools)  # an Alpine-like test image: musl's loader, and cudacheck built for it
have shellcheck || need+=(shellcheck)
have debootstrap || need+=(debootstrap)  # scripts/debian-root.sh: make fresh-check, make test-real-driver, tests/deb, make test-engines
}
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})" >&2
        exit 1
    fi
    if [ "$for_what" = demo ]; then echo "make demo: installing the Debian packages it needs: ${need[*]}"
    else echo "installing Debian packages: ${need[*]}"; fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ "$for_what" = tests ]; then
    exec "$(dirname "$0")/build-deb.sh" --deps-only
fi
