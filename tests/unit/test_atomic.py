"""ponytail.fs.atomic, the one atomic-replace writer, and each of its six callers (hooks.d file,
CDI spec, shim bundle config.json, configure, CUDA-version cache, probe cache): nothing planted
in the directory (a file, a FIFO, a symlink at the temporary name) captures the write, a write
that fails half-way (a file size limit: a real short write, then EFBIG) leaves the old file and
no temporary file, an interrupt leaves nothing, and the replaced file keeps its mode and owner
where the caller asks."""

from __future__ import annotations

import os
import resource
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from ponytail.fs import atomic
from ponytail.fs.atomic import replace_file, writer_pid

OLD = b"the old content\n"
BIG = 5000  # bytes the callers are asked to write: more than the file size limit below
LIMIT = 64


def leftovers(directory: Path, target: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != target and not p.name.startswith("planted"))


def in_child_with_file_size_limit(write: Callable[[], None]) -> int:
    """Run ``write`` in a forked child whose files cannot grow past LIMIT bytes (write(2) returns
    a short count, then EFBIG); 0 when it raised OSError, 1 when it returned, 2 on anything else."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
            try:
                write()
                code = 1
            except OSError:
                code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


# -- the writer ------------------------------------------------------------------------------


def test_a_new_file_gets_the_asked_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        replace_file(str(tmp_path / "f.json"), b"{}", 0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == 0o644
    assert (tmp_path / "f.json").read_bytes() == b"{}" and leftovers(tmp_path, "f.json") == []


@pytest.mark.root
def test_the_replaced_file_keeps_its_mode_and_owner_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "daemon.json"
    target.write_bytes(OLD)
    os.chown(target, 1234, 5678)
    os.chmod(target, 0o640)
    replace_file(str(target), b"new", 0o644, keep_mode=True, keep_owner=True)
    st = target.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 1234, 5678)
    replace_file(str(target), b"newer", 0o644, keep_mode=True)  # the mode only: owned by whoever writes
    st = target.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, target.read_bytes()) == (0o640, os.geteuid(), b"newer")


@pytest.mark.parametrize("planted", ["file", "fifo", "symlink"])
def test_nothing_at_the_temporary_name_captures_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str) -> None:
    # a user who can write the directory guessed the temporary name: a file they hold open,
    # a FIFO (the write would block), a symlink to a file of root's
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    guess = tmp_path / "planted-name.tmp"
    if planted == "file":
        guess.write_bytes(b"")
    elif planted == "fifo":
        os.mkfifo(guess)
    else:
        guess.symlink_to(victim)
    names = iter([guess.name])
    real = atomic.temporary_name
    monkeypatch.setattr(atomic, "temporary_name", lambda name: next(names, None) or real(name))
    signal.alarm(10)  # a FIFO opened for writing would block here
    try:
        replace_file(str(tmp_path / "spec.json"), b"data", 0o644)
    finally:
        signal.alarm(0)
    assert (tmp_path / "spec.json").read_bytes() == b"data"
    assert victim.read_bytes() == b"root's file\n"
    assert os.lstat(guess).st_ino != (tmp_path / "spec.json").stat().st_ino
    assert {"file": stat.S_ISREG, "fifo": stat.S_ISFIFO, "symlink": stat.S_ISLNK}[planted](os.lstat(guess).st_mode)
    assert planted != "file" or guess.read_bytes() == b""


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))  # 7 bytes at a time
    replace_file(str(tmp_path / "f"), b"x" * 1000 + b"end")
    assert (tmp_path / "f").read_bytes() == b"x" * 1000 + b"end"


def test_a_write_that_fails_half_way_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(OLD)
    assert in_child_with_file_size_limit(lambda: replace_file(str(target), b"x" * BIG)) == 0
    assert target.read_bytes() == OLD and leftovers(tmp_path, "f") == []


def test_an_interrupt_leaves_the_old_file_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(OLD)

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replace_file(str(target), b"new")
    assert target.read_bytes() == OLD and leftovers(tmp_path, "f") == []


def test_temporary_names_are_hidden_fresh_and_carry_the_writers_pid() -> None:
    a, b = atomic.temporary_name("ponytail.json"), atomic.temporary_name("ponytail.json")
    assert a != b and a.startswith(".ponytail.json.") and not a.endswith(".json")
    assert writer_pid(a) == os.getpid() and writer_pid("probe-1.cache") is None and writer_pid(".x.12.tmp") is None


# -- the six callers -------------------------------------------------------------------------
# each: (the target's name, the temporary name the caller used before it went through the
# writer, a function writing BIG bytes into a directory)


def _hooksd(d: Path) -> None:
    from ponytail.engines.hooksd import install_hook

    install_hook(str(d), "/bin/true", "/" + "c" * BIG)


def _cdi(d: Path) -> None:
    from ponytail.cdi.files import write_atomically

    write_atomically(str(d / "nvidia.json"), b"{" + b" " * BIG + b"}")


def _shim(d: Path) -> None:
    from ponytail.hooks.shim.bundle import write_bundle_config

    write_bundle_config(str(d), {"x": "a" * BIG})


def _configure(d: Path) -> None:
    from ponytail.install.files import write_atomically

    write_atomically(str(d / "daemon.json"), "a" * BIG)


def _cuda_cache(d: Path) -> None:
    from ponytail.host.cuda import _write_cache

    _write_cache(str(d / "cuda-version.json"), {"k": "a" * BIG})


def _probe_cache(d: Path) -> None:
    from ponytail.host.probecache import _write

    _write(str(d), "probe-1.cache", (("a" * BIG,), (), ()))


CALLERS: dict[str, tuple[str, str, Callable[[Path], None]]] = {
    "hooksd": ("ponytail.json", ".ponytail.json.{pid}.tmp", _hooksd),
    "cdi": ("nvidia.json", ".nvidia.json.ponytail-{pid}", _cdi),
    "shim": ("config.json", ".config.json.ponytail-{pid}", _shim),
    "configure": ("daemon.json", ".daemon.json.ponytail-{pid}.tmp", _configure),
    "cuda-cache": ("cuda-version.json", "cuda-version.json.{pid}", _cuda_cache),
    "probe-cache": ("probe-1.cache", ".probe-{pid}", _probe_cache),
}


def _directory(tmp_path: Path, target: str) -> Path:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)  # the caches believe only a directory nobody else can write
    (d / target).write_bytes(OLD)
    (d / target).chmod(0o600)
    return d


@pytest.mark.parametrize("caller", CALLERS)
def test_a_file_planted_at_the_callers_old_temporary_name_is_not_written_through(tmp_path: Path, caller: str) -> None:
    # before: a user who could write the directory created the predictable name, kept it open,
    # and held the file that became the target (configure's daemon.json) after the rename
    target, old_name, write = CALLERS[caller]
    d = _directory(tmp_path, target)
    planted = d / old_name.format(pid=os.getpid())
    planted.write_bytes(b"")
    held = os.open(planted, os.O_RDONLY)
    try:
        write(d)
        assert os.fstat(held).st_ino != (d / target).stat().st_ino
        assert os.fstat(held).st_size == 0
    finally:
        os.close(held)
    assert (d / target).read_bytes() != OLD  # written


@pytest.mark.parametrize("caller", CALLERS)
def test_a_callers_write_that_fails_half_way_leaves_the_old_file_and_no_temporary_file(tmp_path: Path, caller: str) -> None:
    target, _, write = CALLERS[caller]
    d = _directory(tmp_path, target)
    in_child_with_file_size_limit(lambda: write(d))  # the caches swallow the error: a cache only
    assert (d / target).read_bytes() == OLD
    assert leftovers(d, target) == []
