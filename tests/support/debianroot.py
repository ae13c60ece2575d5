"""A throwaway Debian 12 system for tests: the pristine root of ``scripts/debian-root.sh`` (cached,
never changed) under an overlay whose upper layer is the test's own, mounted afresh in a private
mount namespace for each command, which then runs chrooted in it with a clean environment.

Each command also gets the root's /proc, the machine's /etc/resolv.conf (apt reaches Debian's
archive), a tmpfs on /tmp, and the directories of ``binds`` (fake hosts, packages) at their own
paths under that tmpfs: nothing of them lands in the upper layer.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from support.commands import REPO

DEBIAN_ROOT = REPO / "scripts" / "debian-root.sh"
ROOT_ENV = "PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive"


def pristine_root(name: str, *packages: str, suite: str = "") -> Path | str:
    """The cached root's path (Debian 12, or ``suite``), or why there is none (Debian's archive unreachable: exit 3)."""
    # the system's PATH: the script's python3 is Debian's, not the tests' stand-in (support.guard)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
    args = [str(DEBIAN_ROOT), *(["--suite", suite] if suite else []), name, *packages]
    result = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    if result.returncode == 3:
        return f"Debian's archive cannot be reached: {result.stderr.strip()}"
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())


@dataclass
class DebianSystem:
    """``lower`` (the pristine root) under an overlay whose layers live in ``work``."""

    lower: Path
    work: Path
    binds: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("upper", "ovl", "merged"):
            (self.work / name).mkdir(parents=True, exist_ok=True)

    def run(self, script: str, timeout: int = 600) -> subprocess.CompletedProcess:
        """Run ``script`` (sh -e) as root in the system; returns its result (stdout and stderr as text)."""
        merged = self.work / "merged"
        binds = "".join(f'mkdir -p "$m{p}" && mount --bind "{p}" "$m{p}"\n' for p in self.binds)
        outer = f"""set -e
m={merged}
mount -t overlay overlay -o lowerdir={self.lower},upperdir={self.work / "upper"},workdir={self.work / "ovl"} "$m"
mount -t proc proc "$m/proc"
mount --bind /etc/resolv.conf "$m/etc/resolv.conf"
mount -t tmpfs tmpfs "$m/tmp"
{binds}exec chroot "$m" /usr/bin/env -i {ROOT_ENV} sh -ec "$1"
"""
        return subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", outer, "sh", script],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def check(self, script: str, timeout: int = 600) -> str:
        """``run``, asserting success; returns stdout."""
        result = self.run(script, timeout)
        assert result.returncode == 0, f"in the Debian root: {script}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result.stdout

    def files(self) -> dict[str, str]:
        """Every path of the system's own filesystem (not /proc, /tmp), with its type, mode and owner."""
        out = self.check("find / -xdev -printf '%p\\t%y %m %u:%g\\n'")
        return dict(line.split("\t", 1) for line in out.splitlines() if line)
