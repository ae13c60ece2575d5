"""``ponytail migrate --from nvidia`` on a root where NVIDIA's toolkit 1.20 is installed as its packages and
``nvidia-ctk`` install it (tests/support/nvidia_toolkit.py: nvidia-ctk's captured spec; NVIDIA's programs where
they are installed here, stand-ins elsewhere): both vendors' specs clash in podman; the migration moves NVIDIA's
specs, engine entries, hooks and config aside and puts ponytail in their place (podman starts GPU containers
through ponytail's spec); the undo gives back every file byte for byte (mode and owner too), and, where NVIDIA's
programs are installed, NVIDIA's spec works in podman again. What it could not undo is refused with one line, before anything changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cdi_support import CdiPodman, generate
from support.engines import DOCKER_RELEASES, Dockerd, Podman, console_script, engines_for, with_etc_files
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import run_ponytail
from support.hostile import CUDA_OK
from support.nvidia_toolkit import install_toolkit, tree_bytes
from support.nvidia_tools import installed_toolkit

STATE = "/var/lib/ponytail/migrate"
CHECK = ["sh", "-c", "/usr/local/bin/cudacheck /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl"]


@pytest.fixture
def node(tmp_path: Path) -> tuple[FakeHost, Path, dict[str, bytes]]:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    root = tmp_path / "root"
    return host, root, install_toolkit(root, host)


def migrate(host: FakeHost, root: Path, *args: str) -> subprocess.CompletedProcess:
    return run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "-config", str(host.write_config()),
                         "--path", console_script("ponytail"), *args])


def nvidia_files(root: Path) -> dict[str, bytes]:
    return {p: b for p, b in tree_bytes(root).items() if not p.startswith(f"{root}/var/lib/ponytail")}


def test_migrate_moves_nvidias_toolkit_aside_and_undo_gives_back_every_byte(node: tuple[FakeHost, Path, dict[str, bytes]]) -> None:
    host, root, before = node
    dry = migrate(host, root, "--dry-run")
    assert dry.returncode == 0 and nvidia_files(root) == before, dry.stderr
    out = dry.stdout.decode()
    for path in ("/etc/cdi/nvidia.yaml", "/etc/docker/daemon.json", "/etc/containerd/conf.d/99-nvidia.toml", "/etc/crio/crio.conf.d/99-nvidia.toml",
                 "/usr/bin/nvidia-container-runtime-hook", "/usr/bin/nvidia-cdi-hook", "/usr/bin/nvidia-ctk", "/etc/nvidia-container-runtime/config.toml"):
        assert f"would: {path}: " in out, out
    done = migrate(host, root)
    assert done.returncode == 0, done.stderr
    runtime = console_script("ponytail-runtime")
    assert json.loads((root / "etc/docker/daemon.json").read_text())["runtimes"]["nvidia"]["path"] == runtime
    assert f'BinaryName = "{runtime}"' in (root / "etc/containerd/conf.d/99-nvidia.toml").read_text()
    assert f'runtime_path = "{runtime}"' in (root / "etc/crio/crio.conf.d/99-nvidia.toml").read_text()
    assert os.readlink(root / "usr/bin/nvidia-container-runtime-hook") == console_script("ponytail")
    for gone in ("usr/bin/nvidia-ctk", "etc/nvidia-container-runtime/config.toml"):
        assert not (root / gone).exists()
    hook_script = (root / "usr/bin/nvidia-cdi-hook").read_text()  # the specs of the device plugin and the DRA driver name it
    assert "ponytail-hook-script" in hook_script and f"'{console_script('ponytail')}' nvidia-hook" in hook_script, hook_script
    assert os.stat(root / "usr/bin/nvidia-cdi-hook").st_mode & 0o111
    assert "cdi-hook" in (root / "etc/cdi/nvidia.yaml").read_text()  # ponytail's spec in its place
    report = json.loads(run_ponytail(["check", "-config", str(host.write_config()), "--engine-root", str(root), "--json"]).stdout)
    cdi = [f for f in report["findings"] if f["subject"].startswith("CDI")]
    assert [f["level"] for f in cdi] == ["ok"] and "(ponytail's)" in cdi[0]["message"], cdi
    again = migrate(host, root)
    assert again.returncode == 1 and "records a migration already" in again.stderr.decode()
    undone = run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "--undo"])
    assert undone.returncode == 0, undone.stderr
    assert nvidia_files(root) == before
    assert not (root / "var/lib/ponytail").exists()


def test_undo_refuses_a_file_changed_since_and_changes_nothing(node: tuple[FakeHost, Path, dict[str, bytes]]) -> None:
    host, root, before = node
    assert migrate(host, root).returncode == 0
    daemon = root / "etc/docker/daemon.json"
    migrated = daemon.read_bytes()
    daemon.write_text('{"runtimes": {}}\n')
    after = tree_bytes(root)
    refused = run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "--undo"])
    err = refused.stderr.decode()
    assert refused.returncode == 1 and err.count("\n") == 1 and "/etc/docker/daemon.json was changed since the migration" in err, err
    assert tree_bytes(root) == after
    daemon.write_bytes(migrated)
    assert run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "--undo"]).returncode == 0
    assert nvidia_files(root) == before


def test_what_it_could_not_put_back_is_refused_before_anything_changes(node: tuple[FakeHost, Path, dict[str, bytes]]) -> None:
    host, root, before = node
    os.unlink(root / "usr/bin/nvidia-ctk")
    os.mkfifo(root / "usr/bin/nvidia-ctk")
    snapshot = tree_bytes(root)
    refused = migrate(host, root)
    err = refused.stderr.decode()
    assert refused.returncode == 1 and err.count("\n") == 1, err
    assert "not migrating: /usr/bin/nvidia-ctk is not a regular file or a link" in err
    assert tree_bytes(root) == snapshot and not (root / "var/lib/ponytail").exists()


def test_nothing_of_nvidias_is_nothing_to_migrate(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    (tmp_path / "root").mkdir()
    result = migrate(host, tmp_path / "root")
    assert result.returncode == 0 and "nothing to migrate" in result.stdout.decode()
    nothing = run_ponytail(["migrate", "--from", "nvidia", "--root", str(tmp_path / "root"), "--undo"])
    assert nothing.returncode == 1 and "nothing to undo" in nothing.stderr.decode()


@pytest.fixture
def podman_with(tmp_path: Path) -> Iterator[list[CdiPodman]]:
    made: list[CdiPodman] = []
    yield made
    for engine in made:
        engine.close()


def _podman(made: list[CdiPodman], tmp_path: Path, specs: list[Path]) -> CdiPodman:
    hooks = tmp_path / f"hooks-{len(made)}"
    hooks.mkdir()
    engine = CdiPodman(specs[0], hooks, specs[1:])
    made.append(engine)
    return engine


def test_podman_beside_migrated_and_back(node: tuple[FakeHost, Path, dict[str, bytes]], tmp_path: Path, podman_with: list[CdiPodman]) -> None:
    """Both vendors' specs: podman refuses the kind; migrated: ponytail's spec starts GPU containers; undone: NVIDIA's files again."""
    host, root, before = node
    rootfs = make_rootfs(tmp_path / "rootfs")
    nvidia = tmp_path / "specs/nvidia-ctk.yaml"
    nvidia.parent.mkdir()
    shutil.copy(root / "etc/cdi/nvidia.yaml", nvidia)
    ours = tmp_path / "ours/ponytail.yaml"  # beside NVIDIA's, cdi generate would refuse (one owner per kind)
    generate(host, ours)
    both = _podman(podman_with, tmp_path, [nvidia, ours]).run(rootfs, CHECK, devices=["nvidia.com/gpu=0"])
    assert both.returncode != 0 and "unresolvable CDI devices nvidia.com/gpu=0" in both.stderr, both.stderr
    assert migrate(host, root).returncode == 0
    migrated = _podman(podman_with, tmp_path, [root / "etc/cdi/nvidia.yaml"]).run(make_rootfs(tmp_path / "rootfs2"), CHECK, devices=["nvidia.com/gpu=0"])
    assert migrated.returncode == 0 and CUDA_OK in migrated.stdout, migrated.stderr
    assert "open /dev/nvidia0 ENXIO" in migrated.stdout and "open /dev/nvidia1 ENOENT" in migrated.stdout, migrated.stdout
    assert "cdi-hook in" in host.log.read_text()
    assert run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "--undo"]).returncode == 0
    assert nvidia_files(root) == before


