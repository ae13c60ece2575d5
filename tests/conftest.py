from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakehost import FakeHost, gpus, make_rootfs  # noqa: E402

from commands import BINARY, PONYTAIL, REPO  # noqa: E402  (the commands under test)

BARE_PYTHON_EXIT = 97
BARE_PYTHON_MESSAGE = "a test ran a bare python from PATH instead of the command under test (see tests/commands.py)"


def _guard_against_bare_python() -> Path:
    """Put stand-ins for ``python3`` and ``python`` first on PATH for this test run: a test
    (or a script it runs) that starts an interpreter by name instead of the installed
    command fails loudly here, whatever python3 this machine happens to have."""
    guard = Path(tempfile.mkdtemp(prefix="ponytail-test-python-guard-"))
    for name in ("python", "python3", f"python3.{sys.version_info.minor}"):  # the names it guards
        stub = guard / name
        stub.write_text(f"#!/bin/sh\necho 'ponytail tests: {BARE_PYTHON_MESSAGE}: '\"$0 $*\" >&2\nexit {BARE_PYTHON_EXIT}\n")
        stub.chmod(0o755)
    os.environ["PATH"] = f"{guard}{os.pathsep}{os.environ.get('PATH', '')}"
    atexit.register(shutil.rmtree, guard, True)
    return guard


PYTHON_GUARD = _guard_against_bare_python()


ISOLATED = ["unshare", "-m", "--propagation", "private"]


def run_ponytail(
    args: list[str], stdin: bytes | str | None = b"", env: dict | None = None, isolated: bool = True,
    command: list[str] | None = None,
) -> subprocess.CompletedProcess:
    """Run the installed ponytail command (unless ``command`` says otherwise)
    as a user would; returns its output and exit status.

    By default it runs in a private mount namespace of its own, so that a manual-mode
    run can never leave a mount on this machine; ``isolated=False`` runs it in the
    test's own namespace (to prove hook mode mounts nothing here)."""
    if isinstance(stdin, str):
        stdin = stdin.encode()
    full_env = {k: v for k, v in os.environ.items() if k != "PONYTAIL_CONFIG"}
    full_env.update(env or {})
    prefix = ISOLATED if isolated else []
    return subprocess.run(
        prefix + (command or PONYTAIL) + args, input=stdin, capture_output=True, env=full_env, timeout=120
    )


@pytest.fixture(scope="session")
def binary() -> Path:
    """The self-contained executable of ``make binary``, built or brought up to date once per run."""
    subprocess.run(["make", "-s", "-C", str(REPO), "binary"], check=True, stdout=subprocess.DEVNULL)
    return BINARY


@pytest.fixture(params=["installed", "binary"])
def ponytail_command(request: pytest.FixtureRequest) -> list[str]:
    """The ponytail command both ways it ships: the pip-installed command and the binary."""
    if request.param == "binary":
        return [str(request.getfixturevalue("binary"))]
    return PONYTAIL


def in_private_mount_ns(script: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run a bash script in a fresh private mount namespace, so nothing it mounts leaks."""
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-euc", script],
        capture_output=True, text=True, timeout=timeout,
    )


class Sleeper:
    """A process in its own mount namespace: stands in for the container at prestart."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sleep", "600"], start_new_session=True
        )
        self.pid = self._child_pid()

    def _child_pid(self) -> int:
        # unshare execs sleep in place, so the pid is the same; wait until the namespace differs
        for _ in range(200):
            try:
                if os.readlink(f"/proc/{self.proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                    return self.proc.pid
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        raise RuntimeError("the stand-in container never entered its own mount namespace")

    def run(self, args: list[str], timeout: int = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", "-t", str(self.pid), "-m", *args], capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host", gpu_list=gpus(3, minors=[2, 0, 1]))


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    return make_rootfs(tmp_path / "rootfs", programs=("cudacheck.c",))


@pytest.fixture
def sleeper():
    s = Sleeper()
    yield s
    s.stop()


def bundle_for(tmp_path: Path, rootfs: Path, env: list[str] | None = None, relative_root: bool = True, name: str = "bundle") -> Path:
    """An OCI bundle directory whose config.json points at ``rootfs``."""
    bundle = tmp_path / name
    bundle.mkdir(exist_ok=True)
    root_path = os.path.relpath(rootfs, bundle) if relative_root else str(rootfs)
    spec = {
        "ociVersion": "1.0.2",
        "root": {"path": root_path},
        "process": {"args": ["sh"], "env": env or ["PATH=/usr/bin:/bin"], "cwd": "/"},
        "linux": {"cgroupsPath": "/ponytail-test"},
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def state_for(bundle: Path, pid: int, status: str = "creating", container_id: str = "test-ctr") -> str:
    return json.dumps({"ociVersion": "1.0.2", "id": container_id, "status": status, "pid": pid, "bundle": str(bundle)})


def mounts_under(path: Path) -> list[str]:
    """Mount points under ``path`` in this (the host's) mount namespace."""
    prefix = str(path)
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def tree_digest(path: Path) -> str:
    """Names, types, modes and contents of everything under ``path``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(path)):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p}:{st.st_mode}:{st.st_size}".encode())
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()
