"""In-root resolution (ponytail.fs.inroot): the kernel's openat2(RESOLVE_IN_ROOT) plus the few
steps of ours: creating missing directories (never on a kernel filesystem), following a last
symlink, naming what was found by its canonical path. Runs without root, but for the last test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ponytail.fs.inroot import InRoot, UnsafePath, real_path_in_root, resolve_in_root

from support.engines import console_script
from support.fakehost import FakeHost, compile_program, gpus, make_rootfs
from support.harness import mounts_under, run_ponytail


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    base = tmp_path / "root"
    base.mkdir()
    (tmp_path / "outside").mkdir()
    fd = os.open(base, os.O_PATH | os.O_DIRECTORY)
    yield base, fd
    os.close(fd)


def test_dotdot_and_absolute_links_stay_in_the_root(root: tuple[Path, int]) -> None:
    base, fd = root
    (base / "usr/lib").mkdir(parents=True)
    (base / "usr/lib/libcuda.so.1").write_text("")
    os.symlink("/../../../usr/lib", base / "lib")  # would be the host's /usr/lib, followed outside
    os.symlink("../../../../outside", base / "usr/escape")
    assert real_path_in_root(fd, "/../../lib/../../lib/libcuda.so.1") == "/usr/lib/libcuda.so.1"
    resolved = resolve_in_root(fd, "/usr/escape/new", create_dirs=True)
    try:  # '..' clamped at the root: /usr/escape is the root's /outside, created for it
        assert resolved.path == "/outside/new" and not resolved.exists
        assert os.readlink(f"/proc/self/fd/{resolved.parent_fd}") == str(base / "outside")
    finally:
        resolved.close()
    assert list((base.parent / "outside").iterdir()) == []


def test_missing_directories_are_created_where_a_dangling_link_leads_inside_the_root(root: tuple[Path, int]) -> None:
    base, fd = root
    os.symlink("/opt/driver/lib", base / "lib64")  # dangling: /opt does not exist yet
    resolved = InRoot(fd).resolve("/lib64/nvidia/libcuda.so.1", create_dirs=True)
    try:
        assert (resolved.path, resolved.name, resolved.exists) == ("/opt/driver/lib/nvidia/libcuda.so.1", "libcuda.so.1", False)
    finally:
        resolved.close()
    assert (base / "opt/driver/lib/nvidia").is_dir() and os.path.islink(base / "lib64")


def test_a_last_symlink_is_followed_or_kept(root: tuple[Path, int]) -> None:
    base, fd = root
    (base / "etc").mkdir()
    os.symlink("../var/cache.conf", base / "etc/ld.so.conf")  # dangling, relative
    followed = resolve_in_root(fd, "/etc/ld.so.conf", create_dirs=True)
    kept = resolve_in_root(fd, "/etc/ld.so.conf", follow_last=False)
    try:
        assert (followed.path, followed.exists) == ("/var/cache.conf", False)  # /var created for it
        assert (kept.path, kept.exists, kept.name) == ("/etc/ld.so.conf", True, "ld.so.conf")
    finally:
        followed.close()
        kept.close()


@pytest.mark.parametrize("path", ["/", ".", "/usr/..", "/a/../.."])
def test_the_root_itself_is_refused(root: tuple[Path, int], path: str) -> None:
    base, fd = root
    (base / "usr").mkdir()
    (base / "a").mkdir()
    with pytest.raises(UnsafePath, match="root"):
        resolve_in_root(fd, path)


def test_loops_are_refused(root: tuple[Path, int]) -> None:
    base, fd = root
    os.symlink("b", base / "a")
    os.symlink("a", base / "b")
    for path, create in (("/a", False), ("/a/x", False), ("/a/x/y", True)):
        with pytest.raises(UnsafePath, match="too many levels of symbolic links"):
            resolve_in_root(fd, path, create_dirs=create)


def _a_cgroup_mount() -> tuple[str, str]:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                return fields[4], fstype
    return "/nonexistent", "cgroup"


@pytest.mark.parametrize("kernel_fs, kind", [("/proc", "proc"), ("/sys", "sysfs"), _a_cgroup_mount()])
def test_no_directory_is_created_on_a_kernel_filesystem(kernel_fs: str, kind: str) -> None:
    if not os.path.isdir(kernel_fs):
        pytest.skip(f"no {kernel_fs} here")
    fd = os.open(kernel_fs, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(UnsafePath, match=f"kernel's {kind}"):
            resolve_in_root(fd, "/ponytail-must-not-exist/x", create_dirs=True)
    finally:
        os.close(fd)
        if os.path.isdir(f"{kernel_fs}/ponytail-must-not-exist"):  # a cgroup made after all
            os.rmdir(f"{kernel_fs}/ponytail-must-not-exist")
    assert not os.path.exists(f"{kernel_fs}/ponytail-must-not-exist")


def test_magic_links_under_proc_are_refused() -> None:
    """/proc/self/root is the host's /: a root with a procfs in it (a container's) must not reach it."""
    fd = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(UnsafePath, match="magic link under /proc"):
            resolve_in_root(fd, "/self/root/etc/passwd")
        assert real_path_in_root(fd, "/self/cwd/x") is None
    finally:
        os.close(fd)


def test_a_nul_byte_is_refused_not_cut(root: tuple[Path, int]) -> None:
    base, fd = root
    (base / "a").mkdir()
    with pytest.raises(UnsafePath):
        resolve_in_root(fd, "/a\0/b/c")


def test_a_kernel_without_openat2_gets_one_line(tmp_path: Path) -> None:
    """No userland walk to fall back on (a hook needs Linux 5.12 for the mount API anyway): a
    kernel that answers openat2 with ENOSYS gets one line and exit 1, from a dry run too."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    rootfs = make_rootfs(tmp_path / "rootfs", programs=())
    for args in (["-debug"], ["-root", str(rootfs)]):
        result = run_ponytail(
            ["-config", str(host.write_config()), *args], command=[str(compile_program("no_openat2.c")), console_script("ponytail")]
        )
        err = result.stderr.decode()
        assert result.returncode == 1 and err.count("\n") == 1, err
        assert "has no openat2: ponytail needs Linux 5.12+" in err, err
    assert mounts_under(rootfs) == []


