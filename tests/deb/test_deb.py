"""The Debian package (make deb), as a node's operator meets it: built from a clean clone of HEAD,
installed with apt-get into a pristine Debian 12 root (its dependencies from Debian's archive only),
run there against a fake driver, upgraded from an older version, removed and purged without a trace.

Marked ``deb`` (tests/conftest.py): ``make test-deb`` runs these alone. They need root and Debian's
archive (scripts/debian-root.sh; skipped, saying so, when it cannot be reached).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ponytail.engines.hooksd import hook_file_text

from support.debbuild import OLD_VERSION, build_debs, changelog_version, nvidia_package
from support.debianroot import DebianSystem, pristine_root
from support.fakehost import NVML_DIR, FakeHost, gpus, make_rootfs

HOOK_FILE = "/usr/share/containers/oci/hooks.d/ponytail.json"
CONFIG = "/etc/ponytail/config.toml"
# what apt and dpkg keep about any install, and the linker cache: not ponytail's files
BOOKKEEPING = ("/var/lib/dpkg/", "/var/lib/apt/", "/var/cache/apt/", "/var/log/apt/", "/var/cache/debconf/",
               "/var/log/dpkg.log", "/var/log/alternatives.log", "/var/cache/ldconfig/", "/etc/ld.so.cache")


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The package of HEAD, and the same as OLD_VERSION, each built by make deb's script from a clean clone."""
    return build_debs(tmp_path_factory.mktemp("debs"))


def _changelog_version() -> str:
    return changelog_version()


@pytest.fixture(scope="module")
def lower() -> Path:
    root = pristine_root("deb")  # a root of its own name: debian-root.sh keeps one root per name
    if isinstance(root, str):
        pytest.skip(root)
    return root


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> FakeHost:
    """2 GPUs, MIG on the one with minor 1; its rootfs to inject into is beside it."""
    base = tmp_path_factory.mktemp("debhost")
    fake = FakeHost(base / "host", gpu_list=gpus(2), mig={1: [(1, 0)]})
    make_rootfs(base / "rootfs")
    # the host's paths only: log and caches at their defaults, where the package's purge must find them
    (base / "config.toml").write_text(
        f'[host]\ndriver_root = "{fake.driver}"\nproc_root = "{fake.proc}"\nsys_root = "{fake.sys}"\n'
        f'dev_root = "{fake.dev}"\nipc_root = "{fake.ipc}"\n'
    )
    return fake


def _system(lower: Path, tmp_path: Path, host: FakeHost, debs: dict[str, Path]) -> DebianSystem:
    return DebianSystem(lower, tmp_path / "system", binds=[host.base.parent, NVML_DIR, debs["new"].parent])


