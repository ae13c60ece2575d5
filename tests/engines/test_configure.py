"""`ponytail configure` edits each engine's own config the way its users would by hand:
stock configs (containerd's own `containerd config default`, a typical daemon.json and
crio.conf) and hostile ones (invalid TOML/JSON, a symlink, a read-only file)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from support.engines import console_script
from support.fakehost import FakeHost, gpus

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


STATE: list[Path] = []  # this test's --state-dir


@pytest.fixture(autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where configure keeps what it changed: apart from the config's own directory."""
    STATE[:] = [tmp_path_factory.mktemp("state") / "configure"]
    yield STATE[0]


# the hooks.d file names $PONYTAIL_CONFIG's file when it is set: these tests run without it
WITHOUT_CONFIG_VAR = {k: v for k, v in os.environ.items() if k != "PONYTAIL_CONFIG"}


def configure(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [console_script("ponytail"), "configure", "--path", RUNTIME, "--state-dir", str(STATE[0]), *args],
        capture_output=True, text=True, timeout=60,
    )


def record(config: Path) -> dict:
    """What configure recorded for ``config``."""
    [path] = list(STATE[0].iterdir())
    assert path.name == quote(str(config), safe="") + ".json"
    return json.loads(path.read_text())


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
    assert f"the file as it was is kept in {STATE[0]}/" in first.stdout
    assert record(config)["original"] == original and sorted(os.listdir(tmp_path)) == ["config.toml"]
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
    assert sorted(os.listdir(tmp_path)) == ["config.toml"] and not STATE[0].exists()


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
    assert not config.parent.exists()  # as before: no daemon.json, nor the directory ponytail made for it