def test_a_file_of_the_root_is_read_only_when_it_is_a_regular_file_inside_it(root: tuple[Path, int], tmp_path: Path) -> None:
    from ponytail.fs.inroot import read_file_in_root

    base, fd = root
    outside = tmp_path / "host-secret"
    outside.write_bytes(b"host")
    (base / "etc").mkdir(exist_ok=True)
    (base / "etc/cache").write_bytes(b"image's own")
    (base / "etc/escape").symlink_to(outside)  # absolute: resolved inside the root, where it is missing
    (base / "etc/up").symlink_to("../../../../" + str(outside))  # '..' clamps at the root
    os.mkfifo(base / "etc/fifo")  # reading it would block
    (base / "etc/dir").mkdir()
    assert read_file_in_root(fd, "/etc/cache", 1 << 20) == b"image's own"
    assert read_file_in_root(fd, "/etc/cache", 5) == b"image"
    for path in ("/etc/escape", "/etc/up", "/etc/fifo", "/etc/dir", "/etc/missing", "/../etc/escape"):
        assert read_file_in_root(fd, path, 1 << 20) is None, path


SWAPPER = """
import os, sys
directory = sys.argv[1]
os.chdir(directory)
while True:  # 'file' is the regular file, then the FIFO, then the regular file again...
    os.link("regular", "next"); os.rename("next", "file")
    os.link("fifo", "next"); os.rename("next", "file")
"""


def test_a_fifo_swapped_in_after_the_check_is_never_opened(root: tuple[Path, int]) -> None:
    """Another process swaps a FIFO and a regular file at one name as fast as it can while the
    root's file is read again and again: the FIFO is never opened (inotify sees every open but
    an O_PATH one), whatever the moment of the swap."""
    import ctypes
    import subprocess
    import sys

    from ponytail.fs.inroot import read_file_in_root

    base, fd = root
    (base / "regular").write_bytes(b"content")
    os.mkfifo(base / "fifo")
    libc = ctypes.CDLL(None, use_errno=True)
    events = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert events >= 0 and libc.inotify_add_watch(events, str(base / "fifo").encode(), 0x20) >= 0  # IN_OPEN
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(base)])
    try:
        seen = {read_file_in_root(fd, "/file", 64) for _ in range(20000)}
    finally:
        swapper.kill()
        swapper.wait()
    try:
        opened = os.read(events, 4096)
    except BlockingIOError:
        opened = b""
    finally:
        os.close(events)
    assert b"content" in seen, seen  # the swap was under way while reading
    assert opened == b"", "the FIFO was opened"
