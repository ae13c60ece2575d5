"""Current container engines from Debian's archive: a Debian ``sid`` root (scripts/debian-root.sh --suite sid,
built once and cached like the pristine roots) holding containerd 2.1, runc 1.3, docker.io 28.5, podman 5.8 and
crun 1.28, and the command line that runs one of its programs on this machine.

sid's runc and crun need a newer glibc than Debian 12's, and runc re-executes itself: they run inside the
root, not beside Debian 12's libraries. ``in_sid`` runs a command there in private mount and PID namespaces:
the cached root under an overlay whose upper layer is a tmpfs of that namespace (the cache is never written;
what an engine writes under /etc or /var vanishes with it) made the namespace's root (pivot_root), with its
own /proc, the machine's /sys and /dev, a tmpfs /run (the machine's services and their sockets are never
met), and the machine's /tmp and this checkout at their own paths: the tests' fake hosts, rootfs, configs
and state directories are where the tests made them. The engine's hooks are ponytail as users run it: the self-contained binary of ``make binary``
(dist/ponytail/ponytail; the .venv's console scripts start Debian 12's python, which the root lacks). Inside,
this checkout's .venv/bin holds ``ponytail`` and ``ponytail-runtime`` as links to the binary, so every path
a test hands an engine (``console_script(...)``, the links and scripts ``ponytail install-*`` make) runs it.

A daemon started with ``in_sid`` is the first process of its PID namespace: ``stop_sid_daemon`` ends it, and
with it every shim, monitor and container it started.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from functools import cache
from pathlib import Path

import pytest

from support.commands import BINARY, REPO, VENV_BIN

SUITE = "sid"
# Debian sid's engines and what they need (Depends pull in the rest; Recommends are left out)
PACKAGES = ("catatonit", "conmon", "containerd", "containernetworking-plugins", "crun", "docker-cli", "docker.io", "podman", "runc")
DEBIAN_ROOT = REPO / "scripts" / "debian-root.sh"
CACHE = Path(os.environ.get("PONYTAIL_ROOT_CACHE", "/var/cache/ponytail-test-roots"))
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONSOLE_SCRIPTS = ("ponytail", "ponytail-runtime")


@cache
def _built() -> Path | str:
    # the system's PATH (the script's python3 is Debian's); the cache and mirror settings passed on
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "PONYTAIL_ROOT_CACHE": str(CACHE),
           **{k: v for k, v in os.environ.items() if k in ("DEBIAN_MIRROR", "DEBIAN_SECURITY_MIRROR")}}
    result = subprocess.run([str(DEBIAN_ROOT), "--suite", SUITE, "sid-engines", *PACKAGES],
                            capture_output=True, text=True, timeout=1500, env=env)
    if result.returncode == 3:
        return f"Debian's archive cannot be reached: {result.stderr.strip()}"
    if result.returncode != 0:
        raise RuntimeError(f"scripts/debian-root.sh --suite {SUITE} failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip())


def sid_root() -> Path:
    """The cached sid root (built on first use, minutes); skips the test where Debian's archive cannot be reached."""
    root = _built()
    if isinstance(root, str):
        pytest.skip(f"the current engines (Debian sid): {root}")
    if not os.access(BINARY, os.X_OK):
        raise RuntimeError(f"{BINARY} is missing: the engines run the self-contained binary; run 'make binary' (make test-engines does)")
    return root


def versions() -> dict[str, str]:
    """Package -> Debian version of the sid root's packages (what the tests ran against)."""
    lines = (sid_root() / ".ponytail-root-packages").read_text().splitlines()
    return dict(line.split(" ", 1) for line in lines if " " in line)


def sid_binary(name: str) -> str:
    """A program of the root run directly on this machine: only those that link libc alone (containerd, ctr,
    docker), for what needs no runtime (``config default``, clients)."""
    return str(sid_root() / "usr/bin" / name)


@cache
def _links() -> Path:
    """A directory of links to the binary named as the .venv's console scripts, bound over .venv/bin inside."""
    directory = CACHE / f".sid-links-{hashlib.sha256(str(BINARY).encode()).hexdigest()[:12]}"  # one per checkout
    directory.mkdir(parents=True, exist_ok=True)
    for name in CONSOLE_SCRIPTS:
        link = directory / name
        if not link.is_symlink():
            try:
                link.symlink_to(BINARY)
            except FileExistsError:  # another test run made it at the same moment
                pass
    return directory


SCRIPT = r"""set -e
r=$1 w=$2 checkout=$3 venv=$4 links=$5 layer=$6 v2=$7; shift 7
mount -t tmpfs -o mode=0755 tmpfs "$w"
mkdir "$w/upper" "$w/work" "$w/m"
m=$w/m
mount -t overlay overlay -o "lowerdir=$r,upperdir=$w/upper,workdir=$w/work" "$m"
mount -t proc proc "$m/proc"
mount --rbind /sys "$m/sys"
if [ "$v2" = 1 ]; then umount -R "$m/sys/fs/cgroup" || umount -l "$m/sys/fs/cgroup"; mount -t cgroup2 cgroup2 "$m/sys/fs/cgroup"; fi
mount --rbind /dev "$m/dev"
mount -t tmpfs -o mode=0755 tmpfs "$m/run"
mount --rbind /tmp "$m/tmp"
mkdir -p "$m$checkout"
mount --bind "$checkout" "$m$checkout"
mount --bind "$links" "$m$venv"
if [ -n "$layer" ]; then cp -a "$layer/." "$m/etc/"; fi
# pivot_root, not chroot: a hook entering a container's mount namespace (setns) gets that namespace's root,
# which must be the sid root too
cd "$m"
mkdir .old-root
pivot_root . .old-root
cd /
umount -l /.old-root
rmdir /.old-root
exec "$@"
"""


def in_sid(command: list[str], etc_layer: Path | None = None, cgroup2_only: bool = False) -> list[str]:
    """``command`` (a path inside the root, or a name on its PATH) run in the sid root as described above.
    ``etc_layer``: a directory whose files are copied onto the root's /etc first (e.g. cdi/, docker/);
    ``cgroup2_only``: the namespace sees only cgroup2 at /sys/fs/cgroup, as a cgroup v2 host does.
    Run it with ``sid_env(...)`` as its environment."""
    root = sid_root()
    work = CACHE / ".sid-mnt"  # each namespace mounts its own tmpfs here: the directory stays empty
    work.mkdir(parents=True, exist_ok=True)
    return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "sh", "-c", SCRIPT, "sh",
            str(root), str(work), str(REPO), str(VENV_BIN), str(_links()), str(etc_layer or ""), "1" if cgroup2_only else "0",
            "/usr/bin/env", *command]


def sid_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command in the root: sid's PATH (or ``env``'s PATH), C locale, and ``env``."""
    return {"PATH": PATH, "LC_ALL": "C.UTF-8", "HOME": "/root", **(env or {})}


def run_in_sid(command: list[str], env: dict[str, str] | None = None, timeout: int = 120, **kwargs) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    """``in_sid(command, **kwargs)`` to its end: stdout and stderr as text."""
    return subprocess.run(in_sid(command, **kwargs), env=sid_env(env), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def stop_sid_daemon(process: subprocess.Popen) -> None:
    """SIGTERM to the daemon (the first process of its PID namespace, the child of ``unshare --fork``, which
    ignores SIGTERM itself); after 30 s SIGKILL to unshare, whose --kill-child ends the namespace."""
    if process.poll() is not None:
        return
    try:
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        try:
            os.kill(int(child), signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
