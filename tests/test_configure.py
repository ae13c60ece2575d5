"""`ponytail configure` edits each engine's own config the way its users would by hand:
stock configs (containerd's own `containerd config default`, a typical daemon.json and
crio.conf) and hostile ones (invalid TOML/JSON, a symlink, a read-only file)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from support.engines import console_script

RUNTIME = "/usr/local/bin/ponytail-runtime"
CRI = 'plugins."io.containerd.grpc.v1.cri"'

DAEMON_JSON = """{
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m", "max-file": "3"},
  "storage-driver": "overlay2",
  "runtimes": {"crun": {"path": "/usr/bin/crun"}}
}
"""

CRIO_CONF = """# The CRI-O configuration file (abridged from crio.conf(5)).
[crio]
# Path to the "root directory".
root = "/var/lib/containers/storage"

[crio.runtime]
# default_runtime is the _name_ of the OCI runtime to be used as the default.
default_runtime = "runc"
hooks_dir = ["/usr/share/containers/oci/hooks.d"]

[crio.runtime.runtimes.runc]
runtime_path = ""
runtime_type = "oci"
runtime_root = "/run/runc"
"""

CONTAINERD_V3 = """# containerd 2.x
version = 3
root = "/var/lib/containerd"

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    # keep this comment
    enable_cdi = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true  # the node uses the systemd cgroup driver
