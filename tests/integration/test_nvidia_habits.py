"""NVIDIA's command lines as a migrating user types them: an alias where the habit has one meaning in
ponytail, an error pointing at the equivalent where it has none."""

from __future__ import annotations

import json
from pathlib import Path

from support.engines import console_script
from support.harness import run_ponytail


def test_runtime_configure_is_configure(tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    state = ["--state-dir", str(tmp_path / "state")]
    done = run_ponytail(["runtime", "configure", "--runtime=docker", f"--config={daemon}", "--set-as-default", *state])
    assert done.returncode == 0, done.stderr
    document = json.loads(daemon.read_text())
    assert document["runtimes"]["ponytail"]["path"] == console_script("ponytail-runtime") and document["default-runtime"] == "ponytail"
    same = run_ponytail(["configure", "--runtime", "docker", "--config-file", str(daemon), "--set-as-default", "--dry-run", *state])
    assert same.returncode == 0 and b"already configured for ponytail" in same.stdout
    assert run_ponytail(["configure", "--runtime", "docker", "--config-file", str(daemon), "--uninstall", *state]).returncode == 0
    assert not daemon.exists()


def test_config_points_at_the_config_file() -> None:
    result = run_ponytail(["config", "--set", "nvidia-container-cli.root=/run/nvidia/driver"])
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1, err
    assert "nvidia-ctk's habit" in err and "/etc/ponytail/config.toml" in err and "docs/migration.md" in err