def test_nvidias_own_hook_serves_its_spec_again_after_the_undo(node: tuple[FakeHost, Path, dict[str, bytes]], tmp_path: Path,
                                                                podman_with: list[CdiPodman]) -> None:
    """Undone: NVIDIA's spec runs NVIDIA's own nvidia-cdi-hook from the root's /usr/bin again (only where NVIDIA's toolkit is installed)."""
    host, root, before = node
    if installed_toolkit() is None:
        pytest.skip("NVIDIA's toolkit is not installed (PATH, NVIDIA_TOOLKIT_DIR): the comparison with its own hook is skipped")
    assert migrate(host, root).returncode == 0
    assert run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "--undo"]).returncode == 0
    assert nvidia_files(root) == before
    back = _podman(podman_with, tmp_path, [root / "etc/cdi/nvidia.yaml"]).run(make_rootfs(tmp_path / "rootfs3"), CHECK, devices=["nvidia.com/gpu=0"])
    assert back.returncode == 0 and CUDA_OK in back.stdout, back.stderr  # NVIDIA's hooks ran from the root's /usr/bin
    assert "open /dev/nvidia0 ENXIO" in back.stdout, back.stdout


@pytest.mark.parametrize("release", DOCKER_RELEASES)
def test_docker_runs_gpu_containers_through_ponytail_after_the_migration(node: tuple[FakeHost, Path, dict[str, bytes]], tmp_path: Path,
                                                                           release: str) -> None:
    """dockerd with the migrated daemon.json (the runtime 'nvidia' runs ponytail-runtime) and the root's /usr/bin on
    its PATH (nvidia-container-runtime-hook is ponytail's link, nvidia-cdi-hook ponytail's hook script): `--runtime nvidia`
    and `--gpus` both give the GPUs through ponytail."""
    host, root, _ = node
    sid = engines_for(release)
    assert migrate(host, root).returncode == 0
    etc = {"ponytail/config.toml": host.write_config().read_text()}
    daemon = Dockerd({"PATH": f"{root}/usr/bin:{os.environ['PATH']}"}, etc_files=etc, sid=sid,
                     args=("--config-file", str(root / "etc/docker/daemon.json")))
    try:
        image = daemon.import_rootfs(make_rootfs(tmp_path / "rootfs"))
        by_runtime = daemon.docker("run", "--rm", "--network=none", "--runtime", "nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=0", image, *CHECK)
        assert by_runtime.returncode == 0 and CUDA_OK in by_runtime.stdout, by_runtime.stderr
        assert "open /dev/nvidia0 ENXIO" in by_runtime.stdout and "open /dev/nvidia1 ENOENT" in by_runtime.stdout, by_runtime.stdout
        by_gpus = daemon.docker("run", "--rm", "--network=none", "--gpus", "all", image, *CHECK)
        assert by_gpus.returncode == 0 and CUDA_OK in by_gpus.stdout, by_gpus.stderr
        assert "open /dev/nvidia1 ENXIO" in by_gpus.stdout, by_gpus.stdout
    finally:
        daemon.close()


