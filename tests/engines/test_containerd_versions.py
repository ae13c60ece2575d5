"""`ponytail configure --runtime containerd` on each config version the supported containerd
releases write, each from that release's own `containerd config default`: version 2 (Debian 12's
containerd 1.6) and version 3 (Debian sid's containerd 2.1, `make test-engines`: its `config default`,
its `config migrate` of 1.6's config, and the hand-written layout of test_configure). Version 4
(containerd 2.3's) has the same plugin ids and is covered by test_configure's config-format tests.
Each edited config is loaded by a private containerd of that release: `ctr plugins ls` shows the CRI
plugin ok; uninstall gives the bytes back."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from test_configure import CONTAINERD_V3, RUNTIME

from support.containerd_cri import make_state_dir, remove_state_dir
from support.engines import TIMEOUT, console_script, processes_naming, start_daemon, stop_daemon
from support.sidroot import in_sid, sid_binary, sid_env, stop_sid_daemon


@pytest.fixture(scope="session")
def containerd_2() -> Path:
    """The directory of Debian sid's containerd 2.1 and its ctr (support.sidroot): both link libc alone and
    run here for `config default`, `config dump` and `config migrate`; cri_plugins runs the daemon in the root."""
    directory = Path(sid_binary("containerd")).parent
    version = subprocess.run([str(directory / "containerd"), "--version"], capture_output=True, text=True, timeout=TIMEOUT)
    assert version.returncode == 0 and " 2.1." in version.stdout, version.stdout + version.stderr
    return directory


def configure(config: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([console_script("ponytail"), "configure", "--runtime", "containerd", "--config-file", str(config),
                           "--path", RUNTIME, "--state-dir", str(state / "ponytail"), *args],
                          capture_output=True, text=True, timeout=TIMEOUT)


def cri_plugins(containerd: str, ctr: str, config: Path, state: Path) -> list[str]:
    """The CRI plugins' lines of `ctr plugins ls` from a private containerd run with ``config``: Debian 12's
    (``containerd`` on PATH), or the sid root's (a path of support.sidroot, run in the root)."""
    text = config.read_text()
    for opt in ("'/opt/containerd'", '"/opt/containerd"'):  # the opt plugin would make /opt/containerd on the host
        text = text.replace(f"path = {opt}", f"path = '{state}/opt'")
    private = state / "private.toml"
    private.write_text(text)
    socket = str(state / "c.sock")
    arguments = ["--config", str(private), "--root", str(state / "root"), "--state", str(state / "state"), "--address", socket]
    sid = containerd.startswith("/")
    if sid:
        command, env, stop = in_sid(["containerd", *arguments]), sid_env(), stop_sid_daemon
    else:
        command = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"', "sh", containerd, *arguments]
        env, stop = {}, stop_daemon

    def ctr_(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([ctr, "-a", socket, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    process = start_daemon(command, state / "containerd.log", env, lambda: ctr_("version").returncode == 0, lambda: None, stop=stop)
    try:
        listed = ctr_("plugins", "ls")
        assert listed.returncode == 0, listed.stderr
        return [" ".join(line.split()) for line in listed.stdout.splitlines() if line.split()[0].startswith(("io.containerd.cri.", "io.containerd.grpc.v1"))]
    finally:
        stop(process)
        for pid in processes_naming(socket):
            os.kill(pid, 9)


@pytest.fixture
def state() -> Iterator[Path]:
    directory = make_state_dir()
    yield directory
    remove_state_dir(directory)


def configured_and_back(config: Path, state: Path, plugin: str) -> str:
    """Configure (as the default runtime) and check the entry; the configured text."""
    original = config.read_bytes()
    result = configure(config, state, "--set-as-default")
    assert result.returncode == 0, result.stderr
    text = config.read_text()
    runtime = tomllib.loads(text)["plugins"][plugin]["containerd"]
    assert runtime["default_runtime_name"] == "ponytail"
    assert runtime["runtimes"]["ponytail"]["options"]["BinaryName"] == RUNTIME
    assert runtime["runtimes"]["ponytail"]["runtime_type"] == "io.containerd.runc.v2"
    removed = configure(config, state, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert config.read_bytes() == original and sorted(os.listdir(config.parent)) == [config.name]
    config.write_text(text)  # configured again, for the engine to load
    return text


@pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd is not installed")
def test_containerd_1_6_default_config_version_2(state: Path) -> None:
    config = state / "etc" / "config.toml"
    config.parent.mkdir()
    config.write_text(subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True).stdout)
    assert tomllib.loads(config.read_text())["version"] == 2
    configured_and_back(config, state, "io.containerd.grpc.v1.cri")
    plugins = cri_plugins("containerd", "ctr", config, state)
    assert "io.containerd.grpc.v1 cri linux/amd64 ok" in plugins, plugins


@pytest.mark.current_engines
@pytest.mark.parametrize("source", ["config default", "config migrate of 1.6's default", "version 3"])
def test_containerd_2_1_config_version_3(containerd_2: Path, state: Path, source: str) -> None:
    containerd, ctr = str(containerd_2 / "containerd"), str(containerd_2 / "ctr")
    config = state / "etc" / "config.toml"
    config.parent.mkdir()
    if source == "config default":
        text = subprocess.run([containerd, "config", "default"], capture_output=True, text=True, check=True).stdout
    elif source == "version 3":
        text = CONTAINERD_V3.replace('root = "/var/lib/containerd"\n', "")
    else:
        if shutil.which("containerd") is None:
            pytest.skip("containerd 1.6 is not installed: no config of its to migrate")
        old = state / "old.toml"
        old.write_text(subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True).stdout)
        text = subprocess.run([containerd, "--config", str(old), "config", "migrate"], capture_output=True, text=True, check=True).stdout
    config.write_text(text)
    assert tomllib.loads(text)["version"] == 3
    configured_and_back(config, state, "io.containerd.cri.v1.runtime")
    plugins = cri_plugins(containerd, ctr, config, state)
    assert "io.containerd.cri.v1 runtime linux/amd64 ok" in plugins and "io.containerd.grpc.v1 cri - ok" in plugins, plugins
