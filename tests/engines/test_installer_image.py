"""The node installer image: built with podman offline (FROM scratch + the binary + busybox),
run against a fake host root as the DaemonSet runs it; a second run changes nothing;
uninstall puts the engine's config back as it was and leaves nothing of ponytail's behind.
Built twice: with this machine's /bin/busybox (busybox-static, as make test installs it) and with
Debian's dynamically linked busybox, which runs no applet that has no link in the image."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from support.engines import TIMEOUT, unique

pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")

BUILD = Path(__file__).resolve().parents[2] / "packaging" / "installer" / "build-image.sh"


def debian_busybox(directory: Path) -> Path:
    """Debian's dynamically linked busybox (the ``busybox`` package, not busybox-static), unpacked
    from its .deb into ``directory``: nothing is installed on the machine."""
    directory.mkdir(parents=True, exist_ok=True)
    fetched = subprocess.run(["apt-get", "download", "busybox"], cwd=directory, capture_output=True, text=True, timeout=TIMEOUT)
    if fetched.returncode != 0:
        if "Failed to fetch" in fetched.stderr or "Could not resolve" in fetched.stderr:
            pytest.skip(f"Debian's archive cannot be reached: {fetched.stderr.strip()[-300:]}")
        pytest.fail(f"apt-get download busybox failed: {fetched.stderr[-1000:]}")
    (deb,) = directory.glob("busybox_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(directory / "root")], check=True, timeout=TIMEOUT)
    busybox = directory / "root/bin/busybox"
    linked = subprocess.run(["ldd", str(busybox)], capture_output=True, text=True, timeout=TIMEOUT)
    assert linked.returncode == 0 and "libc.so.6" in linked.stdout, f"not Debian's dynamic busybox: {linked.stdout}{linked.stderr}"
    return busybox


@pytest.fixture(scope="module", params=["machine-busybox", "debian-dynamic-busybox"])
def podman(binary: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """podman with private storage, and the installer image built into it with this machine's
    /bin/busybox, or with Debian's dynamically linked busybox."""
    busybox = Path("/bin/busybox") if request.param == "machine-busybox" else debian_busybox(tmp_path_factory.mktemp("busybox"))
    state = Path(tempfile.mkdtemp(prefix="ponytail-installer-"))
    base = ["podman", "--root", str(state / "root"), "--runroot", str(state / "run"), "--tmpdir", str(state / "tmp"),
            "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--runtime", "runc"]
    image = f"localhost/{unique('ponytail-installer')}:test"
    try:
        built = subprocess.run(["sh", str(BUILD), image], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PODMAN": " ".join(base), "BUSYBOX": str(busybox)},
                               capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stderr[-3000:]
        yield base, image
    finally:
        subprocess.run(base + ["rmi", "-f", image], capture_output=True, timeout=TIMEOUT)
        shutil.rmtree(state, ignore_errors=True)


def installer(podman, host_root: Path, *args: str) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    base, image = podman
    command = base + [
        "run", "--rm", "--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
        "-v", f"{host_root}:/host", "-e", "ENGINE=containerd", "-e", "RESTART_MODE=none", image, *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def test_installer_installs_configures_and_second_run_is_a_no_op(podman, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host = tmp_path / "host"
    config = host / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    original = subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True).stdout
    config.write_text(original)

    first = installer(podman, host, "install")
    assert first.returncode == 0, first.stderr
    assert "installed ponytail in /usr/local/ponytail" in first.stdout
    assert "restart containerd on the node to apply" in first.stdout
    entry = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["ponytail"]
    assert entry["options"]["BinaryName"] == "/usr/local/ponytail/ponytail-runtime"
    assert (host / "usr/local/ponytail/ponytail-runtime").is_symlink()
    assert sorted(p.name for p in (host / "etc/containerd").iterdir()) == ["config.toml"]  # the original is kept elsewhere
    assert len(list((host / "var/lib/ponytail/configure").iterdir())) == 1
    assert "accept_env_when_unprivileged = false" in (host / "etc/ponytail/config.toml").read_text()
    # the installed binary runs on the host, as the engine will run it
    info = subprocess.run([str(host / "usr/local/ponytail/ponytail"), "--version"], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and "ponytail" in info.stdout

    configured = config.read_text()
    second = installer(podman, host, "install")
    assert second.returncode == 0, second.stderr
    assert "is up to date" in second.stdout and "nothing changed" in second.stdout, second.stdout
    assert "restart" not in second.stdout
    assert config.read_text() == configured

    removed = installer(podman, host, "uninstall")
    assert removed.returncode == 0, removed.stderr
    assert removed.stderr == "", removed.stderr  # no step failed, not even one the installer goes on after
    assert "removed /var/lib/ponytail" in removed.stdout, removed.stdout
    assert config.read_text() == original
    assert not (host / "usr/local/ponytail").exists() and not (host / "var/lib/ponytail").exists()
    # what stays: the engine's config as it was, and the policy (the admin's to keep, as a package's conffile)
    files = sorted(str(p.relative_to(host)) for p in host.rglob("*") if not p.is_dir())
    assert files == ["etc/containerd/config.toml", "etc/ponytail/config.toml"], files


def test_installer_refuses_an_engine_config_it_cannot_parse(podman, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host = tmp_path / "host"
    config = host / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("version = 2\n[plugins\n")
    result = installer(podman, host, "install")
    assert result.returncode != 0
    assert "is not valid TOML" in result.stderr
    assert config.read_text() == "version = 2\n[plugins\n"


NVIDIA_SPEC = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
               "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
               "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                                             "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]}]}}


