"""End to end: inject a fake driver into a real rootfs, then run programs in it with chroot.

Manual mode runs inside a private mount namespace (unshare -m) so nothing leaks;
hook mode injects into a process that has its own mount namespace, as a
container has at prestart, and the host's namespace must stay untouched.
"""

from __future__ import annotations

from pathlib import Path

from support.commands import PONYTAIL, shell
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import bundle_for, in_private_mount_ns, mounts_under, run_ponytail, state_for

PY = shell(PONYTAIL)


def test_manual_mode_gives_the_rootfs_a_loadable_libcuda_and_the_selected_gpu(
    host: FakeHost, rootfs: Path, ponytail_command: list[str]
) -> None:
    config = host.write_config()
    result = in_private_mount_ns(
        f"""
        {shell(ponytail_command)} -config {config} -root {rootfs} -device 0
        chroot {rootfs} /usr/local/bin/cudacheck /dev/nvidia2 /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools
        chroot {rootfs} /usr/bin/nvidia-smi
        """
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "cuDriverGetVersion 12040" in out
    # index 0 is the first GPU in PCI order, whose minor is 2
    assert "open /dev/nvidia2 ENXIO" in out
    assert "open /dev/nvidia0 ENOENT" in out
    assert "open /dev/nvidiactl ENXIO" in out
    assert "open /dev/nvidia-uvm ENXIO" in out
    assert "open /dev/nvidia-uvm-tools ENXIO" in out
    assert "Driver Version: 550.54.15" in out
    assert "GPU node /dev/nvidia2" in out and "GPU node /dev/nvidia0" not in out
    assert mounts_under(rootfs) == []


def test_seed_command_line_with_an_explicit_library(host: FakeHost, rootfs: Path) -> None:
    config = host.write_config()
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    result = in_private_mount_ns(
        f"""
        {PY} -config {config} -root {rootfs} -device 0 -libs {lib}
        chroot {rootfs} /usr/local/bin/cudacheck
        test ! -e {rootfs}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15 && echo "no nvml"
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cuDriverGetVersion 12040" in result.stdout
    assert "no nvml" in result.stdout


def test_libs_that_leave_out_what_a_mounted_binary_needs_say_so_on_stderr(host: FakeHost, rootfs: Path) -> None:
    """-libs names exactly the libraries while the capabilities still bring nvidia-smi: without
    libnvidia-ml.so.1 it fails in the container, and the run says so instead of a silent 0."""
    config = host.write_config()
    result = in_private_mount_ns(
        f"""
        {PY} -config {config} -root {rootfs} -device 0 -libs /usr/lib/x86_64-linux-gnu/libcuda.so.1
        chroot {rootfs} /usr/bin/nvidia-smi && echo "nvidia-smi ran"
        {PY} -config {config} -root {rootfs} -device 0 -libs /usr/lib/x86_64-linux-gnu/libcuda.so.1,/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
        chroot {rootfs} /usr/bin/nvidia-smi
        """
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("ponytail: warning:")]
    assert len(warnings) == 1, result.stderr  # the first run only: the second names libnvidia-ml
    assert "nvidia-smi injected for utility, but libnvidia-ml.so.1" in warnings[0] and "-libs left it out" in warnings[0]
    assert "nvidia-smi ran" not in result.stdout and "Driver Version: 550.54.15" in result.stdout
    debug = run_ponytail(["-config", str(config), "-debug", "-libs", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"])
    assert "warning: nvidia-smi injected for utility, but libnvidia-ml.so.1" in debug.stdout.decode(), debug.stdout


def test_driver_in_a_non_standard_directory_is_found_through_its_ld_so_cache(tmp_path: Path, rootfs: Path) -> None:
    host = FakeHost(tmp_path / "host", lib_dir="/usr/local/nvidia/lib64", gpu_list=gpus(1))
    config = host.write_config()  # default globs name only /usr/lib/x86_64-linux-gnu
    result = in_private_mount_ns(
        f"""
        {PY} -config {config} -root {rootfs}
        chroot {rootfs} /usr/local/bin/cudacheck /dev/nvidia0
        chroot {rootfs} /usr/bin/nvidia-smi
        cat {rootfs}/etc/ld.so.conf.d/00-ponytail.conf
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cuDriverGetVersion 12040" in result.stdout
    assert "open /dev/nvidia0 ENXIO" in result.stdout
    assert "Driver Version: 550.54.15" in result.stdout
    assert "/usr/local/nvidia/lib64" in result.stdout


def test_stale_library_of_an_older_driver_is_not_injected(host: FakeHost, rootfs: Path) -> None:
    config = host.write_config()
    result = in_private_mount_ns(
        f"""
        {PY} -config {config} -root {rootfs}
        ls {rootfs}/usr/lib/x86_64-linux-gnu/
        """
    )
    assert result.returncode == 0, result.stderr
    assert "libcuda.so.550.54.15" in result.stdout
    assert "535.104.05" not in result.stdout


def test_hook_mode_injects_into_the_container_namespace_only(
    host: FakeHost, tmp_path: Path, sleeper, ponytail_command: list[str]
) -> None:
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-00000002-1111-2222-3333-000000000001"])
    config = host.write_config()
    result = run_ponytail(
        ["-config", str(config)], stdin=state_for(bundle, sleeper.pid), isolated=False, command=ponytail_command
    )
    assert result.returncode == 0, result.stderr
    assert mounts_under(rootfs) == [], "a mount leaked into the host's namespace"
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck", "/dev/nvidia1", "/dev/nvidia2"])
    assert "cuDriverGetVersion 12040" in inside.stdout, inside.stdout + inside.stderr
    assert "open /dev/nvidia1 ENXIO" in inside.stdout  # GPU index 2 has minor 1
    assert "open /dev/nvidia2 ENOENT" in inside.stdout
    log = host.log.read_text()
    assert "container=test-ctr" in log and "injected into" in log


def test_hook_mode_accepts_crun_state_and_an_absolute_root(host: FakeHost, tmp_path: Path, sleeper) -> None:
    rootfs = make_rootfs(tmp_path / "elsewhere" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, relative_root=False)
    config = host.write_config()
    result = run_ponytail(["--config", str(config)], stdin=state_for(bundle, sleeper.pid, status="created"))
    assert result.returncode == 0, result.stderr
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"])
    assert inside.stdout.count("ENXIO") == 3, inside.stdout


def test_void_request_injects_nothing(host: FakeHost, tmp_path: Path, sleeper) -> None:
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=void"])
    result = run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, sleeper.pid))
    assert result.returncode == 0, result.stderr
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck"])
    assert "dlopen libcuda.so.1 failed" in inside.stdout


def test_manual_mode_with_a_relative_root(host: FakeHost, tmp_path: Path) -> None:
    make_rootfs(tmp_path / "images" / "rel")
    result = in_private_mount_ns(
        f"""
        cd {tmp_path}/images
        {shell(PONYTAIL)} -config {host.write_config()} -root rel -device 0
        chroot rel /usr/local/bin/cudacheck
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cuDriverGetVersion 12040" in result.stdout
