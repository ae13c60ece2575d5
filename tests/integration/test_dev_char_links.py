"""`ponytail dev-char-links` against a fake host's /dev: a /dev/char/M:m link for every NVIDIA node
(GPUs, nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools, nvidia-caps), relative as udev's,
that leads to that node; a second run changes nothing; a file or a link to something else at a
link's name is left as it is and said (exit 1); a link to nothing is replaced; what is not an
NVIDIA character device under the dev root gets no link. The units and udev rule run this
command (checked against the installed command's options)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from support.commands import PONYTAIL
from support.fakehost import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR, FakeHost, gpus

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {
    f"{NVIDIA_MAJOR}:0": "../nvidia0", f"{NVIDIA_MAJOR}:3": "../nvidia3", f"{NVIDIA_MAJOR}:255": "../nvidiactl",
    f"{NVIDIA_MAJOR}:254": "../nvidia-modeset", f"{UVM_MAJOR}:0": "../nvidia-uvm", f"{UVM_MAJOR}:1": "../nvidia-uvm-tools",
    f"{CAPS_MAJOR}:1": "../nvidia-caps/nvidia-cap1", f"{CAPS_MAJOR}:2": "../nvidia-caps/nvidia-cap2",
}


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host", gpu_list=gpus(2, minors=[0, 3]))


def links(host: FakeHost, *args: str) -> subprocess.CompletedProcess:
    config = host.write_config()
    return subprocess.run([*PONYTAIL, "dev-char-links", "-config", str(config), *args], capture_output=True, text=True, timeout=60)


def made(host: FakeHost) -> dict[str, str]:
    char = host.dev / "char"
    return {name: os.readlink(char / name) for name in os.listdir(char)} if char.is_dir() else {}


def test_every_nvidia_node_gets_its_link_and_a_second_run_changes_nothing(host: FakeHost) -> None:
    dry = links(host, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert made(host) == {}
    assert f"would make {host.dev}/char/{NVIDIA_MAJOR}:3 -> ../nvidia3" in dry.stdout

    first = links(host)
    assert first.returncode == 0, first.stderr
    assert made(host) == EXPECTED
    for name in EXPECTED:  # each leads to the node with those numbers, as runc's stat of the link sees it
        st = os.stat(host.dev / "char" / name)
        assert stat.S_ISCHR(st.st_mode) and f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" == name
    assert "8 NVIDIA node(s)" in first.stdout and "8 made" in first.stdout

    before = {name: os.lstat(host.dev / "char" / name).st_ino for name in EXPECTED}
    second = links(host)
    assert second.returncode == 0 and "8 already linked, 0 made, 0 left as they are" in second.stdout
    assert {name: os.lstat(host.dev / "char" / name).st_ino for name in EXPECTED} == before


def test_what_is_not_ours_is_left_and_said_a_link_to_nothing_is_replaced(host: FakeHost) -> None:
    char = host.dev / "char"
    char.mkdir()
    (char / f"{NVIDIA_MAJOR}:0").write_text("a file\n")
    os.symlink("../null", char / f"{NVIDIA_MAJOR}:3")
    os.mknod(host.dev / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.symlink("../nvidia7", char / f"{NVIDIA_MAJOR}:255")  # a node that is gone
    os.symlink("/dev/../" + str(host.dev / "nvidia-uvm").lstrip("/"), char / f"{UVM_MAJOR}:0")  # another name for the node

    result = links(host)
    assert result.returncode == 1
    assert re.search(rf"warning: \S+/char/{NVIDIA_MAJOR}:0 is a file that is not a link, not a link to nvidia0: left as it is", result.stderr)
    assert re.search(rf"warning: \S+/char/{NVIDIA_MAJOR}:3 is a link to \.\./null, not a link to nvidia3", result.stderr)
    assert f"replaced a link to nothing (../nvidia7) by {char}/{NVIDIA_MAJOR}:255 -> ../nvidiactl" in result.stdout
    assert (char / f"{NVIDIA_MAJOR}:0").read_text() == "a file\n"
    assert os.readlink(char / f"{NVIDIA_MAJOR}:3") == "../null"
    assert os.readlink(char / f"{NVIDIA_MAJOR}:255") == "../nvidiactl"
    assert os.readlink(char / f"{UVM_MAJOR}:0").endswith("nvidia-uvm")  # left: it leads to the same node
    assert "5 made, 2 left as they are" in result.stdout


def test_only_nvidia_character_devices_of_the_dev_root_get_links(host: FakeHost, tmp_path: Path) -> None:
    os.mknod(host.dev / "nvidia-lookalike", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # not a major the driver registered
    os.symlink(str(host.dev / "nvidia0"), host.dev / "nvidia9")  # a link is not a node
    (host.dev / "nvidia-regular").write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mknod(outside / "nvidia-cap50", 0o666 | stat.S_IFCHR, os.makedev(CAPS_MAJOR, 50))
    shutil.rmtree(host.dev / "nvidia-caps")
    os.symlink(str(outside), host.dev / "nvidia-caps")  # never followed out of the dev root

    result = links(host)
    assert result.returncode == 0, result.stderr
    assert made(host) == {k: v for k, v in EXPECTED.items() if not k.startswith(f"{CAPS_MAJOR}:")}


def test_no_driver_loaded_is_nothing_to_do(host: FakeHost) -> None:
    text = (host.proc / "devices").read_text()
    (host.proc / "devices").write_text("\n".join(line for line in text.splitlines() if "nvidia" not in line) + "\n")
    result = links(host)
    assert result.returncode == 0 and "nothing to link" in result.stdout
    assert made(host) == {}


def test_the_units_and_udev_rule_run_this_command() -> None:
    service = (REPO / "packaging/systemd/ponytail-dev-char-links.service").read_text()
    path_unit = (REPO / "packaging/systemd/ponytail-dev-char-links.path").read_text()
    rule = (REPO / "packaging/udev/71-ponytail-dev-char-links.rules").read_text()
    exec_start = re.search(r"^ExecStart=(\S+) (.*)$", service, re.M)
    assert exec_start is not None and exec_start.group(1) == "/usr/local/ponytail/ponytail"
    assert exec_start.group(2) == "dev-char-links"
    assert re.search(r"^PathChanged=/dev$", path_unit, re.M) and "Unit=ponytail-dev-char-links.service" in path_unit
    assert "start ponytail-dev-char-links.service" in rule and 'KERNEL=="nvidia*"' in rule
    help_text = subprocess.run([*PONYTAIL, "dev-char-links", "--help"], capture_output=True, text=True, timeout=60)
    assert help_text.returncode == 0


def test_the_node_installer_makes_the_links_and_installs_the_units(host: FakeHost, tmp_path: Path) -> None:
    """packaging/installer/installer.sh as the DaemonSet runs it (the host's / at HOST_ROOT),
    with the installed command standing in for the image's binary."""
    image = tmp_path / "image"
    image.mkdir()
    wrapper = image / "ponytail"
    wrapper.write_text(f"#!/bin/sh\nPONYTAIL_CONFIG={host.write_config()} exec {PONYTAIL[0]} \"$@\"\n")
    wrapper.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for source in [*(REPO / "packaging/systemd").iterdir(), *(REPO / "packaging/udev").iterdir()]:
        shutil.copy(source, units / source.name)
    env = {"PATH": os.environ["PATH"], "HOST_ROOT": str(host.base), "IMAGE_DIR": str(image), "UNITS_DIR": str(units),
           "ENGINE": "podman", "RESTART_MODE": "none", "INSTALL_DIR": "/opt/gpu/ponytail"}

    def installer(verb: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(REPO / "packaging/installer/installer.sh"), verb], env=env, capture_output=True, text=True, timeout=120)

    first = installer("install")
    assert first.returncode == 0, first.stdout + first.stderr
    assert made(host) == EXPECTED
    assert "made /dev/char/195:0 -> ../nvidia0" in first.stdout  # said as the host's path
    systemd = host.base / "etc/systemd/system"
    assert "ExecStart=/opt/gpu/ponytail/ponytail dev-char-links\n" in (systemd / "ponytail-dev-char-links.service").read_text()
    for unit in ("ponytail-dev-char-links.service", "ponytail-dev-char-links.path"):
        assert os.readlink(systemd / "multi-user.target.wants" / unit) == f"/etc/systemd/system/{unit}"
    assert (host.base / "etc/udev/rules.d/71-ponytail-dev-char-links.rules").read_text() == (units / "71-ponytail-dev-char-links.rules").read_text()
    assert "systemctl start ponytail-dev-char-links.path" in first.stdout

    second = installer("install")
    assert second.returncode == 0 and "/dev/char link units are up to date" in second.stdout, second.stdout

    removed = installer("uninstall")
    assert removed.returncode == 0, removed.stderr
    assert not (systemd / "ponytail-dev-char-links.service").exists() and not (systemd / "multi-user.target.wants/ponytail-dev-char-links.path").is_symlink()
    assert not (host.base / "etc/udev/rules.d/71-ponytail-dev-char-links.rules").exists()
    assert made(host) == EXPECTED  # the links stay
