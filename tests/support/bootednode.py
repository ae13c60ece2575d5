"""A Debian node booted with systemd: a cached root of ``scripts/debian-root.sh`` (systemd, dbus, the engines)
under an overlay whose upper layer is the test's, booted by ``systemd-nspawn --boot`` as a container.

Why nspawn this way (what was measured on a machine without systemd, with a v1/v2 hybrid cgroup layout):

- ``SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1``: the node gets a cgroup2 tree of its own (the host's unified hierarchy,
  from the node's cgroup down), writable, so its systemd, runc's systemd driver and the engines run on cgroup v2
  as on a Debian 12 node. In the default hybrid view the v1 controllers are read-only inside.
- ``--capability=all --system-call-filter=bpf``: runc attaches device programs (``bpf(2)``) inside.
- ``--keep-unit --register=no``: no systemd-machined on the host (there is no systemd running there).
- A cgroup of its own for each node (``/sys/fs/cgroup/unified/ponytail-node-NAME``): nspawn leaves ``payload/``
  and ``supervisor/`` under the cgroup it was started in, and a later boot from the same cgroup fails (EBUSY);
  they are removed when the node is done.

Commands run in the node through ``nsenter`` into its init's namespaces, as root with a clean environment.
Powering off and booting again is a reboot: /run starts empty, the upper layer (the node's disk) stays.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from support.debianroot import pristine_root

CGROUP2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else Path("/sys/fs/cgroup")
NODE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "docker.io", "containerd", "runc", "podman", "python3-click",
                 "python3-pyudev", "python3-tomlkit", "python3-yaml", "busybox-static", "iproute2")
ENV = "PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive"


def node_root(suite: str = "bookworm") -> Path | str:
    """The cached node root of Debian 12 (or ``suite``: sid, its newer engines), or why there is none."""
    if shutil.which("systemd-nspawn") is None:
        return "no systemd-nspawn (Debian's systemd-container: make system-packages)"
    if suite == "bookworm":
        return pristine_root("node", *NODE_PACKAGES)
    # sid's docker.io has its command line in a package of its own
    return pristine_root(f"node-{suite}", *NODE_PACKAGES, "docker-cli", suite=suite)


@dataclass
class BootedNode:
    lower: Path
    work: Path
    name: str
    binds: list[Path] = field(default_factory=list)
    process: subprocess.Popen | None = None
    leader: int = 0

    @property
    def merged(self) -> Path:
        return self.work / "merged"

    @property
    def cgroup(self) -> Path:
        return CGROUP2 / f"ponytail-node-{self.name}"

    def __post_init__(self) -> None:
        for name in ("upper", "ovl", "merged"):
            (self.work / name).mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={self.lower},upperdir={self.work / 'upper'},workdir={self.work / 'ovl'}", str(self.merged)], check=True)
        # the root is a container image's: no service starts while packages install; a booted node starts them
        (self.merged / "usr/sbin/policy-rc.d").unlink(missing_ok=True)
        (self.merged / "etc/hostname").write_text(f"{self.name}\n")

    def boot(self, timeout: float = 120.0) -> float:
        """Boot the node; the seconds until systemd is up (running or degraded)."""
        start = time.monotonic()
        self._fresh_cgroup()
        binds = [f"--bind={p}" for p in self.binds]
        command = ["systemd-nspawn", "--boot", "--keep-unit", "--register=no", "--quiet", f"--machine={self.name}",
                   f"--directory={self.merged}", "--capability=all", "--system-call-filter=bpf @keyring", "--resolv-conf=bind-host",
                   "--console=pipe", *binds]
        log = (self.work / "console.log").open("ab")
        cgroup = self.cgroup
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
            preexec_fn=lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())),  # noqa: PLW1509 - the child's own cgroup, before exec
        )
        log.close()
        self.leader = 0
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                raise AssertionError(f"the node exited while booting: {self.console()[-3000:]}")
            self.leader = self.leader or self._find_leader()
            if self.leader:
                state = self.run("systemctl is-system-running", timeout=30).stdout.strip()
                if state in ("running", "degraded"):
                    return time.monotonic() - start
            time.sleep(0.5)
        raise AssertionError(f"the node did not boot in {timeout:g} s: {self.console()[-3000:]}")

    def run(self, script: str, timeout: int = 300) -> subprocess.CompletedProcess:
        """``script`` (sh -e) as root in the node."""
        return subprocess.run(["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-n", "-p", "-C", "--",
                               "/usr/bin/env", "-i", *ENV.split(), "sh", "-ec", script],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def check(self, script: str, timeout: int = 300) -> str:
        result = self.run(script, timeout)
        assert result.returncode == 0, f"in the node: {script}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result.stdout

    def poweroff(self, timeout: float = 90.0) -> None:
        """``systemctl poweroff`` and wait for the container to end (the disk stays: boot() again is a reboot)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.run("systemctl --no-block poweroff", timeout=30)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()  # nspawn, started here
            self.process.wait(30)
        self._remove_cgroup()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.poweroff(60)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
        self._remove_cgroup()
        subprocess.run(["umount", "-l", str(self.merged)], check=False, capture_output=True)

    def console(self) -> str:
        path = self.work / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _find_leader(self) -> int:
        """The node's init: nspawn's child (PID 1 in the node)."""
        assert self.process is not None
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        except OSError:
            return 0
        for child in children:
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    return int(child)
            except OSError:
                continue
        return 0

    def _fresh_cgroup(self) -> None:
        self._remove_cgroup()
        self.cgroup.mkdir()

    def _remove_cgroup(self) -> None:
        """The node's cgroup and what nspawn and the node's systemd left under it, deepest first."""
        if not self.cgroup.exists():
            return
        for _ in range(50):
            dirs = sorted((p for p in self.cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for d in [*dirs, self.cgroup]:
                with contextlib.suppress(OSError):
                    d.rmdir()
            if not self.cgroup.exists():
                return
            time.sleep(0.2)
