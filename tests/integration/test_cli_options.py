"""The command line a new user types: options before a subcommand, misspelled options,
unknown capabilities, and a dry run that exits as the real run would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click
import pytest

from support.commands import PONYTAIL
from support.fakehost import FakeHost, make_rootfs
from support.harness import bundle_for, run_ponytail, state_for

VALID_CAPABILITIES = "compute, compat32, graphics, utility, video, display, ngx, or all"


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a failed command says (click's usage lines aside)."""
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("Usage:", "Try '"))]
    assert len(lines) == 1, err
    return lines[0]


# 1. ponytail's own options before a subcommand apply to it, as after it

SUBCOMMANDS = [["info"], ["info", "--json"], ["list"], ["check"], ["cdi", "list"], ["cdi", "generate", "--hook-path", "/bin/true"]]


@pytest.mark.parametrize("subcommand", SUBCOMMANDS, ids=" ".join)
@pytest.mark.parametrize("spelling", ["-config", "--config"])
def test_config_before_a_subcommand_is_the_config_after_it(host: FakeHost, subcommand: list[str], spelling: str) -> None:
    config = str(host.write_config())
    after = run_ponytail([*subcommand, spelling, config])
    before = run_ponytail([spelling, config, *subcommand])
    assert (before.returncode, before.stdout) == (after.returncode, after.stdout), before.stderr
    assert after.returncode in (0, 1) and after.stdout  # check exits 1 here: no engine is configured


@pytest.mark.parametrize("subcommand", SUBCOMMANDS, ids=" ".join)
def test_a_missing_or_malformed_config_before_a_subcommand_is_reported_as_after_it(tmp_path: Path, subcommand: list[str]) -> None:
    malformed = tmp_path / "bad.toml"
    malformed.write_text("[host]\nbogus = 1\n")
    for config in (str(tmp_path / "missing.toml"), str(malformed)):
        after = run_ponytail([*subcommand, "-config", config])
        before = run_ponytail(["-config", config, *subcommand])
        assert before.returncode == after.returncode == 2
        assert error_line(before) == error_line(after) and config in error_line(before)


def test_device_and_capabilities_before_list_select_as_after_it(host: FakeHost) -> None:
    config = str(host.write_config())
    after = run_ponytail(["list", "-config", config, "-device", "1", "-capabilities", "utility"])
    before = run_ponytail(["-config", config, "-device", "1", "--capabilities", "utility", "list"])
    assert before.returncode == after.returncode == 0, before.stderr
    assert before.stdout == after.stdout and b"/dev/nvidia0" in before.stdout and b"/dev/nvidia2" not in before.stdout
    every = run_ponytail(["-config", config, "list"]).stdout
    assert b"/dev/nvidia2" in every and before.stdout != every
    # an option after the subcommand wins over the same one before it
    assert run_ponytail(["-device", "0", "list", "-config", config, "-device", "1", "-capabilities", "utility"]).stdout == after.stdout


@pytest.mark.parametrize(
    "args, option",
    [(["-debug", "info"], "-debug"), (["-root", "/tmp", "list"], "-root"), (["-device", "0", "cdi", "list"], "-device"),
     (["--libs", "/x.so", "check"], "-libs"), (["-debug", "configure", "--runtime", "docker"], "-debug")],
)
def test_an_option_the_subcommand_does_not_have_is_an_error_that_says_where_it_goes(args: list[str], option: str) -> None:
    result = run_ponytail(args)
    assert result.returncode == 2
    line = error_line(result)
    assert f"{option} (given before the subcommand) is not an option of 'ponytail " in line, line
    assert "goes without a subcommand" in line


# 9. misspelled options are named as typed, with a suggestion; -name and --name everywhere


@pytest.mark.parametrize(
    "args, typed, suggestion",
    [
        (["-devcie", "0", "-debug"], "-devcie", "-device"),
        (["--devcie", "0", "-debug"], "--devcie", "--device"),
        (["configure", "-runtme", "docker"], "-runtme", "-runtime"),
        (["info", "-jsno"], "-jsno", "-json"),
        (["cdi", "generate", "-outptu", "x.yaml"], "-outptu", "-output"),
        (["list", "-capabilites", "compute"], "-capabilites", "-capabilities"),
    ],
)
def test_a_misspelled_option_is_named_as_typed_with_a_suggestion(args: list[str], typed: str, suggestion: str) -> None:
    result = run_ponytail(args)
    assert result.returncode == 2
    line = error_line(result)
    assert f"No such option '{typed}'" in line and f"Did you mean '{suggestion}'?" in line, line


