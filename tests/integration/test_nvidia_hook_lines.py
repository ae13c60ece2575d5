"""NVIDIA's specs are read before a start reads them: ``ponytail check``, ``install-nvidia-hook --spec`` and the
guard's spec refresh parse every nvidia-cdi-hook command line of a spec with the hook's own parser. Those of
nvidia-ctk 1.20.0's captured spec (../shared/nvidia) are all served; an invented subcommand and an unknown flag
are named by each of the three."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import yaml

from support.engines import console_script
from support.fakehost import FakeHost
from support.harness import run_ponytail
from support.nvidia_tools import CAPTURED_HOOK, captured_host, spec_text

FROBNICATE = "frobnicate"
BOGUS = "--bogus-flag"


UNSERVED = (["nvidia-cdi-hook", FROBNICATE, "--x"], ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64", BOGUS])


def add_unserved(spec: Path) -> None:
    """Two hooks more in the spec's own edits: a subcommand no toolkit has, and a known one with a flag it
    does not take. Where the spec is as nvidia-ctk writes it (go-yaml's form), in that form."""
    text = spec.read_text()
    marker = "\n    hooks:\n"
    if text.count(marker) != 1:
        data = yaml.safe_load(text)
        hooks = data["containerEdits"]["hooks"]
        hooks += [{"hookName": "createContainer", "path": hooks[0]["path"], "args": args} for args in UNSERVED]
        spec.write_text(yaml.safe_dump(data))
        return
    path = text.split(marker, 1)[1].split("path: ", 1)[1].split("\n", 1)[0]
    entries = "".join(f"        - hookName: createContainer\n          path: {path}\n          args:\n" + "".join(f"            - {a}\n" for a in args)
                      for args in UNSERVED)
    spec.write_text(text.replace(marker, marker + entries))


def write_spec(spec: Path, root: Path, hook: Path) -> Path:
    """nvidia-ctk's captured spec, for the fake host at ``root``, as it wrote it, its hooks run by ``hook``."""
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(spec_text(root).replace(CAPTURED_HOOK, str(hook)))
    return spec


def hook_findings(host: FakeHost, tmp_path: Path, config: str = "") -> list[dict]:
    path = host.write_config()
    path.write_text(path.read_text() + config)
    result = run_ponytail(["check", "-config", str(path), "--engine-root", str(tmp_path / "root"), "--json"])
    return [f for f in json.loads(result.stdout)["findings"] if f["subject"] == "CDI hook"]


def test_check_names_the_hook_lines_ponytail_does_not_serve(tmp_path: Path) -> None:
    host = captured_host(tmp_path)
    hook = tmp_path / "bin/nvidia-cdi-hook"  # ponytail's, as served
    hook.parent.mkdir()
    hook.symlink_to(console_script("ponytail"))
    nvidia_spec = write_spec(tmp_path / "root/etc/cdi/nvidia.yaml", tmp_path, hook)  # where nvidia-ctk writes it, under a fake root
    assert hook_findings(host, tmp_path) == []
    add_unserved(nvidia_spec)
    subcommand, flag = hook_findings(host, tmp_path)
    assert subcommand["level"] == "warning" and f"{nvidia_spec} (nvidia-ctk's) runs '{tmp_path}/bin/nvidia-cdi-hook {FROBNICATE} --x'" in subcommand["message"]
    assert "skips it with a warning" in subcommand["message"]
    assert flag["level"] == "problem" and f"update-ldcache: unknown flag '{BOGUS}'" in flag["message"] and "every start with it stops" in flag["message"]
    failing = hook_findings(host, tmp_path, '[cdi]\nunknown_nvidia_hooks = "fail"\n')
    assert [f["level"] for f in failing] == ["problem", "problem"] and 'unknown_nvidia_hooks = "fail" stops every start' in failing[0]["message"]


def test_install_nvidia_hook_names_them_from_the_spec(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "nvidia.yaml", tmp_path, tmp_path / "bin/nvidia-cdi-hook")
    served = run_ponytail(["install-nvidia-hook", "--spec", str(spec), "--dry-run"])
    assert served.returncode == 0 and served.stderr.decode() == "", served.stderr
    add_unserved(spec)
    named = run_ponytail(["install-nvidia-hook", "--spec", str(spec), "--dry-run"])
    lines = named.stderr.decode().splitlines()
    assert named.returncode == 0 and len(lines) == 2, lines
    assert lines[0].startswith(f"ponytail: warning: {spec} runs '{tmp_path}/bin/nvidia-cdi-hook {FROBNICATE} --x'") and "newer toolkit" in lines[0]
    assert f"unknown flag '{BOGUS}'" in lines[1] and "every start with it stops" in lines[1]
    assert f"{tmp_path}/bin/nvidia-cdi-hook" in named.stdout.decode()  # the link is still made where the spec looks


def test_the_guards_spec_refresh_logs_them(tmp_path: Path) -> None:
    """On a driver event the guard writes its --cdi-spec files again and reads the specs beside them
    (and in /etc/cdi, /var/run/cdi): NVIDIA's lines it would not serve are logged."""
    host = captured_host(tmp_path)
    specs = tmp_path / "cdi"
    nvidia = write_spec(specs / "nvidia.yaml", tmp_path, Path(CAPTURED_HOOK))
    nvidia.write_text(nvidia.read_text().replace("kind: nvidia.com/gpu", "kind: k8s.device-plugin.nvidia.com/gpu"))  # not ponytail's kind
    add_unserved(nvidia)
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    config = host.write_config()
    log = Path(config.read_text().split('[log]\nfile = "', 1)[1].split('"', 1)[0])
    daemon = subprocess.Popen([console_script("ponytail"), "guard", "--config", str(config), "--events", str(fifo), "--interval", "600",
                               "--cdi-spec", str(specs / "ponytail.yaml")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(lambda: "pass (start)" in _text(log))
        assert FROBNICATE not in _text(log)  # read on the driver's events, not at every pass
        with open(fifo, "w") as events:
            events.write("change module nvidia\n")
        _wait(lambda: "1 event(s)" in _text(log))
        said = [line for line in _text(log).splitlines() if "CDI hook: " in line]
        assert len(said) == 2, _text(log)
        assert f"{nvidia} (nvidia-ctk's) runs '{CAPTURED_HOOK} {FROBNICATE} --x'" in said[0] and "warning" in said[0]
        assert f"unknown flag '{BOGUS}'" in said[1]
        assert "cdi generate --output " in _text(log) and (specs / "ponytail.yaml").exists()  # another kind: ponytail's is written beside
    finally:
        daemon.terminate()
        assert daemon.wait(timeout=30) == 0, daemon.stderr.read() if daemon.stderr else ""


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _wait(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)