def test_installer_writes_no_second_spec_beside_nvidias(podman, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """nvidia-ctk's spec in the node's /etc/cdi: the installer writes none of its own, and says why and the way out."""
    import json

    host = tmp_path / "host"
    (host / "etc/containerd").mkdir(parents=True)
    (host / "etc/containerd/config.toml").write_text("version = 2\n")
    (host / "etc/cdi").mkdir(parents=True)
    spec = host / "etc/cdi/nvidia.yaml"
    spec.write_text(json.dumps(NVIDIA_SPEC))  # JSON is YAML
    before = spec.read_bytes()
    result = installer(podman, host, "install")
    assert result.returncode == 0, result.stderr
    line = next((x for x in result.stdout.splitlines() if "no CDI spec written" in x), "")
    assert "/etc/cdi/nvidia.yaml (nvidia-ctk's) already defines nvidia.com/gpu" in line, result.stdout
    assert "ponytail migrate --from nvidia" in line and str(host) not in line
    assert spec.read_bytes() == before and not (host / "var/run/cdi").exists()
    assert installer(podman, host, "uninstall").returncode == 0


@pytest.mark.current_engines
def test_installer_on_containerd_2_writes_a_drop_in_and_takes_it_out(podman, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A containerd 2.x config that imports /etc/containerd/conf.d/*.toml (containerd 2.3's default, and Debian
    sid's containerd 2.1 default once nvidia-ctk 1.18+ added the import): the installer's entry goes there,
    config.toml stays as it was, and uninstall leaves the node as it found it."""
    from support.sidroot import sid_binary

    host = tmp_path / "host"
    config = host / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    default = subprocess.run([sid_binary("containerd"), "config", "default"], capture_output=True, text=True, check=True).stdout
    assert default.startswith("version = 3\n") and default.count("\nimports = []\n") == 1, default[:300]
    original = default.replace("\nimports = []\n", "\nimports = ['/etc/containerd/conf.d/*.toml']\n")
    config.write_text(original)
    first = installer(podman, host, "install")
    assert first.returncode == 0, first.stderr
    drop_in = host / "etc/containerd/conf.d/99-ponytail.toml"
    entry = tomllib.loads(drop_in.read_text())["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["ponytail"]
    assert entry["options"]["BinaryName"] == "/usr/local/ponytail/ponytail-runtime"
    assert config.read_text() == original and "restart containerd on the node to apply" in first.stdout, first.stdout
    second = installer(podman, host, "install")
    assert second.returncode == 0 and "restart" not in second.stdout, second.stdout
    removed = installer(podman, host, "uninstall")
    assert removed.returncode == 0, removed.stderr
    assert config.read_text() == original and not drop_in.exists() and not (host / "var/lib/ponytail").exists()


@pytest.mark.current_engines
def test_installer_on_containerd_2_1s_own_default_edits_config_toml_and_gives_it_back(podman, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Debian sid's containerd 2.1 `config default` as the node's config (version 3, importing nothing): no directory
    to put a drop-in in, so the installer adds its runtime to config.toml, and uninstall gives back its bytes."""
    from support.sidroot import sid_binary

    host = tmp_path / "host"
    config = host / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    original = subprocess.run([sid_binary("containerd"), "config", "default"], capture_output=True, text=True, check=True).stdout
    config.write_text(original)
    first = installer(podman, host, "install")
    assert first.returncode == 0, first.stderr
    entry = tomllib.loads(config.read_text())["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["ponytail"]
    assert entry["options"]["BinaryName"] == "/usr/local/ponytail/ponytail-runtime"
    assert "restart containerd on the node to apply" in first.stdout and not (host / "etc/containerd/conf.d").exists(), first.stdout
    removed = installer(podman, host, "uninstall")
    assert removed.returncode == 0, removed.stderr
    assert config.read_text() == original and not (host / "var/lib/ponytail").exists()
