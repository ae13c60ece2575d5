"""``ponytail cdi generate`` without click: a plain command line takes the fast path and writes
the same bytes as the click command; help and anything out of the ordinary still get click's."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.commands import without_checkout_warning
from support.engines import console_script
from support.fakehost import FakeHost, gpus
from support.harness import run_ponytail

HOST_SHAPE = {"gpu_list": gpus(2)}


def imported(result) -> set[str]:  # type: ignore[no-untyped-def]
    return {line.rsplit("|", 1)[1].strip() for line in result.stderr.decode().splitlines() if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("spelling", [
    ["--output", "{out}", "-config", "{config}", "--hook-path", "{hook}"],
    ["-output={out}", "--config={config}", "--hook-path={hook}", "--format=yaml", "--device-name-strategy", "both"],
])
def test_a_plain_generate_imports_no_click_and_writes_what_click_writes(shared_host: FakeHost, tmp_path: Path, spelling: list[str]) -> None:
    config, hook = str(shared_host.write_config()), console_script("ponytail")
    fast_out, click_out = tmp_path / "fast.yaml", tmp_path / "click.yaml"
    args = ["cdi", "generate", *(a.format(out=fast_out, config=config, hook=hook) for a in spelling)]
    fast = run_ponytail(args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert fast.returncode == 0, fast.stderr
    modules = imported(fast)
    assert "ponytail.cli.cdigenerate" in modules and not {m for m in modules if m.split(".")[0] == "click"}, modules
    assert "ponytail.cli.commands" not in modules
    # the same options, one of them twice: not plain, so click parses them, and ends in the same code
    twice = ["cdi", "generate", *(a.format(out=click_out, config=config, hook=hook) for a in spelling), "--capabilities", "all", "--capabilities", "all"]
    via_click = run_ponytail(twice, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert via_click.returncode == 0, via_click.stderr
    assert "click" in imported(via_click)
    assert fast_out.read_bytes() == click_out.read_bytes() and b"nvidia.com/gpu" in fast_out.read_bytes()
    said = [line for line in without_checkout_warning(fast.stderr.decode()).splitlines() if not line.startswith("import time:")]
    assert len(said) == 1 and said[0].startswith(f"wrote {fast_out}: cdiVersion 0.5.0, ") and "nvidia.com/gpu=0" in said[0], said


@pytest.mark.parametrize("args, expected", [
    (["--format", "xml"], "'xml' is not one of"),  # click's own message for a bad choice
    (["--no-such-option"], "No such option"),
    (["--help"], "Usage:"),
])
def test_what_is_not_plain_gets_clicks_help_and_errors(shared_host: FakeHost, args: list[str], expected: str) -> None:
    result = run_ponytail(["cdi", "generate", "-config", str(shared_host.write_config()), *args])
    text = (result.stdout + result.stderr).decode()
    assert expected in text, text
    assert result.returncode == (0 if args == ["--help"] else 2), text


def test_errors_are_one_line_with_the_same_status_on_both_paths(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    fast = run_ponytail(["cdi", "generate", "-config", missing, "--output", str(tmp_path / "a.yaml")])
    via_click = run_ponytail(["cdi", "generate", "-config", missing, "--output", str(tmp_path / "a.yaml"), "--format", "yaml", "--format", "yaml"])
    assert fast.returncode == via_click.returncode == 2, (fast.stderr, via_click.stderr)
    assert fast.stderr == via_click.stderr and fast.stderr.startswith(b"ponytail: error: ") and fast.stderr.count(b"\n") == 1


def test_a_json_spec_is_generated_without_json_re_or_yaml(shared_host: FakeHost, tmp_path: Path) -> None:
    # written by ponytail.lite.plainjson (json.dumps' bytes), names checked with string methods;
    # the second run, as on a node where the probe cache is warm (the first may search with glob)
    args = ["cdi", "generate", "--format", "json", "--output", str(tmp_path / "nvidia.json"),
            "-config", str(shared_host.write_config()), "--hook-path", console_script("ponytail")]
    assert run_ponytail(args).returncode == 0
    warm = run_ponytail(args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert warm.returncode == 0, warm.stderr
    heavy = imported(warm) & {"json", "re", "enum", "yaml", "typing", "sysconfig"}
    assert not heavy, heavy
    spec = (tmp_path / "nvidia.json").read_bytes()
    import json

    assert spec == (json.dumps(json.loads(spec), indent=2) + "\n").encode()  # what json.dumps writes
