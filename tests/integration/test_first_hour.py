"""What a new user meets in the first hour: a command run without root, the help and usage
errors, the hooks.d file and $PONYTAIL_CONFIG, the doctor on a simulated host, -debug's report,
and what manual mode says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.commands import PONYTAIL, REPO, shell, without_checkout_warning
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import run_ponytail

NOBODY = 65534


def error_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not warnings (a user's run cannot open the host's log)."""
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("ponytail: warning:")]


# -- not root ---------------------------------------------------------------------------

@pytest.fixture
def public(tmp_path: Path) -> Iterator[Path]:
    """A directory root owns that everyone may read (pytest's tmp is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="ponytail-first-hour-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def as_nobody(public: Path, request: pytest.FixtureRequest) -> list[str]:
    """The ponytail command as user nobody runs it: the installed one where nobody may run its
    interpreter, else the binary (a .venv made by an interpreter under /root is root's alone)."""
    prefix = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    if subprocess.run([*prefix, *PONYTAIL, "version"], capture_output=True, timeout=60).returncode == 0:
        return [*prefix, *PONYTAIL]
    binary = request.getfixturevalue("binary")
    shutil.copytree(binary.parent, public / "ponytail-binary", symlinks=True)  # where nobody can reach it
    return [*prefix, str(public / "ponytail-binary" / "ponytail")]


def test_a_user_who_is_not_root_is_told_to_run_as_root_with_exit_2(public: Path, as_nobody: list[str]) -> None:
    host = FakeHost(public / "host", gpu_list=gpus(2))
    config = str(host.write_config())
    for path in public.rglob("*"):  # the host readable by nobody, writable by root alone
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    rootfs = make_rootfs(public / "rootfs", programs=())
    commands = {
        "configure": ["configure", "--runtime", "docker", "--config-file", f"{public}/etc/docker/daemon.json",
                      "--state-dir", f"{public}/state", "--path", "/bin/true"],
        "install-hook": ["install-hook", "--dir", f"{public}/hooks.d", "--path", "/bin/true"],
        "cdi generate": ["cdi", "generate", "-config", config, "--output", f"{public}/cdi/nvidia.yaml", "--hook-path", "/bin/true"],
        "install-docker-gpus": ["install-docker-gpus", "--bin-dir", f"{public}/bin", "--path", "/bin/true"],
        "dev-char-links": ["dev-char-links", "-config", config],
        "manual": ["-config", config, "-root", str(rootfs), "-device", "0"],
    }
    env = {"PATH": os.environ["PATH"]}
    for name, args in commands.items():
        result = subprocess.run([*as_nobody, *args], capture_output=True, text=True, timeout=60, env=env, cwd="/")
        lines = error_lines(result.stderr)
        assert result.returncode == 2 and len(lines) == 1, (name, result.stderr)
        assert lines[0].startswith("ponytail: error: ") and lines[0].endswith("run as root"), (name, lines)
    assert not (public / "state").exists() and not (public / "hooks.d").exists() and not (public / "cdi").exists()
    # -debug exits as the real run would: the plan, then why it would fail
    dry = subprocess.run([*as_nobody, "-debug", *commands["manual"]], capture_output=True, text=True, timeout=60, env=env, cwd="/")
    assert dry.returncode == 2, dry.stdout + dry.stderr
    last = dry.stdout.splitlines()[-1]
    assert last.startswith("result: a real run would FAIL: ") and last.endswith("run as root"), last
    assert "mount " in dry.stdout  # the plan is still shown


# -- help, usage errors -----------------------------------------------------------------

@pytest.mark.parametrize("args", [["help"], ["help", "cdi", "generate"], ["cdi"], ["version"]], ids=" ".join)
def test_help_and_version_are_commands_and_a_group_alone_shows_its_help(args: list[str]) -> None:
    result = run_ponytail(args)
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    out = result.stdout.decode()
    if args == ["version"]:
        assert out.startswith("ponytail, version ") and out == run_ponytail(["--version"]).stdout.decode()
    else:
        shown = " ".join(args[1:]) if args[0] == "help" else " ".join(args)
        assert out.startswith(f"Usage: ponytail {shown} [OPTIONS]".replace("  ", " ")), out


@pytest.mark.parametrize("args, said", [
    (["info", "--nope"], "No such option '--nope' (see 'ponytail info --help')"),
    (["configure"], "Missing option '-runtime' / '--runtime'. Choose from: docker, containerd, crio, podman"),
    (["nope"], "No such command 'nope' (see 'ponytail --help')"),
    (["help", "nope"], "no command 'nope'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_usage_error_is_one_line_on_stderr_with_exit_2(args: list[str], said: str) -> None:
    result = run_ponytail(args)
    err = result.stderr.decode()
    assert result.returncode == 2 and result.stdout == b"", err
    assert err.count("\n") == 1 and err.startswith("ponytail: error: ") and said in err, err


def test_the_demo_script_has_help() -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--reset" in result.stdout, result.stderr
    wrong = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--nope"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "'--nope'" in wrong.stderr


# -- $PONYTAIL_CONFIG -------------------------------------------------------------------

def test_install_hook_names_the_config_ponytail_config_names(host: FakeHost, tmp_path: Path) -> None:
    config = str(host.write_config())
    hooks = tmp_path / "hooks.d"
    dry = run_ponytail(["install-hook", "--dir", str(hooks), "--dry-run"], env={"PONYTAIL_CONFIG": config})
    assert dry.returncode == 0, dry.stderr
    assert not hooks.exists() and "dry run: nothing written" in dry.stdout.decode()
    assert f'"{config}"' in dry.stdout.decode()
    result = run_ponytail(["install-hook", "--dir", str(hooks)], env={"PONYTAIL_CONFIG": config})
    assert result.returncode == 0, result.stderr
    assert json.loads((hooks / "ponytail.json").read_text())["hook"]["args"] == ["ponytail", "-config", config]
    assert "$PONYTAIL_CONFIG" in result.stdout.decode()
    # --config still wins
    other = tmp_path / "other.toml"
    other.write_text("")
    run_ponytail(["install-hook", "--dir", str(hooks), "--config", str(other)], env={"PONYTAIL_CONFIG": config})
    assert json.loads((hooks / "ponytail.json").read_text())["hook"]["args"] == ["ponytail", "-config", str(other)]


def test_configure_podman_names_the_config_ponytail_config_names(host: FakeHost, tmp_path: Path) -> None:
    config = str(host.write_config())
    hooks = tmp_path / "hooks.d" / "ponytail.json"
    args = ["configure", "--runtime", "podman", "--config-file", str(hooks), "--state-dir", str(tmp_path / "state")]
    result = run_ponytail(args, env={"PONYTAIL_CONFIG": config})
    assert result.returncode == 0, result.stderr
    assert json.loads(hooks.read_text())["hook"]["args"] == ["ponytail", "-config", config]
    assert f"-config {config} ($PONYTAIL_CONFIG)" in result.stdout.decode()
    again = run_ponytail(args, env={"PONYTAIL_CONFIG": config})
    assert "already configured for ponytail" in again.stdout.decode()
    gone = run_ponytail([*args, "--uninstall"], env={"PONYTAIL_CONFIG": config})
    assert gone.returncode == 0 and not hooks.exists(), gone.stdout


def test_a_missing_ponytail_config_is_blamed_on_the_variable(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    result = run_ponytail(["info"], env={"PONYTAIL_CONFIG": missing})
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1, err
    assert f"config file {missing} does not exist ($PONYTAIL_CONFIG names it)" in err and "-config" not in err


def test_commands_that_register_the_checkouts_venv_warn(tmp_path: Path) -> None:
    """make demo's .venv lies in the checkout: an engine pointed at it breaks on make clean."""
    result = run_ponytail(["configure", "--runtime", "docker", "--config-file", str(tmp_path / "daemon.json"), "--state-dir", str(tmp_path / "state")])
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    if (REPO / "pyproject.toml").exists() and Path(PONYTAIL[0]).is_relative_to(REPO):
        assert "in the virtual environment of a checkout" in err and "make clean" in err, err
    assert without_checkout_warning(err) == ""


# -- the doctor on a simulated host -----------------------------------------------------

def test_check_on_a_simulated_host_reads_the_machines_cgroups_and_keeps_lines_short(host: FakeHost, tmp_path: Path) -> None:
    from ponytail.config import load_config
    from ponytail.doctor.check import check_host, run_check

    config = load_config(str(host.write_config()), True)
    cgroup = next(f for f in check_host(config) if f.subject == "cgroup")
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers") or os.path.isdir("/sys/fs/cgroup/devices"):
        assert cgroup.level == "ok" and "read at /sys/fs/cgroup" in cgroup.message, cgroup
    links = next(f for f in check_host(config) if f.subject.endswith("/char"))
    assert " more ('ponytail dev-char-links --dry-run' lists them)" in links.message and len(links.message) < 400, links
    report, _ = run_check(config, None, None, str(tmp_path), False, width=80)
    assert max(len(line) for line in report.splitlines()) <= 80, report


def test_check_says_the_configure_command_for_an_unconfigured_engine(tmp_path: Path) -> None:
    from ponytail.doctor.check import check_engines

    (tmp_path / "etc/docker").mkdir(parents=True)
    (tmp_path / "etc/containerd").mkdir(parents=True)
    findings = {f.subject: f for f in check_engines(str(tmp_path), engines=("docker", "containerd"))}
    for engine in ("docker", "containerd"):
        assert f"'ponytail configure --runtime {engine} --config-file {tmp_path}/etc/" in findings[engine].message, findings[engine]


# -- -debug, list, manual mode ----------------------------------------------------------

def test_debug_blames_a_bad_libs_glob_on_libs_and_shows_no_empty_headers(host: FakeHost, rootfs: Path) -> None:
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-debug", "-libs", "/usr/lib/nope*.so"])
    out = result.stdout.decode()
    assert result.returncode == 1, out
    problem = next(line for line in out.splitlines() if line.startswith("problem: "))
    assert "check -libs" in problem and "in the config" not in problem, problem
    assert "linker cache:" not in out and "driver daemons' IPC:" not in out  # nothing under them
    assert "device cgroup (hook mode only: a manual run writes no device rules):" in out
    assert "the container's cgroups are in the header" not in out  # no container here


def test_list_says_every_problem_without_pointing_at_an_option_it_lacks(host: FakeHost) -> None:
    (host.dev / "nvidia-uvm").unlink()
    for lib in host.driver.rglob("libnvidia-ml.so*"):
        lib.unlink()
    result = run_ponytail(["list", "-config", str(host.write_config())])
    err = result.stderr.decode()
    assert result.returncode == 1 and err.count("\n") == 1, err
    assert "nvidia-uvm" in err and "libnvidia-ml.so.1" in err and "-debug" not in err, err


def test_manual_mode_says_what_it_injected_and_why_not(host: FakeHost, rootfs: Path) -> None:
    config = str(host.write_config())
    quiet = run_ponytail(["-config", config, "-root", str(rootfs), "-device", "0"])
    assert quiet.returncode == 0 and quiet.stdout == quiet.stderr == b"", quiet.stderr  # a script's run says nothing
    at_terminal = shell([*PONYTAIL, "-config", config, "-root", str(rootfs), "-device", "0"])
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "script", "-qec", at_terminal, "/dev/null"],
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stdout
    said = result.stdout.decode().replace("\r\n", "\n")
    assert said.count("\n") == 1 and said.startswith(f"ponytail: injected into {rootfs}: GPUs [0] (-device)"), said
    assert "librar(ies)" not in said and " 1 binary;" in said
    assert "librar(ies)" not in host.log.read_text()
    nothing = run_ponytail(["-config", config, "-root", str(rootfs), "-device", ""])
    assert nothing.returncode == 0 and nothing.stdout == b""
    assert b"-device='' asks for no GPU: nothing injected" in nothing.stderr


def test_a_tree_under_a_writable_directory_is_refused_with_a_fix_for_that_directory(host: FakeHost, tmp_path: Path) -> None:
    from ponytail.errors import ProbeError
    from ponytail.host.driver_trees import refuse_untrusted_tree

    above = tmp_path / "trees"
    tree = above / "t1"
    tree.mkdir(parents=True)
    above.chmod(0o777)
    with pytest.raises(ProbeError) as refused:
        refuse_untrusted_tree("t1", str(tree), [])
    assert f"chown root:root {above} && chmod go-w {above}" in refused.value.message, refused.value.message
    above.chmod(0o755)
    tree.chmod(0o777)
    with pytest.raises(ProbeError) as refused:
        refuse_untrusted_tree("t1", str(tree), [])
    assert f"chown -R root:root {tree} && chmod -R go-w {tree}" in refused.value.message
