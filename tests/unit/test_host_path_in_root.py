"""ponytail.fs.inroot.host_path_in_root, how migrate --root and cdi owners --root name a node's paths: every
link on the way, absolute or relative, is resolved inside the root (a node's /var/run -> /run is its own /run,
never this process's), the last one only when asked; what does not exist is named under its deepest existing
directory, even past a dangling absolute link; a loop is an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ponytail.fs.inroot import UnsafePath, host_path_in_root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "run/cdi").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var/run").symlink_to("/run")
    (tmp_path / "run/etc-link").symlink_to("../../../etc")
    (tmp_path / "dangling").symlink_to("/nowhere/deep")
    (tmp_path / "loop").symlink_to("/loop")
    return tmp_path


def test_absolute_links_on_the_way_stay_inside_the_root(root: Path) -> None:
    assert host_path_in_root(str(root), "/var/run/cdi/nvidia.yaml") == f"{root}/run/cdi/nvidia.yaml"
    assert host_path_in_root(str(root), "/run/etc-link/x") == f"{root}/etc/x"  # '..' stops at the root


def test_the_last_link_is_followed_only_when_asked(root: Path) -> None:
    assert host_path_in_root(str(root), "/var/run") == f"{root}/var/run"
    assert host_path_in_root(str(root), "/var/run", follow_last=True) == f"{root}/run"
    assert os.path.islink(host_path_in_root(str(root), "/var/run"))


def test_what_does_not_exist_is_named_inside_the_root(root: Path) -> None:
    assert host_path_in_root(str(root), "/var/run/missing/a/b") == f"{root}/run/missing/a/b"
    assert host_path_in_root(str(root), "/dangling/x") == f"{root}/nowhere/deep/x"


def test_a_loop_is_refused(root: Path) -> None:
    with pytest.raises(UnsafePath):
        host_path_in_root(str(root), "/loop/x")


def test_this_hosts_root_is_the_path_itself() -> None:
    assert host_path_in_root("/", "/var/run/cdi") == "/var/run/cdi"
