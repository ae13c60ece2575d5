"""The harness: run ponytail as a user does, a stand-in container (a process in a mount namespace
of its own, as the runtime has it at prestart), OCI bundles and states, and what a run left
behind (mounts, tree digests)."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from support.commands import PONYTAIL

# The machine's /var/log as ponytail sees it in run_ponytail's private mount namespace: a directory of
# this test run, so that a run whose config cannot name its log (a bad config, or none) appends to
# DEFAULT_LOG_DIR/ponytail.log, never to the machine's own /var/log/ponytail.log.
DEFAULT_LOG_DIR = Path(tempfile.mkdtemp(prefix="ponytail-test-var-log-"))
atexit.register(shutil.rmtree, DEFAULT_LOG_DIR, ignore_errors=True)
ISOLATED = ["unshare", "-m", "--propagation", "private", "sh", "-c", f'mount --bind {DEFAULT_LOG_DIR} /var/log && exec "$@"', "sh"]


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
        deadline = time.monotonic() + 60  # seconds on a busy machine
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if os.readlink(f"/proc/{self.proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                    return self.proc.pid
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        raise RuntimeError(f"the stand-in container never entered its own mount namespace (exit status {self.proc.poll()})")

    def run(self, args: list[str], timeout: int = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", "-t", str(self.pid), "-m", *args], capture_output=True, text=True, timeout=timeout)

    def mounts_under(self, *paths: Path) -> list[str]:
        """Mount points in this process's mount namespace at or under ``paths`` (what a test owns),
        in mount order: never the whole namespace's list, which other programs on the machine change."""
        return mount_points_under(f"/proc/{self.pid}/mountinfo", paths)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


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
    """Mount points at or under ``path`` in this (the host's) mount namespace."""
    return mount_points_under("/proc/self/mountinfo", (path,))


def mount_points_under(mountinfo: str, paths: Sequence[Path]) -> list[str]:
    """Mount points of ``mountinfo`` (a /proc/PID/mountinfo) at or under any of ``paths``."""
    prefixes = [str(path).rstrip("/") for path in paths]
    with open(mountinfo) as f:
        points = [line.split()[4] for line in f]
    return [point for point in points if any(point == prefix or point.startswith(prefix + "/") for prefix in prefixes)]


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