def test_configure_takes_single_dash_options(tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    one = run_ponytail(["configure", "-runtime", "docker", "-config-file", str(daemon), "-dry-run", "-path", "/usr/bin/ponytail-runtime"])
    two = run_ponytail(["configure", "--runtime", "docker", "--config-file", str(daemon), "--dry-run", "--path", "/usr/bin/ponytail-runtime"])
    assert one.returncode == two.returncode == 0, one.stderr
    assert one.stdout == two.stdout and b"ponytail-runtime" in one.stdout


def test_every_option_of_every_command_takes_both_spellings() -> None:
    from ponytail.cli.commands import cli

    def walk(command: click.Command, path: str):
        yield path, command
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk(sub, f"{path} {name}")

    for path, command in walk(cli, "ponytail"):
        for param in command.params:
            if isinstance(param, click.Option):
                names = {o.lstrip("-") for o in param.opts if len(o.lstrip("-")) > 1}
                for name in names:
                    assert {f"-{name}", f"--{name}"} <= set(param.opts), (path, param.opts)
        help_text = subprocess.run([*PONYTAIL, *path.split()[1:], "-help"], capture_output=True, text=True, timeout=60)
        assert help_text.returncode == 0, help_text.stderr


# 3. an unknown capability: exit 2 on an operator's command line, a warning from an image's env


@pytest.mark.parametrize(
    "args",
    [
        ["-root", "ROOTFS", "-capabilities", "compte"],
        ["-root", "ROOTFS", "--capabilities=all,compte"],
        ["-debug", "-capabilities", "compte"],
        ["list", "-capabilities", "compute,compte"],
        ["-capabilities", "compte", "list"],
        ["cdi", "generate", "--hook-path", "/bin/true", "--capabilities", "compte"],  # the plain command line
        ["cdi", "generate", "-hook-path", "/bin/true", "-capabilities", "compte", "-format", "json"],  # through click
    ],
    ids=" ".join,
)
def test_an_unknown_capability_on_the_command_line_is_exit_2_naming_the_valid_ones(host: FakeHost, rootfs: Path, args: list[str]) -> None:
    args = [str(rootfs) if a == "ROOTFS" else a for a in args]
    result = run_ponytail(["-config", str(host.write_config()), *args])
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert "unknown driver capability 'compte'" in line and VALID_CAPABILITIES in line, line
    assert result.stdout == b""


def test_an_unknown_capability_in_the_images_env_is_a_warning_and_the_start_goes_on(host: FakeHost, tmp_path: Path, sleeper) -> None:
    """NVIDIA's toolkit ignores a capability name it does not know in an image's
    NVIDIA_DRIVER_CAPABILITIES; refusing the container would break images written for a
    newer toolkit. The hook says so on stderr (and in the log) and injects the known ones."""
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", "NVIDIA_DRIVER_CAPABILITIES=compute,utility,compte"])
    result = run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, sleeper.pid), isolated=False)
    assert result.returncode == 0, result.stderr
    line = error_line(result)
    assert line.startswith("ponytail: warning: unknown driver capability 'compte' in NVIDIA_DRIVER_CAPABILITIES="), line
    assert VALID_CAPABILITIES in line and line.endswith("; ignored")
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck"])
    assert "cuDriverGetVersion 12040" in inside.stdout, inside.stdout + inside.stderr
    assert "unknown driver capability 'compte'" in host.log.read_text()


# 4. a dry run exits with the status the real run would


@pytest.mark.parametrize(
    "options, status",
    [
        (["-libs", "/nonexistent/libfoo.so"], 1),  # nothing matches: the real run fails to start
        (["-device", "9"], 2),  # no such GPU: bad input
        (["-capabilities", "compte"], 2),
        (["-device", "1"], 0),
    ],
    ids=str,
)
def test_debug_exits_with_the_status_of_the_real_run(host: FakeHost, tmp_path: Path, options: list[str], status: int) -> None:
    config = str(host.write_config())
    rootfs = make_rootfs(tmp_path / "rootfs")
    dry = run_ponytail(["-config", config, "-root", str(rootfs), *options, "-debug"])
    real = run_ponytail(["-config", config, "-root", str(rootfs), *options])  # in a mount namespace of its own
    assert dry.returncode == real.returncode == status, (dry.stderr, real.stderr)
    if status == 1:
        assert b"a real run would FAIL" in dry.stdout


def test_through_the_shim_an_unknown_capability_in_the_images_env_is_ignored_as_by_the_hook(host: FakeHost, tmp_path: Path) -> None:
    """ponytail-runtime reads the image's env only to decide whether to add the hook; the hook
    it adds treats an unknown capability as above: the container starts with the known ones."""
    from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, console_script, oci_bundle, unique

    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility,compte"]
    bundle = oci_bundle(tmp_path, CUDACHECK_GPU0, env=env)
    container_id = unique()
    shim = [console_script("ponytail-runtime"), "--root", str(tmp_path / "state")]
    shim_env = {"PATH": os.environ["PATH"], "PONYTAIL_CONFIG": str(host.write_config())}
    try:
        result = subprocess.run([*shim, "run", "--bundle", str(bundle), container_id], env=shim_env, capture_output=True,
                                text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([*shim, "delete", "-f", container_id], env=shim_env, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0
    assert "unknown driver capability 'compte' in NVIDIA_DRIVER_CAPABILITIES" in host.log.read_text()


def test_an_option_of_the_subcommand_before_it_says_to_put_it_after() -> None:
    result = run_ponytail(["-json", "info"])
    assert result.returncode == 2
    assert error_line(result) == "ponytail: error: -json is an option of 'ponytail info': put it after 'info' (see 'ponytail --help')"
