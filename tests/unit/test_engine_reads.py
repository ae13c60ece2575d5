"""What an engine's registered() reads of a node under --root: its own files only, never a link out of
the node's tree, never a FIFO waited on; a config that cannot be parsed is one ConfigError."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ponytail.engines import docker
from ponytail.engines.configread import read_config
from ponytail.engines.model import Settings
from ponytail.errors import ConfigError

pytestmark = pytest.mark.unit

OURS = {"runtimes": {"ponytail": {"path": "/usr/local/bin/ponytail-runtime"}}}


def _node(tmp_path: Path) -> Path:
    node = tmp_path / "node"
    (node / "etc/docker").mkdir(parents=True)
    return node


def test_a_link_out_of_the_node_is_resolved_inside_it(tmp_path: Path) -> None:
    node = _node(tmp_path)
    outside = tmp_path / "daemon.json"
    outside.write_text(json.dumps(OURS))
    (node / "etc/docker/daemon.json").symlink_to(outside)  # absolute: the node's own /tmp/..., not this host's
    assert read_config(str(node), f"{node}/etc/docker/daemon.json") == ""
    assert docker.registered(str(node)) is None
    (node / "etc/docker/daemon.json").unlink()
    (node / "etc/docker/daemon.json").write_text(json.dumps(OURS))
    assert docker.registered(str(node)) is not None


def test_a_path_that_climbs_out_of_the_node_is_not_read(tmp_path: Path) -> None:
    node = _node(tmp_path)
    (tmp_path / "secret").write_text("x")
    assert read_config(str(node), f"{node}/../secret") == ""


def test_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    node = _node(tmp_path)
    os.mkfifo(node / "etc/docker/daemon.json")
    assert read_config(str(node), f"{node}/etc/docker/daemon.json") == ""
    assert docker.registered(str(node)) is None


def test_a_config_nested_too_deep_is_one_config_error(tmp_path: Path) -> None:
    text = "[" * (sys.getrecursionlimit() * 20)
    with pytest.raises(ConfigError, match="is not valid JSON"):
        docker.edit("/etc/docker/daemon.json", text, Settings())