def test_installs_runs_and_purges_without_a_trace(lower: Path, tmp_path: Path, host: FakeHost, debs: dict[str, Path]) -> None:
    system = _system(lower, tmp_path, host, debs)
    before = system.files()
    config = host.base.parent / "config.toml"
    rootfs = host.base.parent / "rootfs"

    installed = system.check(f"apt-get install -y --no-install-recommends {debs['new']}")
    assert "ponytail configure --runtime docker" in installed  # the one command that registers it; nothing was
    assert "ponytail-guard.service) is not enabled" in installed
    # no maintainer script reloads systemd (a reload takes the GPUs a hook gave from running containers)
    assert system.run("grep -l 'systemctl --system daemon-reload' /var/lib/dpkg/info/ponytail.*").returncode == 1
    assert "Setting up python3-click" in installed and "Setting up python3-pynvml" not in installed  # Debian's modules, MIG's only suggested

    out = system.check(f"""
        ponytail --version
        ponytail info -config {config}
        ls /usr/bin/ponytail /usr/bin/ponytail-runtime {CONFIG} /lib/udev/rules.d/71-ponytail-dev-char-links.rules
        cat {HOOK_FILE}
        ls /etc/systemd/system/multi-user.target.wants/
        ls /usr/share/man/man1/
        """)
    assert f"ponytail, version {_changelog_version()}" in out
    assert "550.54.15" in out and host.gpu_list[0].uuid in out and host.gpu_list[1].uuid in out
    hook = hook_file_text("/usr/bin/ponytail")
    assert hook in out and json.loads(hook)["hook"]["path"] == "/usr/bin/ponytail"
    # enabled the Debian way (deb-systemd-helper), and not started: no systemd runs here; the guard is opt-in
    assert "ponytail-dev-char-links.path\nponytail-dev-char-links.service\n" in out
    assert "ponytail-guard" not in system.check("ls /etc/systemd/system/*.wants/")
    assert "/lib/systemd/system/ponytail-guard.service" in system.check("dpkg -L ponytail")
    assert "ponytail-info.1.gz" in out and "ponytail-runtime.1.gz" in out
    # every key of the conffile is commented: as installed it means the built-in defaults
    assert not [line for line in system.check(f"cat {CONFIG}").splitlines() if line and line[0] not in "#["]

    # Debian's own python3-click: every failing path is one line and its documented exit status, no traceback
    _one_line_errors(system, config)

    # the hook's manual mode injects GPU 0 into a rootfs: its libcuda loads, its node opens (ENXIO: no driver behind it)
    out = system.check(f"""
        ponytail -config {config} -root {rootfs} -device 0
        chroot {rootfs} /usr/local/bin/cudacheck /dev/nvidia0 /dev/nvidia1
        """)
    assert "cuDriverGetVersion 12040" in out and "open /dev/nvidia0 ENXIO" in out and "open /dev/nvidia1 ENOENT" in out

    # what ponytail leaves on a node besides its files: the log, the caches, an engine configured and
    # undone, the /dev/char links of the NVIDIA nodes (on a real node udev made /dev/char; here the test does)
    made = system.check(f"""
        mknod /dev/nvidia0 c 195 0 && mknod /dev/nvidiactl c 195 255 && mknod /dev/nvidia1 c 195 1 && mkdir /dev/char
        ln -s ../nvidia1 /dev/char/195:1
        ponytail dev-char-links -config {config} --dev-root /dev
        ls -l /dev/char
        echo '{{}}' >/etc/engine.json
        ponytail configure --runtime docker --config-file /etc/engine.json --path /usr/bin/ponytail-runtime
        ponytail configure --runtime docker --config-file /etc/engine.json --uninstall
        rm /etc/engine.json
        ls /var/log/ponytail.log /run/ponytail
        find /var/lib/ponytail
        """)
    assert "195:0 -> ../nvidia0" in made and "195:255 -> ../nvidiactl" in made
    assert "probe-" in made and "cuda-version.json" in made  # the caches under /run/ponytail
    assert "/var/lib/ponytail\n" in made  # the configure state, emptied by the undo

    system.check("apt-get remove -y ponytail")
    assert system.check(f"cat {CONFIG}; dpkg-query -W -f '${{Status}}' ponytail").endswith("deinstall ok config-files")
    system.check("apt-get purge -y ponytail")
    gone = system.run("dpkg -L ponytail")
    assert gone.returncode != 0 and "is not installed" in gone.stderr
    # the links ponytail made went with the purge; the one another tool made (before ponytail ran) stays
    assert system.check("ls /dev/char").split() == ["195:1"]
    system.check("rm /dev/nvidia0 /dev/nvidiactl /dev/nvidia1 /dev/char/195:1 && rmdir /dev/char")
    system.check("apt-get autoremove --purge -y")  # the dependencies apt brought in, too
    after = system.files()
    changed = sorted(p for p in set(before) ^ set(after) if not p.startswith(BOOKKEEPING))
    changed += sorted(p for p in set(before) & set(after) if before[p] != after[p] and not p.startswith(BOOKKEEPING))
    assert changed == [], changed
    assert not [p for p in after if "ponytail" in p and not p.startswith("/.ponytail-root-")]  # dpkg/info too