def test_a_spec_ponytail_has_already_is_kept_and_not_doubled(node: tuple[FakeHost, Path, dict[str, bytes]]) -> None:
    host, root, before = node
    ours = root / "var/run/cdi/ponytail.yaml"
    generate(host, ours)
    kept = ours.read_bytes()
    done = migrate(host, root)
    assert done.returncode == 0, done.stderr
    assert not (root / "etc/cdi/nvidia.yaml").exists() and ours.read_bytes() == kept  # NVIDIA's aside, no second spec of ours
    listed = run_ponytail(["cdi", "owners", "--root", str(root)])
    assert listed.returncode == 0 and listed.stdout.decode().count("nvidia.com/gpu") == 1, listed.stdout
    assert run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "--undo"]).returncode == 0
    assert {p: b for p, b in nvidia_files(root).items() if p != str(ours)} == before and ours.read_bytes() == kept


def test_ponytails_own_hook_link_is_not_nvidias(tmp_path: Path) -> None:
    """install-docker-gpus' link in /usr/local/bin is ponytail's: nothing of NVIDIA's to migrate there."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    link = tmp_path / "root/usr/local/bin/nvidia-container-runtime-hook"
    link.parent.mkdir(parents=True)
    link.symlink_to(console_script("ponytail"))
    result = migrate(host, tmp_path / "root")
    assert result.returncode == 0 and "nothing to migrate" in result.stdout.decode(), result.stdout
    assert os.readlink(link) == console_script("ponytail")


def test_podmans_legacy_nvidia_hook_runs_ponytail_after_the_migration(node: tuple[FakeHost, Path, dict[str, bytes]], tmp_path: Path) -> None:
    """NVIDIA's oci-nvidia-hook.json (nvidia-ctk's oci-hook mode) runs the root's nvidia-container-runtime-hook, which
    the migration made ponytail's link: a podman container asking by NVIDIA_VISIBLE_DEVICES gets its GPU from ponytail."""
    host, root, _ = node
    done = migrate(host, root)
    assert done.returncode == 0 and "oci-nvidia-hook.json (podman's hook mode) is left in place" in done.stdout.decode(), done.stdout
    engine = Podman(root / "usr/share/containers/oci/hooks.d")
    engine.base = with_etc_files(engine.base, tmp_path / "etc-layer", {"ponytail/config.toml": host.write_config().read_text()})
    try:
        result = engine.run(make_rootfs(tmp_path / "rootfs"), CHECK, env=["NVIDIA_VISIBLE_DEVICES=0"])
    finally:
        engine.close()
    assert result.returncode == 0 and CUDA_OK in result.stdout, result.stderr
    assert "open /dev/nvidia0 ENXIO" in result.stdout and "open /dev/nvidia1 ENOENT" in result.stdout, result.stdout