"""


def configure(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [console_script("ponytail"), "configure", "--path", RUNTIME, *args], capture_output=True, text=True, timeout=60
    )


def stock_containerd_config(path: Path) -> str:
    text = subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True, timeout=60).stdout
    path.write_text(text)
    return text


def comments(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


def test_containerd_stock_config_gets_the_runtime_and_keeps_everything_else(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    original = stock_containerd_config(config)
    config.chmod(0o640)
    first = configure("--runtime", "containerd", "--config-file", str(config), "--set-as-default")
    assert first.returncode == 0, first.stderr
    assert "restart the engine to apply: systemctl restart containerd" in first.stdout
    assert f"{config}.ponytail-backup" in first.stdout
    assert (tmp_path / "config.toml.ponytail-backup").read_text() == original
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    text = config.read_text()
    old, new = tomllib.loads(original), tomllib.loads(text)
    cri_old, cri_new = old["plugins"]["io.containerd.grpc.v1.cri"], new["plugins"]["io.containerd.grpc.v1.cri"]
    entry = cri_new["containerd"]["runtimes"]["ponytail"]
    assert entry["runtime_type"] == "io.containerd.runc.v2"
    assert entry["options"]["BinaryName"] == RUNTIME
    assert entry["options"]["SystemdCgroup"] == cri_old["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"]
    assert "cdi.k8s.io/*" in entry["container_annotations"]
    assert cri_new["containerd"]["default_runtime_name"] == "ponytail"
    # nothing else changed: the runc entry, every other plugin and key
    assert cri_new["containerd"]["runtimes"]["runc"] == cri_old["containerd"]["runtimes"]["runc"]
    del cri_new["containerd"]["runtimes"]["ponytail"]
    cri_new["containerd"]["default_runtime_name"] = "runc"
    assert new == old
    # idempotent: the second run changes nothing, not even the file's bytes
    second = configure("--runtime", "containerd", "--config-file", str(config), "--set-as-default")
    assert second.returncode == 0 and "already configured" in second.stdout, second.stdout
    assert config.read_text() == text
    # uninstall: the original, byte for byte
    removed = configure("--runtime", "containerd", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert config.read_text() == original
    assert not (tmp_path / "config.toml.ponytail-backup").exists()


def test_containerd_v3_keeps_comments_and_runc_options(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONTAINERD_V3)
    result = configure("--runtime", "containerd", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    text = config.read_text()
    assert comments(text) == comments(CONTAINERD_V3)
    assert "SystemdCgroup = true  # the node uses the systemd cgroup driver" in text
    runtime = tomllib.loads(text)["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["containerd"]["runtimes"]["ponytail"]["options"] == {"SystemdCgroup": True, "BinaryName": RUNTIME}
    assert runtime["containerd"]["default_runtime_name"] == "runc"  # not asked to be the default
    assert text.startswith('# containerd 2.x\nversion = 3\nroot = "/var/lib/containerd"\n')


def test_containerd_runtime_table_without_runc_gets_runc_too(tmp_path: Path) -> None:
    """A runtime defined but the default (runc) missing makes the CRI plugin fail to load."""
    config = tmp_path / "config.toml"
    result = configure("--runtime", "containerd", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    runtimes = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    assert runtimes["ponytail"]["options"] == {"BinaryName": RUNTIME}
    assert tomllib.loads(config.read_text())["version"] == 2


def test_dry_run_prints_a_diff_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    original = stock_containerd_config(config)
    result = configure("--runtime", "containerd", "--config-file", str(config), "--set-as-default", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"--- {config}\n+++ {config}\n@@ ")
    assert '-      default_runtime_name = "runc"' in result.stdout
    assert '+      default_runtime_name = "ponytail"' in result.stdout
    assert f'+BinaryName = "{RUNTIME}"' in result.stdout
    assert "dry run: nothing written" in result.stdout
    assert config.read_text() == original and sorted(os.listdir(tmp_path)) == ["config.toml"]


def test_docker_daemon_json(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text(DAEMON_JSON)
    result = configure("--runtime", "docker", "--config-file", str(config), "--set-as-default")
    assert result.returncode == 0, result.stderr
    assert "systemctl restart docker" in result.stdout
    document = json.loads(config.read_text())
    assert document["runtimes"] == {"crun": {"path": "/usr/bin/crun"}, "ponytail": {"path": RUNTIME}}
    assert document["default-runtime"] == "ponytail"
    assert list(document)[:3] == ["log-driver", "log-opts", "storage-driver"]  # order kept
    assert {k: v for k, v in document.items() if k not in ("runtimes", "default-runtime")} == {
        k: v for k, v in json.loads(DAEMON_JSON).items() if k != "runtimes"
    }
    text = config.read_text()
    again = configure("--runtime", "docker", "--config-file", str(config), "--set-as-default")
    assert "already configured" in again.stdout and config.read_text() == text
    removed = configure("--runtime", "docker", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0 and "restored" in removed.stdout, removed.stdout
    assert config.read_text() == DAEMON_JSON


def test_docker_without_daemon_json(tmp_path: Path) -> None:
    config = tmp_path / "docker" / "daemon.json"
    result = configure("--runtime", "docker", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    assert json.loads(config.read_text()) == {"runtimes": {"ponytail": {"path": RUNTIME}}}
    removed = configure("--runtime", "docker", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0 and "removed the file (ponytail created it)" in removed.stdout, removed.stdout
    assert os.listdir(config.parent) == []  # as before: no daemon.json


def test_uninstall_keeps_a_created_file_someone_added_to(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    assert configure("--runtime", "containerd", "--config-file", str(config)).returncode == 0
    assert (tmp_path / "config.toml.ponytail-created").exists()
    configure("--runtime", "containerd", "--config-file", str(config), "--uninstall")
    assert not config.exists() and os.listdir(tmp_path) == []
    assert configure("--runtime", "containerd", "--config-file", str(config)).returncode == 0
    config.write_text(config.read_text() + '\n[debug]\n  level = "debug"  # added by hand\n')
    removed = configure("--runtime", "containerd", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    text = config.read_text()
    assert 'level = "debug"  # added by hand' in text and "ponytail" not in text


def test_crio_drop_in_beside_crio_conf(tmp_path: Path) -> None:
    config = tmp_path / "crio.conf"
    config.write_text(CRIO_CONF)
    result = configure("--runtime", "crio", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    drop_in = tmp_path / "crio.conf.d" / "99-ponytail.conf"
    assert config.read_text() == CRIO_CONF  # crio.conf itself untouched
    assert tomllib.loads(drop_in.read_text()) == {
        "crio": {"runtime": {"runtimes": {"ponytail": {"runtime_path": RUNTIME, "runtime_type": "oci"}}}}
    }
    assert "systemctl restart crio" in result.stdout
    text = drop_in.read_text() + "# a note added by hand\n"
    drop_in.write_text(text)
    default = configure("--runtime", "crio", "--config-file", str(config), "--set-as-default")
    assert default.returncode == 0, default.stderr
    assert "# a note added by hand" in drop_in.read_text()
    assert tomllib.loads(drop_in.read_text())["crio"]["runtime"]["default_runtime"] == "ponytail"
    removed = configure("--runtime", "crio", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0 and not drop_in.exists()


def test_podman_hooks_file_runs_on_defaults_alone(tmp_path: Path) -> None:
    hooks_file = tmp_path / "hooks.d" / "ponytail.json"
    hook = console_script("ponytail")
    result = subprocess.run(
        [hook, "configure", "--runtime", "podman", "--config-file", str(hooks_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(hooks_file.read_text())
    assert document["hook"] == {"path": hook, "args": ["ponytail"]}  # no -config: the config file is optional
    assert "nothing to restart" in result.stdout
    hooks_file.write_text("{ half written")  # a broken hooks file makes every podman run fail: ponytail's own, replaced
    again = subprocess.run(
        [hook, "configure", "--runtime", "podman", "--config-file", str(hooks_file), "--set-as-default"],
        capture_output=True, text=True, timeout=60,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(hooks_file.read_text())["when"] == {"always": True}


@pytest.mark.parametrize(
    "engine, name, text, expected",
    [
        ("containerd", "config.toml", 'version = 2\n[plugins\n', "is not valid TOML"),
        ("containerd", "config.toml", '[plugins.cri]\nsystemd_cgroup = true\n', "config version 1"),
        ("containerd", "config.toml", 'version = 2\nplugins = 3\n', "'plugins' is not a table"),
        ("containerd", "config.toml", b"version = 2\n# \xff\n", "is not UTF-8"),
        ("docker", "daemon.json", '{"runtimes": {"crun": {"path": "/usr/bin/crun"}},}', "is not valid JSON"),
        ("docker", "daemon.json", '["runtimes"]', "must hold a JSON object"),
        ("docker", "daemon.json", '{"runtimes": []}', "'runtimes' is not an object"),
        ("crio", "crio.conf", '[crio.runtime\n', "is not valid TOML"),
    ],
)
def test_a_file_it_cannot_parse_is_refused_in_one_line(tmp_path: Path, engine: str, name: str, text, expected: str) -> None:
    config = tmp_path / name
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = sorted(os.listdir(tmp_path))
    result = configure("--runtime", engine, "--config-file", str(config))
    assert result.returncode == 2, result.stdout
    assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert config.read_bytes() == (text if isinstance(text, bytes) else text.encode())
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("engine", ["containerd", "docker"])
def test_symlinked_and_read_only_configs_are_refused(tmp_path: Path, engine: str) -> None:
    real = tmp_path / "real"
    if engine == "containerd":
        stock_containerd_config(real)
    else:
        real.write_text(DAEMON_JSON)
    original = real.read_text()
    link = tmp_path / "link"
    link.symlink_to(real)
    result = configure("--runtime", engine, "--config-file", str(link))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "is a symlink" in result.stderr and "--config-file" in result.stderr
    real.chmod(0o444)
    result = configure("--runtime", engine, "--config-file", str(real))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "is read-only (mode 0444)" in result.stderr
    assert real.read_text() == original and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]
