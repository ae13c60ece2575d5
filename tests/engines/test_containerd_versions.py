"""`ponytail configure --runtime containerd` on each config version the supported containerd
releases write, each from that release's own `containerd config default`: version 2 (Debian's
containerd 1.6), version 4 (containerd 2.3.4, from ../shared/engines/current-engines-x86_64.tar.xz
or $ENGINES_DIR; its `config migrate` of 1.6's config too) and version 3 (containerd 2.0-2.2's
layout, which 2.3 still reads). Each edited config is loaded by a private containerd of that
release: `ctr plugins ls` shows the CRI plugin ok; uninstall gives the bytes back."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
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

REPO = Path(__file__).resolve().parents[2]
# ../shared beside the checkout (CI, /work/main), or beside the worktrees' folder (/work/wt/NAME)
TARBALLS = [base / "shared" / "engines" / "current-engines-x86_64.tar.xz" for base in (REPO.parent, REPO.parent.parent)]


@pytest.fixture(scope="session")
def containerd_2_3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory holding containerd 2.3.4 and its ctr: $ENGINES_DIR, else the shared tarball unpacked."""
    given = os.environ.get("ENGINES_DIR")
    if given:
        directory = Path(given)
    elif any(t.exists() for t in TARBALLS):
        directory = tmp_path_factory.mktemp("engines")
        with tarfile.open(next(t for t in TARBALLS if t.exists())) as tar:
            wanted = [m for m in tar.getmembers() if m.isfile() and m.name.lstrip("./") in ("containerd", "ctr")]
            tar.extractall(directory, members=wanted)  # noqa: S202 - the engines tarball of ../shared, two regular files by name
    else:
        pytest.skip(f"containerd 2.3 is not here: no {TARBALLS[0]} and no ENGINES_DIR (see ../shared/engines/README.md)")
    version = subprocess.run([str(directory / "containerd"), "--version"], capture_output=True, text=True, timeout=TIMEOUT)
    if version.returncode != 0 or " v2." not in version.stdout:
        pytest.skip(f"{directory}/containerd is not containerd 2.x: {version.stdout or version.stderr}")
    return directory


def configure(config: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([console_script("ponytail"), "configure", "--runtime", "containerd", "--config-file", str(config),
                           "--path", RUNTIME, "--state-dir", str(state / "ponytail"), *args],
                          capture_output=True, text=True, timeout=TIMEOUT)


def cri_plugins(containerd: str, ctr: str, config: Path, state: Path) -> list[str]:
    """The CRI plugins' lines of `ctr plugins ls` from a private containerd run with ``config``."""
    text = config.read_text()
    for opt in ("'/opt/containerd'", '"/opt/containerd"'):  # the opt plugin would make /opt/containerd on the host
        text = text.replace(f"path = {opt}", f"path = '{state}/opt'")
    private = state / "private.toml"
    private.write_text(text)
    socket = str(state / "c.sock")
    command = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"', "sh",
               containerd, "--config", str(private), "--root", str(state / "root"), "--state", str(state / "state"), "--address", socket]

    def ctr_(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([ctr, "-a", socket, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    process = start_daemon(command, state / "containerd.log", {}, lambda: ctr_("version").returncode == 0, lambda: None)
    try:
        listed = ctr_("plugins", "ls")
        assert listed.returncode == 0, listed.stderr
        return [" ".join(line.split()) for line in listed.stdout.splitlines() if line.split()[0].startswith(("io.containerd.cri.", "io.containerd.grpc.v1"))]
    finally:
        stop_daemon(process)
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
def test_containerd_2_3_config_versions_4_and_3(containerd_2_3: Path, state: Path, source: str) -> None:
    containerd, ctr = str(containerd_2_3 / "containerd"), str(containerd_2_3 / "ctr")
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
    assert tomllib.loads(text)["version"] == (3 if source == "version 3" else 4)
    configured_and_back(config, state, "io.containerd.cri.v1.runtime")
    plugins = cri_plugins(containerd, ctr, config, state)
    assert "io.containerd.cri.v1 runtime linux/amd64 ok" in plugins and "io.containerd.grpc.v1 cri - ok" in plugins, plugins
