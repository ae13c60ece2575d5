"""``ponytail info`` without click: the plain command line takes the fast path, and it
answers exactly as the click command does; anything else still gets click's help and errors."""

from __future__ import annotations

import json

import pytest

from support.fakehost import FakeHost
from support.harness import run_ponytail


def imported_modules(result) -> set[str]:
    """The modules a run imported, from PYTHONPROFILEIMPORTTIME's report on stderr."""
    names = set()
    for line in result.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize(
    "args",
    [
        ["info", "--json", "-config", "{config}"],
        ["info", "-json", "--config", "{config}"],
        ["info", "--config={config}", "--json"],
        ["info", "-config", "{config}"],
    ],
)
def test_plain_info_does_not_import_click(host: FakeHost, args: list[str]) -> None:
    config = str(host.write_config())
    command = [a.format(config=config) for a in args]
    for _ in range(2):  # warm: the probe cache and the CUDA version's are written (a search that began within a
        # clock tick of the fake host's files being written is not remembered, so a fresh host may take two runs)
        assert run_ponytail(command).returncode == 0
    result = run_ponytail(command, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0, result.stderr
    modules = imported_modules(result)
    assert "ponytail.cli.info" in modules  # the report is there
    assert not {m for m in modules if m == "click" or m.startswith("click.")}
    assert "ponytail.cli.commands" not in modules
    # nor json (and with it re and enum): --json is written by ponytail.lite.plainjson, as json.dumps
    # writes it; nor typing (the text rendering's type hints are for type checkers only)
    heavy = {"json", "re", "enum", "typing"}
    assert not modules & heavy, modules & heavy
    # a warm run writes no cache (ponytail.fs.atomic), the fake driver ships no file list and no
    # driver tree is registered: what serves those is not imported either
    idle = {"ponytail.fs.atomic", "ponytail.host.filelist", "ponytail.host.driver_trees"}
    assert not modules & idle, modules & idle


def test_info_answers_the_same_with_and_without_click(host: FakeHost) -> None:
    config = str(host.write_config())
    fast = run_ponytail(["info", "--json", "-config", config])
    # a repeated flag is not plain: click parses it, and ends in the same code
    via_click = run_ponytail(["info", "--json", "--json", "-config", config])
    assert fast.returncode == via_click.returncode == 0, (fast.stderr, via_click.stderr)
    assert fast.stdout == via_click.stdout
    assert json.loads(fast.stdout)["gpus"][0]["pci_bus_id"] == "0000:18:00.0"
    text = run_ponytail(["info", "-config", config])
    assert text.returncode == 0 and b"driver version: 550.54.15" in text.stdout


def test_info_errors_are_one_line_on_both_paths(host: FakeHost, tmp_path) -> None:
    missing = str(tmp_path / "missing.toml")
    fast = run_ponytail(["info", "--json", "-config", missing])
    via_click = run_ponytail(["info", "--json", "--json", "-config", missing])
    assert fast.returncode == via_click.returncode == 2
    assert fast.stderr == via_click.stderr
    assert fast.stderr.decode().startswith("ponytail: error: ") and fast.stderr.count(b"\n") == 1


@pytest.mark.parametrize("args", [["info", "--help"], ["info", "--nope"], ["info", "-config"], ["info", "extra"]])
def test_anything_else_still_goes_to_click(args: list[str]) -> None:
    result = run_ponytail(args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert "click" in imported_modules(result)
    if args[1] == "--help":
        assert result.returncode == 0 and b"Usage: ponytail info" in result.stdout
    else:
        assert result.returncode == 2 and b"ponytail: error: " in result.stderr  # click's message, as one line
