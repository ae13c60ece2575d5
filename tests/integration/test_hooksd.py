"""The shipped hooks.d file and `ponytail install-hook` (podman runs it in test_engine_podman)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ponytail.engines.hooksd import hook_file_text

from support.commands import without_checkout_warning
from support.engines import console_script

SHIPPED = Path(__file__).resolve().parents[2] / "hooks.d" / "ponytail.json"
SHIPPED_COMMAND = "/usr/local/bin/ponytail"  # where docs/engines.md installs the binary, and `pip install` as root puts the command


def test_shipped_file_is_what_install_hook_writes_for_the_usual_path() -> None:
    assert SHIPPED.read_text() == hook_file_text(SHIPPED_COMMAND)
    document = json.loads(SHIPPED.read_text())
    assert document["version"] == "1.0.0" and document["stages"] == ["prestart"]
    assert document["hook"]["args"] == ["ponytail"]  # no -config: the config file is optional
    assert document["when"] == {"annotations": {r"^com\.example\.gpu$": "^true$"}}


def install_hook(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``ponytail install-hook ARGS`` without $PONYTAIL_CONFIG (unless ``env`` sets it); its stderr
    without the warning that the tests' command lies in the checkout."""
    environ = {k: v for k, v in os.environ.items() if k != "PONYTAIL_CONFIG"} | (env or {})
    result = subprocess.run([console_script("ponytail"), "install-hook", *args], capture_output=True, text=True, timeout=60, env=environ)
    result.stderr = without_checkout_warning(result.stderr)
    return result


def test_install_hook_refuses_a_command_podman_would_skip(tmp_path: Path) -> None:
    for command in ("/nonexistent/ponytail", "ponytail", str(tmp_path)):
        result = install_hook("--dir", str(tmp_path / "hooks.d"), "--path", command)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "podman would skip the hook" in result.stderr
    assert not (tmp_path / "hooks.d" / "ponytail.json").exists()


def test_install_hook_refuses_a_missing_config_unless_asked_to_write_one(tmp_path: Path) -> None:
    """A hook that names a missing config fails every GPU container: refused (exit 2, nothing
    written) unless --write-config asks for a default config there, which the hook then loads."""
    from ponytail.config import load_config

    hooks_dir = tmp_path / "hooks.d"
    hooks_dir.mkdir()
    (hooks_dir / "ponytail.json").write_text("{ half written")
    missing = tmp_path / "etc" / "missing.toml"
    result = install_hook("--dir", str(hooks_dir), "--config", str(missing))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"--config {missing}: no such file" in result.stderr and "--write-config" in result.stderr
    assert (hooks_dir / "ponytail.json").read_text() == "{ half written" and not missing.exists()

    result = install_hook("--dir", str(hooks_dir), "-config", str(missing), "-write-config")
    assert result.returncode == 0, result.stderr
    assert f"wrote {missing}" in result.stdout and f"wrote {hooks_dir}/ponytail.json" in result.stdout
    assert load_config(str(missing), True).path == str(missing)  # a valid config: the built-in defaults
    hook = json.loads((hooks_dir / "ponytail.json").read_text())["hook"]
    assert hook["path"] == console_script("ponytail") and hook["args"] == ["ponytail", "-config", str(missing)]
    assert sorted(p.name for p in hooks_dir.iterdir()) == ["ponytail.json"]

    missing.write_text("[host]\nproc_root = \"/p\"\n")  # an existing config is never replaced
    assert install_hook("--dir", str(hooks_dir), "--config", str(missing), "--write-config").returncode == 0
    assert load_config(str(missing), True).proc_root == "/p"
    result = install_hook("--dir", str(hooks_dir), "--write-config")
    assert result.returncode == 2 and "name the file with --config FILE" in result.stderr


def test_registration_works_on_defaults_alone(tmp_path: Path) -> None:
    """No --config: no warning, no -config in the file, and the hook it registers runs
    with no config file at all (the built-in defaults)."""
    from support.fakehost import make_rootfs
    from support.harness import bundle_for, state_for

    if os.path.exists("/etc/ponytail/config.toml"):
        pytest.skip("this machine has /etc/ponytail/config.toml")
    hooks_dir = tmp_path / "hooks.d"
    result = install_hook("--dir", str(hooks_dir))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    hook = json.loads((hooks_dir / "ponytail.json").read_text())["hook"]
    assert hook["args"] == ["ponytail"]
    bundle = bundle_for(tmp_path, make_rootfs(tmp_path / "rootfs", programs=()), env=["NVIDIA_VISIBLE_DEVICES=void"])
    # as the engine runs it (argv from the file), with a private /var/log for the default log file
    script = 'mount -t tmpfs tmpfs /var/log && exec "$@"'
    env = {k: v for k, v in os.environ.items() if k != "PONYTAIL_CONFIG"}
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", hook["path"], *hook["args"][1:]],
        input=state_for(bundle, os.getpid()), capture_output=True, text=True, timeout=60, env=env, cwd=bundle,
    )
    assert run.returncode == 0 and run.stderr == "", run.stderr