def test_uninstall_keeps_a_created_file_someone_added_to(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    assert configure("--runtime", "containerd", "--config-file", str(config)).returncode == 0
    assert record(config)["original"] is None and os.listdir(tmp_path) == ["config.toml"]
    configure("--runtime", "containerd", "--config-file", str(config), "--uninstall")
    assert not config.exists() and os.listdir(tmp_path) == []
    assert configure("--runtime", "containerd", "--config-file", str(config)).returncode == 0
    config.write_text(config.read_text() + '\n[debug]\n  level = "debug"  # added by hand\n')
    removed = configure("--runtime", "containerd", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    text = config.read_text()
    assert 'level = "debug"  # added by hand' in text and "ponytail" not in text


def _planted_record(config: Path, original: str) -> None:
    STATE[0].mkdir(parents=True, exist_ok=True)
    planted = STATE[0] / (quote(str(config), safe="") + ".json")
    planted.write_text(json.dumps({"path": str(config), "original": original, "written": None, "added": {}}))
    planted.chmod(0o600)


# how the state directory or a record can be someone else's doing: (what is done after an install)
UNTRUSTED_STATE = {
    "a sticky 1777 directory": lambda config: STATE[0].chmod(0o1777),
    "a group-writable directory": lambda config: STATE[0].chmod(0o770),
    "a directory owned by a user": lambda config: os.chown(STATE[0], 1000, 1000),
    "a symlinked directory": lambda config: (STATE[0].rename(STATE[0].with_name("real")), STATE[0].symlink_to("real")),
    "a record owned by a user": lambda config: os.chown(next(STATE[0].iterdir()), 1000, 1000),
    "a world-readable record": lambda config: next(STATE[0].iterdir()).chmod(0o644),
    "a symlinked record": lambda config: _relink(next(STATE[0].iterdir())),
    "a FIFO for a record": lambda config: _fifo(next(STATE[0].iterdir())),
}


def _relink(record_file: Path) -> None:
    real = record_file.with_name("real.json")
    record_file.rename(real)
    record_file.symlink_to(real.name)


def _fifo(record_file: Path) -> None:
    record_file.unlink()
    os.mkfifo(record_file, 0o600)


@pytest.mark.parametrize("case", UNTRUSTED_STATE)
def test_a_state_directory_or_record_that_others_may_have_written_is_refused(tmp_path: Path, case: str) -> None:
    """The records decide what --uninstall writes into root's engine config: held to the caches'
    rule, or refused with one line before anything is read or written."""
    config = tmp_path / "daemon.json"
    config.write_text(DAEMON_JSON)
    assert configure("--runtime", "docker", "--config-file", str(config)).returncode == 0
    _planted_record(config, '{"runtimes": {"evil": {"path": "/tmp/evil"}}}\n')  # what a planted record would restore
    configured = config.read_text()
    UNTRUSTED_STATE[case](config)
    started = time.monotonic()
    removed = configure("--runtime", "docker", "--config-file", str(config), "--uninstall")
    assert time.monotonic() - started < 30  # a FIFO is never waited on
    assert removed.returncode == 2 and len(removed.stderr.strip().splitlines()) == 1, removed.stderr
    assert "configure's" in removed.stderr and "Traceback" not in removed.stderr, removed.stderr
    assert config.read_text() == configured  # nothing written
    again = configure("--runtime", "docker", "--config-file", str(config), "--set-as-default")
    assert again.returncode == 2 and config.read_text() == configured, again.stderr


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
        [hook, "configure", "--runtime", "podman", "--config-file", str(hooks_file), "--state-dir", str(STATE[0])],
        capture_output=True, text=True, timeout=60, env=WITHOUT_CONFIG_VAR,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(hooks_file.read_text())
    assert document["hook"] == {"path": hook, "args": ["ponytail"]}  # no -config: the config file is optional
    assert "nothing to restart" in result.stdout
    hooks_file.write_text("{ half written")  # a broken hooks file makes every podman run fail: ponytail's own, replaced
    again = subprocess.run(
        [hook, "configure", "--runtime", "podman", "--config-file", str(hooks_file), "--set-as-default", "--state-dir", str(STATE[0])],
        capture_output=True, text=True, timeout=60, env=WITHOUT_CONFIG_VAR,
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


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under ``root``."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


CONTAINERD_MINIMAL = "# written by hand\nversion = 2\n\n[debug]\n  level = 'info'\n"


@pytest.mark.parametrize("engine, name, text, options", [
    ("containerd", "config.toml", CONTAINERD_MINIMAL, ["--set-as-default"]),  # ponytail adds runc too
    ("containerd", "config.toml", CONTAINERD_MINIMAL, []),
    ("containerd", "config.toml", CONTAINERD_V3, ["--set-as-default"]),
    ("containerd", "config.toml", None, []),
    ("docker", "daemon.json", DAEMON_JSON.replace('"storage-driver"', '"default-runtime": "crun",\n  "storage-driver"'), ["--set-as-default"]),
    ("docker", "daemon.json", None, []),
    ("crio", "crio.conf", CRIO_CONF, ["--set-as-default"]),
    ("podman", "hooks.d/ponytail.json", None, []),
    ("podman", "hooks.d/ponytail.json", None, ["--set-as-default"]),
], ids=["containerd-runc-added", "containerd-minimal", "containerd-v3", "containerd-none", "docker", "docker-none", "crio",
        "podman", "podman-always"])
def test_uninstall_leaves_the_config_byte_for_byte_and_nothing_of_ponytails(
    tmp_path: Path, engine: str, name: str, text: str | None, options: list[str]
) -> None:
    etc = tmp_path / "etc"
    config = etc / name
    config.parent.mkdir(parents=True)
    (etc / "crio.conf.d").mkdir()  # CRI-O reads every file in it
    (etc / "crio.conf.d" / "10-site.conf").write_text("[crio.runtime]\nlog_level = 'info'\n")
    if text is not None:
        config.write_text(text)
    before = tree(tmp_path)
    configured = configure("--runtime", engine, "--config-file", str(config), *options)
    assert configured.returncode == 0, configured.stderr
    assert tree(tmp_path) != before
    # nothing of ponytail's but its entries where an engine reads: no backup, no marker
    assert not [p for p in tree(etc) if "ponytail" in p and p not in ("crio.conf.d/99-ponytail.conf", "hooks.d/ponytail.json")]
    removed = configure("--runtime", engine, "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert tree(tmp_path) == before, removed.stdout
    assert not STATE[0].exists()
    again = configure("--runtime", engine, "--config-file", str(config), "--uninstall")
    assert again.returncode == 0 and "not configured for ponytail; nothing changed" in again.stdout, again.stdout
    assert tree(tmp_path) == before


def test_uninstall_after_a_hand_edit_takes_out_exactly_what_ponytail_added(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONTAINERD_MINIMAL)
    assert configure("--runtime", "containerd", "--config-file", str(config)).returncode == 0  # runc comes too
    by_hand = '\n[grpc]\n  address = "/run/other.sock"  # the admin, meanwhile\n'
    config.write_text(config.read_text() + by_hand)
    removed = configure("--runtime", "containerd", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert "removed [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc] (ponytail added it)" in removed.stdout
    assert tomllib.loads(config.read_text()) == tomllib.loads(CONTAINERD_MINIMAL + by_hand)
    assert "ponytail" not in config.read_text() and "# the admin, meanwhile" in config.read_text()
    assert os.listdir(tmp_path) == ["config.toml"] and not STATE[0].exists()


def test_an_older_releases_backup_in_crio_conf_d_goes_at_uninstall(tmp_path: Path) -> None:
    """Releases before kept 99-ponytail.conf.ponytail-backup and .ponytail-created in crio.conf.d,
    where CRI-O reads them as config: uninstall removes them with the drop-in."""
    config = tmp_path / "crio.conf"
    config.write_text(CRIO_CONF)
    drop_ins = tmp_path / "crio.conf.d"
    drop_ins.mkdir()
    (drop_ins / "99-ponytail.conf").write_text("[crio.runtime]\ndefault_runtime = 'ponytail'\n")
    (drop_ins / "99-ponytail.conf.ponytail-backup").write_text("[crio.runtime]\ndefault_runtime = 'ponytail'\n")
    (drop_ins / "99-ponytail.conf.ponytail-created").write_text("")
    removed = configure("--runtime", "crio", "--config-file", str(config), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert os.listdir(drop_ins) == []


def test_a_custom_runc_binary_is_named_with_the_line_that_keeps_it(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONTAINERD_V3.replace("SystemdCgroup = true", "BinaryName = '/opt/runc/bin/runc'\n            SystemdCgroup = true"))
    result = configure("--runtime", "containerd", "--config-file", str(config), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "runc's BinaryName '/opt/runc/bin/runc' is not ponytail's" in result.stdout, result.stdout
    assert "[runtime] path = '/opt/runc/bin/runc'" in result.stdout
    plain = configure("--runtime", "containerd", "--config-file", str(config))
    assert plain.returncode == 0 and "[runtime] path = '/opt/runc/bin/runc'" in plain.stdout, plain.stdout


INSTALLER = Path(__file__).resolve().parents[2] / "packaging" / "installer" / "installer.sh"


@pytest.mark.parametrize("engine, path, text", [
    ("containerd", "etc/containerd/config.toml", CONTAINERD_MINIMAL),
    ("docker", "etc/docker/daemon.json", DAEMON_JSON),
    ("crio", "etc/crio/crio.conf", CRIO_CONF),
    ("podman", "usr/share/containers/oci/hooks.d/ponytail.json", None),
])
def test_the_installers_uninstall_leaves_the_node_as_it_was(tmp_path: Path, engine: str, path: str, text: str | None) -> None:
    """packaging/installer/installer.sh install, then uninstall, on a node's root (this checkout's
    ponytail command as the image's files): the engine's config byte for byte, nothing of ponytail's."""
    host, image = tmp_path / "host", tmp_path / "image"
    image.mkdir()
    (image / "ponytail").symlink_to(console_script("ponytail"))
    (image / "ponytail-runtime").symlink_to("ponytail")
    config = host / path
    config.parent.mkdir(parents=True)
    if text is not None:
        config.write_text(text)
    for directory in ("etc/ponytail", "usr/local", "var/lib", "etc/systemd/system/multi-user.target.wants", "etc/udev/rules.d"):  # a node has these
        (host / directory).mkdir(parents=True, exist_ok=True)
    (host / "etc/ponytail/config.toml").write_text("# the node's own\n")
    before = tree(host)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOST_ROOT": str(host), "IMAGE_DIR": str(image), "ENGINE": engine,
           "RESTART_MODE": "none", "SET_AS_DEFAULT": "true"}
    installed = subprocess.run(["sh", str(INSTALLER), "install"], env=env, capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert tree(host) != before and (host / "usr/local/ponytail/ponytail").is_symlink()
    removed = subprocess.run(["sh", str(INSTALLER), "uninstall"], env=env, capture_output=True, text=True, timeout=120)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert tree(host) == before, removed.stdout


@pytest.mark.parametrize("text, passed", [
    ("version = 2\n", True),  # containerd 1.6, or 1.7 without CDI: ponytail-runtime reads the annotations
    ("version = 2\n[plugins.'io.containerd.grpc.v1.cri']\n  enable_cdi = true\n", False),  # containerd 1.7 with CDI on
    ("version = 3\n", False),  # containerd 2.0-2.2: CDI on by default
    ("version = 4\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = false\n", True),  # 2.3 with CDI turned off
    (CONTAINERD_V3.replace("version = 3", "version = 4"), False),
])
def test_cdi_annotations_go_to_whoever_resolves_them(tmp_path: Path, text: str, passed: bool) -> None:
    """Never both containerd's CDI and ponytail-runtime: the entry passes cdi.k8s.io/* only where containerd does not resolve CDI."""
    config = tmp_path / "config.toml"
    config.write_text(text)
    result = configure("--runtime", "containerd", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    document = tomllib.loads(config.read_text())
    plugin = "io.containerd.grpc.v1.cri" if document["version"] == 2 else "io.containerd.cri.v1.runtime"
    entry = document["plugins"][plugin]["containerd"]["runtimes"]["ponytail"]
    assert ("cdi.k8s.io/*" in entry.get("container_annotations", [])) is passed, entry
    assert ("ponytail cdi generate --output /var/run/cdi/ponytail.yaml" in result.stdout) is not passed, result.stdout


def test_the_installer_keeps_the_cdi_spec_for_containerd_2(tmp_path: Path) -> None:
    """installer.sh with ENGINE=containerd on a containerd 2.x node (config version 3) writes ponytail's CDI
    spec where containerd reads it, in PID 1's mount namespace, and removes it at uninstall. Run as the
    node it takes: HOST_ROOT=/ in a PID and mount namespace of its own (PID 1 there is that namespace's),
    with tmpfs on /run and /var/lib and an overlay on /etc, so this machine's files are untouched."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    image, upper, work = tmp_path / "image", tmp_path / "etc-upper", tmp_path / "etc-work"
    for directory in (image, upper / "ponytail", work):
        directory.mkdir(parents=True)
    (image / "ponytail").symlink_to(console_script("ponytail"))
    (image / "ponytail-runtime").symlink_to("ponytail")
    (upper / "ponytail/config.toml").write_text(host.config_text())
    script = f"""set -e
mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/lib
mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc
mkdir -p /run/containerd && printf 'version = 3\\n' > /run/containerd/config.toml
sh {INSTALLER} install
echo "spec: $(grep -c 'kind: nvidia.com/gpu' /var/run/cdi/ponytail.yaml)"
grep -q 'cdi.k8s.io' /run/containerd/config.toml && echo "annotations passed" || true
sh {INSTALLER} uninstall
test -e /var/run/cdi/ponytail.yaml && echo "spec left" || echo "spec removed"
"""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOST_ROOT": "/", "IMAGE_DIR": str(image), "ENGINE": "containerd",
           "ENGINE_CONFIG": "/run/containerd/config.toml", "INSTALL_DIR": "/run/ponytail-installed", "RESTART_MODE": "none"}
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrote the CDI spec /var/run/cdi/ponytail.yaml" in result.stdout and "spec: 1" in result.stdout, result.stdout
    assert "annotations passed" not in result.stdout
    assert "removed the CDI spec /var/run/cdi/ponytail.yaml" in result.stdout and "spec removed" in result.stdout, result.stdout