def test_an_upgrade_keeps_the_changed_config_mig_works_and_registered_engines_are_kept(
    lower: Path, tmp_path: Path, host: FakeHost, debs: dict[str, Path]
) -> None:
    system = _system(lower, tmp_path, host, debs)
    system.check(f"apt-get install -y --no-install-recommends {debs[OLD_VERSION]}")
    assert system.check("dpkg-query -W -f '${Version}' ponytail") == OLD_VERSION
    system.check(f"sed -i 's|^#file = .*|file = \"/var/log/gpu-hook.log\"|' {CONFIG}")
    changed = system.check(f"cat {CONFIG}")
    assert 'file = "/var/log/gpu-hook.log"' in changed
    upgraded = system.check(f"apt-get install -y --no-install-recommends {debs['new']}")
    assert "ponytail configure --runtime docker" not in upgraded  # said on the first install only
    assert system.check("dpkg-query -W -f '${Version}' ponytail") == _changelog_version()
    assert system.check(f"cat {CONFIG}") == changed

    # MIG UUIDs are asked of NVML through Debian's python3-pynvml (contrib; the package only suggests it)
    uuid = FakeHost.mig_uuid(1, 1, 0)
    gi, ci = FakeHost.mig_minors(1, 1, 0)
    mig = f"ponytail -config {host.base.parent / 'config.toml'} -root {host.base.parent / 'rootfs'} -device {uuid} -debug"
    without = system.run(mig)
    assert without.returncode == 1 and "apt install python3-pynvml" in without.stderr, without.stderr
    system.check("apt-get install -y --no-install-recommends python3-pynvml")
    out = system.check(mig)
    assert f"nvidia-cap{gi}" in out and f"nvidia-cap{ci}" in out

    # an engine still registered: removal is refused, naming the command to run first, and the package stays
    system.check("echo '{}' >/etc/engine.json && ponytail configure --runtime docker --config-file /etc/engine.json")
    refused = system.run("apt-get remove -y ponytail")
    assert refused.returncode != 0 and "ponytail: not removed: 'ponytail configure' registered" in refused.stderr, refused.stderr
    assert "ponytail configure --runtime ENGINE --uninstall" in refused.stderr
    assert system.check("dpkg-query -W -f '${Status}' ponytail") == "install ok installed"
    assert system.check("ponytail --version").startswith("ponytail, version")
    # so is it on a node migrated from NVIDIA's toolkit (its record there), naming the undo
    system.check("mkdir -p /var/lib/ponytail/migrate && touch /var/lib/ponytail/migrate/record.json")
    refused = system.run("apt-get remove -y ponytail")
    assert refused.returncode != 0 and "run 'ponytail migrate --from nvidia --undo' first" in refused.stderr, refused.stderr
    system.check("rm -r /var/lib/ponytail/migrate")
    # asked for anyway: removed, and the purge keeps the engine's record (its config as it was)
    removed = system.run("PONYTAIL_REMOVE_ANYWAY=1 apt-get remove -y ponytail")
    assert removed.returncode == 0, removed.stderr
    purged = system.run("apt-get purge -y ponytail")
    assert purged.returncode == 0 and "kept /var/lib/ponytail/configure" in purged.stderr, purged.stderr
    assert "%2Fetc%2Fengine.json.json" in system.check("ls /var/lib/ponytail/configure")


def _one_line_errors(system: DebianSystem, config: Path) -> None:
    """Bad options, a refusal, findings and an all-well guard pass, with the package's click (cli.md's exit statuses)."""
    one_line = {
        "ponytail configure": 2,  # a missing option
        "ponytail configure --runtime bogus": 2,  # a bad value
        "ponytail info -devcie 0": 2,  # a misspelled option
        "ponytail guard --once -nope": 2,
        "ponytail migrate --from nvidia --undo": 1,  # a refusal: nothing to undo
        f"ponytail -config {config} -root /nonexistent -device 0": 2,  # no such rootfs
    }
    for command, status in one_line.items():
        result = system.run(command)
        assert result.returncode == status, (command, result.returncode, result.stderr)
        assert result.stderr.startswith("ponytail: error: ") and result.stderr.count("\n") == 1, (command, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr, command
    # findings (no engine here, no GPU node in /dev): 1, and what to do, never a traceback
    found = system.run(f"ponytail check -config {config}")
    assert found.returncode == 1 and "need attention" in found.stdout + found.stderr and "Traceback" not in found.stderr, found
    # a guard pass with nothing wrong: 0
    well = system.run(f"ponytail guard --once -config {config}")
    assert well.returncode == 0 and "0 lost access" in well.stdout and "Traceback" not in well.stderr, well


def test_removing_nvidias_package_after_migrating_keeps_the_hooks(lower: Path, tmp_path: Path, host: FakeHost, debs: dict[str, Path]) -> None:
    nvidia = nvidia_package(debs["new"].parent)
    system = _system(lower, tmp_path, host, debs)
    config = host.base.parent / "config.toml"
    system.check(f"dpkg -i {nvidia} && apt-get install -y --no-install-recommends {debs['new']}")
    migrated = system.check(f"ponytail migrate --from nvidia -config {config}")
    assert "undo with: ponytail migrate --from nvidia --undo" in migrated
    removed = system.check("dpkg -r nvidia-container-toolkit-base")
    assert "put back the link to /usr/bin/ponytail" in removed and "put back ponytail's hook script" in removed, removed
    assert "not ponytail's usual hook script" not in removed
    out = system.check("readlink /usr/bin/nvidia-container-runtime-hook; head -2 /usr/bin/nvidia-cdi-hook")
    assert out.startswith("/usr/bin/ponytail\n") and "ponytail-hook-script" in out
    # the node can still go back: the undo finds what the migration left, and puts NVIDIA's files back
    undone = system.run("ponytail migrate --from nvidia --undo")
    assert undone.returncode == 0, undone.stderr
    assert "NVIDIA's nvidia-cdi-hook" in system.check("cat /usr/bin/nvidia-cdi-hook")
    system.check("apt-get remove -y ponytail")  # nothing recorded any more: not refused
