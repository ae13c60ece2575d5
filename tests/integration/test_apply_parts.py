"""The executor's parts: the descriptors of a run are owned by one object that closes them all
(ponytail.fs.descriptors), and apply_operations applies a list of operations without a Plan
around it (what the CDI hook has), leaving no descriptor open whether it succeeds or fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ponytail.errors import InjectionError
from ponytail.fs.descriptors import Descriptors
from ponytail.plan.operations import Mount, Symlink


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_descriptors_closes_what_it_holds_newest_first_and_all_of_them_when_one_fails(tmp_path: Path) -> None:
    first, second = os.open(tmp_path, os.O_PATH), os.open(tmp_path, os.O_PATH)
    held = Descriptors()
    assert held.own(first) == first and held.own(second) == second
    os.close(first)  # already closed: its close fails, the other is closed all the same
    with pytest.raises(OSError):
        held.close()
    with pytest.raises(OSError):
        os.fstat(second)
    held.close()  # nothing left: a second close is nothing


def test_descriptors_as_a_with_block_closes_on_an_exception(tmp_path: Path) -> None:
    before = open_fds()
    with pytest.raises(RuntimeError), Descriptors() as held:
        held.own(os.open(tmp_path, os.O_PATH))
        raise RuntimeError("a step failed")
    assert open_fds() == before


def test_apply_operations_applies_a_list_of_operations_and_leaves_no_descriptor(tmp_path: Path) -> None:
    from ponytail.apply.executor import apply_operations

    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/lib").mkdir(parents=True)
    before = open_fds()
    outcome = apply_operations((Symlink("/usr/lib/libdemo.so.1", "libdemo.so.1.2.3", "a test"),), str(rootfs), None)
    assert os.readlink(rootfs / "usr/lib/libdemo.so.1") == "libdemo.so.1.2.3"
    assert outcome.done and not outcome.warnings
    assert open_fds() == before


def test_a_failing_apply_operations_leaves_no_descriptor(tmp_path: Path) -> None:
    from ponytail.apply.executor import apply_operations

    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/lib").mkdir(parents=True)
    good = tmp_path / "libgood.so.1"
    good.write_bytes(b"\x7fELF")
    operations = (
        Mount("library", str(good), "/usr/lib/libgood.so.1", ("ro", "nosuid", "nodev"), "a test"),
        Mount("library", str(tmp_path / "missing.so.1"), "/usr/lib/missing.so.1", ("ro",), "a test"),
    )
    before = open_fds()
    with pytest.raises(InjectionError, match="missing.so.1"):
        apply_operations(operations, str(rootfs), None)
    assert open_fds() == before
    assert not (rootfs / "usr/lib/libgood.so.1").exists()  # failed before anything was mounted
