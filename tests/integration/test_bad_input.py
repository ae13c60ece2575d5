"""Bad input, through the real command in hook mode: a broken config.json, an oversized state, a
broken config.toml. Each is one line on stderr that says what and where, exit 2, nothing
mounted in the container and nothing changed in its rootfs, and (once the container's id is
known) the error in the log under that id."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import DEFAULT_LOG_DIR, Sleeper, bundle_for, run_ponytail, state_for, tree_digest

MiB = 1 << 20


def one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text and "internal error" not in text, text
    assert text.count("\n") == 1 and text.startswith("ponytail: error: "), text
    return text


HOST_SHAPE = {"gpu_list": gpus(1)}  # shared_host's


def _write(content: bytes) -> Callable[[Path], None]:
    return lambda config_json: config_json.write_bytes(content)


def _fifo(config_json: Path) -> None:
    config_json.unlink()
    os.mkfifo(config_json)


def _directory(config_json: Path) -> None:
    config_json.unlink()
    config_json.mkdir()


BUNDLES = [
    ("missing", Path.unlink, "config.json not found (missing config.json)"),
    ("empty", _write(b""), "config.json is empty"),
    ("malformed", _write(b'{"root": {"path": "rootfs"'), "config.json is not valid JSON"),
    ("not-an-object", _write(b'["root"]'), "config.json must be a JSON object, not list"),
    ("too-large", _write(b'{"x": "' + b"x" * (4 * MiB) + b'"}'), "config.json is larger than 4194304 bytes"),
    ("deeply-nested", _write(b'{"x": ' * 100000 + b"1" + b"}" * 100000), "config.json is nested too deeply"),
    ("no-root", _write(b'{"process": {}}'), "config.json: 'root' must be an object"),
    ("root-path-number", _write(b'{"root": {"path": 5}}'), "'root.path' is missing or not a string"),
    ("root-path-nul", _write(b'{"root": {"path": "root\\u0000fs"}}'), "'root.path' is missing or not a string"),
    ("process-a-string", _write(b'{"root": {"path": "rootfs"}, "process": "sh"}'), "config.json: 'process' must be an object"),
    ("env-not-a-list", _write(b'{"root": {"path": "rootfs"}, "process": {"env": "A=1"}}'), "'process.env' must be a list"),
    ("env-item-a-number", _write(b'{"root": {"path": "rootfs"}, "process": {"env": [1]}}'), "found int"),
    ("lone-surrogate", _write(b'{"root": {"path": "rootfs\\ud800"}}'), "not valid Unicode"),
    ("a-fifo", _fifo, "config.json is not a regular file"),
    ("a-directory", _directory, "config.json: Is a directory"),
]


@pytest.mark.parametrize("name, spoil, message", BUNDLES, ids=[b[0] for b in BUNDLES])
def test_bad_bundle_is_one_line_exit_2_and_injects_nothing(shared_host: FakeHost, tmp_path: Path, name: str, spoil, message: str) -> None:
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs)
    spoil(bundle / "config.json")
    before = tree_digest(rootfs)
    sleeper = Sleeper()
    try:
        mounts = sleeper.mounts_under(tmp_path)
        state = state_for(bundle, sleeper.pid, container_id=f"bad-{name}")
        result = run_ponytail(["-config", str(shared_host.write_config())], stdin=state, isolated=False)
        assert result.returncode == 2, result.stderr
        assert message in one_line(result.stderr)
        assert sleeper.mounts_under(tmp_path) == mounts
    finally:
        sleeper.stop()
    assert tree_digest(rootfs) == before
    assert f"error container=bad-{name} " in shared_host.log.read_text()


def test_oversized_state_is_refused_before_it_is_parsed(shared_host: FakeHost) -> None:
    state = b'{"id": "x", "pid": 1, "bundle": "/b", "pad": "' + b" " * (4 * MiB) + b'"}'
    result = run_ponytail(["-config", str(shared_host.write_config())], stdin=state)
    assert result.returncode == 2
    assert "OCI state on stdin is larger than 4194304 bytes" in one_line(result.stderr)


CONFIGS = [
    ("syntax", b"[host\n", "TOML syntax error"),
    ("unknown-key", b"[host]\ndriver_rot = '/'\n", "unknown key 'host.driver_rot'"),
    ("unknown-table", b"[hots]\n", "unknown table [hots]"),
    ("wrong-type", b"[library]\npaths = '/usr/lib/libcuda.so.*'\n", "'library.paths' must be a list of strings"),
    ("relative-root", b"[host]\ndriver_root = 'run/nvidia/driver'\n", "'host.driver_root' must be an absolute path"),
    ("deeply-nested", b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    ("not-utf8", b"[host]\ndriver_root = '\xff'\n", "is not UTF-8 text"),
    ("too-large", b"#" * (MiB + 1), "is larger than 1048576 bytes"),
    # tomllib's int() refuses it with ValueError, not TOMLDecodeError
    ("huge-integer", b"[timeouts]\nprobe = " + b"1" * 4301 + b"\n", "a value cannot be read: Exceeds the limit (4300 digits)"),
]


@pytest.mark.parametrize("name, content, message", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_bad_config_is_one_line_with_the_file_and_exit_2(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(content)
    rootfs = make_rootfs(tmp_path / "rootfs")
    before = tree_digest(rootfs)
    result = run_ponytail(["-config", str(config), "-root", str(rootfs)])
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert f"config file {config}" in line and message in line, line
    assert tree_digest(rootfs) == before
    # the config cannot say where to log: the default log, which the tests keep in a directory of their own
    assert f"config file {config}" in (DEFAULT_LOG_DIR / "ponytail.log").read_text()


ENTRY_POINTS = {  # every command that reads the config: (arguments after ponytail, stdin)
    "hook": ([], "state"),
    "manual": (["-root", "ROOTFS"], ""),
    "info": (["info"], ""),
    "check": (["check"], ""),
    "list": (["list"], ""),
    "cdi-generate": (["cdi", "generate"], ""),
    "cdi-list": (["cdi", "list"], ""),
    "cdi-hook": (["cdi-hook"], "state"),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name, content, message", [c for c in CONFIGS if c[0] in ("syntax", "huge-integer", "unknown-key")])
def test_a_bad_config_is_exit_2_at_every_entry_point(tmp_path: Path, entry: str, name: str, content: bytes, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(content)
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    args, stdin = ENTRY_POINTS[entry]
    args = [str(rootfs) if a == "ROOTFS" else a for a in args]
    state = state_for(bundle_for(tmp_path, rootfs), os.getpid()) if stdin == "state" else ""
    result = run_ponytail([*args, "-config", str(config)], stdin=state)
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert f"config file {config}" in line and message in line, line
