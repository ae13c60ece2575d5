"""containerd 2.x drop-ins: `ponytail configure --runtime containerd` writes its runtime to a drop-in of its own
(--drop-in-config, or the directory config.toml already imports, as NVIDIA's toolkit 1.18+ and containerd 2.3's
default config do) and adds an import only where none covers it; Debian sid's containerd 2.1 (`make test-engines`,
config version 3, whose default config imports nothing) merges it (`config dump` shows the runtime; the CRI plugin
loads); --uninstall removes exactly what was added (the bytes back when untouched)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_configure import RUNTIME
from test_containerd_versions import configure, containerd_2, cri_plugins, state  # noqa: F401 - fixtures

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

pytestmark = pytest.mark.current_engines
PLUGIN = "io.containerd.cri.v1.runtime"


def _default(containerd_2: Path) -> str:  # noqa: F811
    return subprocess.run([str(containerd_2 / "containerd"), "config", "default"], capture_output=True, text=True, check=True).stdout


def _default_importing_conf_d(containerd_2: Path) -> str:  # noqa: F811
    """containerd 2.1's default config with the import nvidia-ctk 1.18+ adds (and containerd 2.3's default has)."""
    text = _default(containerd_2)
    assert text.count("\nimports = []\n") == 1, text[:400]
    return text.replace("\nimports = []\n", "\nimports = ['/etc/containerd/conf.d/*.toml']\n")


def _dumped_runtime(containerd_2: Path, config: Path) -> dict:  # noqa: F811
    dump = subprocess.run([str(containerd_2 / "containerd"), "--config", str(config), "config", "dump"], capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    return tomllib.loads(dump.stdout)["plugins"][PLUGIN]["containerd"]["runtimes"].get("ponytail", {})


def test_a_drop_in_is_imported_merged_and_taken_out(containerd_2: Path, state: Path) -> None:  # noqa: F811
    config = state / "etc/config.toml"
    config.parent.mkdir()
    config.write_text(_default(containerd_2))
    original = config.read_bytes()
    drop_in = state / "etc/conf.d/99-ponytail.toml"
    done = configure(config, state, "--drop-in-config", str(drop_in))
    assert done.returncode == 0, done.stderr
    assert f"{state}/etc/conf.d/*.toml" in tomllib.loads(config.read_text())["imports"]
    assert "ponytail" not in tomllib.loads(config.read_text())["plugins"][PLUGIN]["containerd"]["runtimes"]
    assert _dumped_runtime(containerd_2, config)["options"]["BinaryName"] == RUNTIME
    plugins = cri_plugins(str(containerd_2 / "containerd"), str(containerd_2 / "ctr"), config, state)
    assert "io.containerd.cri.v1 runtime linux/amd64 ok" in plugins, plugins
    assert "nothing changed" in configure(config, state, "--drop-in-config", str(drop_in)).stdout
    removed = configure(config, state, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert config.read_bytes() == original and not drop_in.parent.exists()


def test_uninstall_after_a_hand_edit_takes_out_the_import_alone(containerd_2: Path, state: Path) -> None:  # noqa: F811
    config = state / "etc/config.toml"
    config.parent.mkdir()
    config.write_text(_default_importing_conf_d(containerd_2))
    drop_in = state / "etc/conf.d/99-ponytail.toml"
    assert configure(config, state, "--drop-in-config", str(drop_in)).returncode == 0
    config.write_text(config.read_text() + "# a note by hand\n")
    assert configure(config, state, "--uninstall").returncode == 0
    text = config.read_text()
    assert f"{state}/etc/conf.d" not in text and text.endswith("# a note by hand\n") and not drop_in.exists()
    assert tomllib.loads(text)["imports"] == ["/etc/containerd/conf.d/*.toml"]  # containerd's own import kept


def test_the_directory_config_toml_imports_is_preferred(containerd_2: Path, state: Path) -> None:  # noqa: F811
    """A node's /etc seen at a prefix (the installer's /host): the drop-in goes where the import points, under it."""
    config = state / "host/etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(_default_importing_conf_d(containerd_2))
    original = config.read_bytes()
    assert configure(config, state).returncode == 0
    drop_in = state / "host/etc/containerd/conf.d/99-ponytail.toml"
    assert config.read_bytes() == original  # its import covers the drop-in already
    entry = tomllib.loads(drop_in.read_text())["plugins"][PLUGIN]["containerd"]["runtimes"]["ponytail"]
    assert entry["options"]["BinaryName"] == RUNTIME and tomllib.loads(drop_in.read_text())["version"] == 3
    assert configure(config, state, "--uninstall").returncode == 0
    assert config.read_bytes() == original and not drop_in.exists()


def test_containerd_1_x_configs_take_no_drop_in(state: Path) -> None:  # noqa: F811
    config = state / "config.toml"
    config.write_text("version = 2\n")
    refused = configure(config, state, "--drop-in-config", str(state / "conf.d/99-ponytail.toml"))
    assert refused.returncode == 2 and "containerd 1.x's" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert config.read_text() == "version = 2\n"
