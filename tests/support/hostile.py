"""A stage for hostile-image tests: a container stand-in whose rootfs an attacker wrote, a victim
directory on the host that must never change, and checks made from outside.

The container is a process in its own mount namespace, with a proc and a sysfs mounted in its
rootfs, as the runtime has them at prestart (so /proc/<pid>/root, the magic link back to the
host's /, is reachable from inside the rootfs). Paths written into the image's symlinks are host
paths of the victim: a hook that followed them on the host would change the victim.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import uuid
from pathlib import Path

from support.fakehost import FakeHost, compile_library, make_rootfs
from support.harness import Sleeper, bundle_for, mounts_under, run_ponytail, state_for, tree_digest

CUDA_OK = "cuDriverGetVersion 12040"


def make_victim(path: Path, host: FakeHost) -> Path:
    """A host directory shaped like the places an image would aim at: files, an etc, a lib dir."""
    (path / "etc/ld.so.conf.d").mkdir(parents=True)
    (path / "lib").mkdir()
    (path / "dev").mkdir()
    (path / "file").write_text("victim file\n")
    (path / "etc/ld.so.cache").write_text("the victim's linker cache\n")
    (path / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (path / "etc/ld.so.conf.d/keep.conf").write_text("/opt/keep\n")
    # an old driver library without its SONAME link: an ldconfig let loose here would add one
    old = min((host.driver / host.lib_dir.lstrip("/")).glob("lib*.so.535.104.05"))
    shutil.copy(old, path / "lib" / old.name)
    os.symlink("file", path / "link")
    return path


class Stage:
    """One hostile image in one stand-in container, and the host it must not reach."""

    def __init__(self, tmp_path: Path, host: FakeHost, container_id: str = "hostile") -> None:
        self.tmp = tmp_path
        self.host = host
        self.id = container_id
        self.victim = make_victim(tmp_path / "victim", host)
        self.rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
        self.marker = Path(f"/tmp/ponytail-planted-{uuid.uuid4().hex}")
        self.sleeper = Sleeper()
        for fstype, where in (("proc", "proc"), ("sysfs", "sys")):
            self.in_container(["mount", "-t", fstype, fstype, str(self.rootfs / where)], check=True)
        self.mounts_before = self.container_mounts()
        self.outside_before = self.owned_mounts_outside_rootfs()
        self.victim_digest = tree_digest(self.victim)

    # -- building the image -------------------------------------------------
    def in_root(self, path: str) -> Path:
        return self.rootfs / path.lstrip("/")

    def symlink(self, path: str, target: str) -> None:
        """Make ``path`` in the image a symlink to ``target`` (replacing what is there)."""
        link = self.in_root(path)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        os.symlink(target, link)

    def redirect(self, path: str, victim_part: str, relative: bool = False) -> None:
        """Move the image's ``path`` to <victim path>/<victim_part> inside the image, and leave
        a symlink naming that host path (absolute, or relative with more '..' than the image is deep)."""
        host_path = f"{self.victim}/{victim_part}"
        moved = self.in_root(host_path)
        moved.parent.mkdir(parents=True, exist_ok=True)
        self.in_root(path).mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.in_root(path)), str(moved))
        self.symlink(path, self.escaping(path, host_path) if relative else host_path)

    def escaping(self, link_path: str, host_path: str) -> str:
        """A relative link text from ``link_path`` that reaches the host's ``host_path`` if followed on the host."""
        depth = link_path.strip("/").count("/") + len(self.rootfs.parts) + 2
        return "../" * depth + host_path.lstrip("/")

    def magic(self, host_path: str) -> str:
        """``host_path`` through the container's /proc: a magic link back to the host's /."""
        return f"/proc/{self.sleeper.pid}/root{host_path}"

    def plant_program(self, path: str) -> None:
        """A program that, if anyone ran it, would leave the marker (on the host or in the image)."""
        program = self.in_root(path)
        program.parent.mkdir(parents=True, exist_ok=True)
        if program.is_symlink() or program.exists():
            program.unlink()
        program.write_text(f"#!/bin/sh\necho {path} >> {self.marker}\n")
        program.chmod(0o755)

    def markers(self) -> list[Path]:
        """Every marker a planted program or library left, on the host or in the image."""
        candidates = [self.marker, self.in_root(str(self.marker))]
        candidates += list(self.tmp.rglob("*.ran")) + list(self.rootfs.rglob("*.ran"))
        return [p for p in candidates if p.exists()]

    # -- running ------------------------------------------------------------
    def state(self, env: list[str] | None = None) -> str:
        """The OCI state for this container, its bundle's config.json carrying ``env``."""
        return state_for(bundle_for(self.tmp, self.rootfs, env=env), self.sleeper.pid, container_id=self.id)

    def inject(self, env: list[str] | None = None, config: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
        """Run the hook from this (the host's) mount namespace, as an engine does."""
        config = config or self.host.write_config()
        return run_ponytail(["-config", str(config)], stdin=self.state(env), isolated=False, **kwargs)

    def in_container(self, args: list[str], check: bool = False) -> subprocess.CompletedProcess:
        result = self.sleeper.run(args)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def run_in_image(self, *args: str) -> str:
        result = self.in_container(["chroot", str(self.rootfs), *args])
        return result.stdout + result.stderr

    def container_mounts(self) -> list[str]:
        """Mount points under the rootfs in the container's namespace (what the hook owns)."""
        return self.sleeper.mounts_under(self.rootfs)

    def owned_mounts_outside_rootfs(self) -> list[str]:
        """Mount points in the container's namespace under what the test owns (the victim standing
        for the host, the bundle, the fake host) but outside the rootfs: where no mount may land."""
        return [m for m in self.sleeper.mounts_under(self.tmp, self.host.base) if m != str(self.rootfs) and not m.startswith(f"{self.rootfs}/")]

    # -- checking -----------------------------------------------------------
    def assert_host_untouched(self) -> None:
        """The victim is byte-for-byte the same, no mount landed on it (host's namespace or the
        container's), the container gained mounts only inside its rootfs, the host none."""
        assert tree_digest(self.victim) == self.victim_digest, f"the victim changed: {sorted(_listing(self.victim))}"
        assert mounts_under(self.victim) == [] and mounts_under(self.rootfs) == [], "a mount reached the host's namespace"
        outside = self.owned_mounts_outside_rootfs()
        assert outside == self.outside_before, f"mounts outside the rootfs in the container's namespace: {outside}"
        assert self.markers() == [], "a planted program or library ran"

    def close(self) -> None:
        self.sleeper.stop()
        for leftover in (self.marker,):
            if leftover.exists():
                leftover.unlink()


def _listing(path: Path) -> list[str]:
    return [str(p.relative_to(path)) for p in path.rglob("*")]


def evil_library(directory: Path, name: str = "libevil.so") -> Path:
    """A library whose constructor leaves '<its path>.ran' when anything loads it."""
    directory.mkdir(parents=True, exist_ok=True)
    built = compile_library("evil_preload.c", name, name, "0")
    shutil.copy(built, directory / name)
    return directory / name


class PlantedNode:
    """A device node, FIFO or socket an image ships at ``path``, and a way to tell, afterwards,
    whether anything was written into what it leads to.

    - ``block``: a node of a real loop device over a temporary file (the backing file and the
      device's own page cache are compared with what was there);
    - ``char``: a node of the character device 1:11, the kernel log (/dev/kmsg): what is written
      there becomes a record the test reads back, and a read of it waits for new records, as
      reads of many real devices do; harmless where 1:1 (/dev/mem) would not be;
    - ``fifo``: a FIFO whose reading end the test holds open (so an open for writing does not
      block and what is written stays in the pipe);
    - ``fifo-unread``: a FIFO nobody reads (an open for writing, or for reading, blocks);
    - ``socket``: a listening Unix socket (a connection would be waiting).
    """

    KINDS = ("block", "char", "fifo", "fifo-unread", "socket")

    def __init__(self, kind: str, path: Path, scratch: Path) -> None:
        self.kind = kind
        self.path = path
        self._fds: list[int] = []
        self._loop = ""
        self._socket: socket.socket | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        if kind == "block":
            self._backing = scratch / f"loop-{uuid.uuid4().hex[:8]}.img"
            self._pattern = bytes(range(256)) * 4096  # 1 MiB
            self._backing.write_bytes(self._pattern)
            self._loop = subprocess.run(["losetup", "--find", "--show", str(self._backing)], capture_output=True, text=True, check=True).stdout.strip()
            os.mknod(path, 0o644 | stat.S_IFBLK, os.stat(self._loop).st_rdev)
        elif kind == "char":
            self._fds.append(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
            os.lseek(self._fds[0], 0, os.SEEK_END)  # read from here on: what is logged from now
            os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 11))
        elif kind in ("fifo", "fifo-unread"):
            os.mkfifo(path, 0o644)
            if kind == "fifo":
                self._fds.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        elif kind == "socket":
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            here = os.getcwd()
            os.chdir(path.parent)  # a socket's path is limited to 107 bytes; its name is not
            try:
                self._socket.bind(path.name)
            finally:
                os.chdir(here)
            self._socket.listen(1)
            self._socket.setblocking(False)
        else:
            raise ValueError(kind)

    def written(self) -> bytes:
        """What reached the node's device, pipe or socket (b"" when nothing did)."""
        if self.kind == "block":
            with open(self._loop, "rb") as device:  # the device's page cache: also what is not flushed yet
                seen = device.read(len(self._pattern))
            if seen == self._pattern:
                seen = self._backing.read_bytes()
            return b"" if seen == self._pattern else _first_difference(seen, self._pattern)
        if self.kind == "char":  # the kernel log's records since the node was planted: ldconfig's own?
            records = []
            while True:
                try:
                    records.append(os.read(self._fds[0], 8192))
                except BlockingIOError:
                    break
                except BrokenPipeError:  # records overwritten meanwhile: read on from the oldest left
                    continue
            return b"".join(r for r in records if b"glibc-ld.so" in r or b"linux-gnu" in r)
        if self.kind == "fifo":
            try:
                return os.read(self._fds[0], 65536)
            except BlockingIOError:
                return b""
        if self._socket is not None:
            try:
                connection, _ = self._socket.accept()
            except BlockingIOError:
                return b""
            connection.close()
            return b"(a connection)"
        return b""

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._loop:
            subprocess.run(["losetup", "-d", self._loop], capture_output=True)
            self._loop = ""


def _first_difference(seen: bytes, expected: bytes) -> bytes:
    at = next((i for i, (a, b) in enumerate(zip(seen, expected, strict=False)) if a != b), min(len(seen), len(expected)))
    return seen[at:at + 64] or b"(truncated)"
