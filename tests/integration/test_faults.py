"""Faults: a wedged GPU, a slow ldconfig, closed pipes, full filesystems, broken caches,
inconsistent hosts. Under each, ponytail must never inject the wrong GPU, never report
a broken start as success, and never run past the engine's deadline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from support.engines import RUNTIMES, console_script, hook_entry, oci_bundle, processes_naming, unique
from support.fakehost import FakeHost, compile_library, gpus, make_rootfs
from support.harness import Sleeper, bundle_for, in_private_mount_ns, run_ponytail, state_for


def processes_mapping(path: Path) -> list[int]:
    """Processes that have a file under ``path`` mapped (the driver's libcuda, say)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/maps", "rb") as f:
                    if str(path).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def wait_until_gone(find, *args) -> list[int]:
    """What ``find`` still finds after up to 30 s (a killed process takes a moment to go, longer on a busy machine)."""
    deadline = time.monotonic() + 30
    while True:
        left = find(*args)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture
def reaper():
    """Kills, after the test, whatever still maps a file under the directories it is given
    (so that a failing test leaves no wedged process behind)."""
    paths: list[Path] = []
    yield paths.append
    for path in paths:
        for pid in processes_mapping(path):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def run_runc(bundle: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    container_id = unique()
    try:
        return subprocess.run(
            RUNTIMES["runc"] + ["run", "--bundle", str(bundle), container_id],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    finally:
        subprocess.run(RUNTIMES["runc"] + ["delete", "-f", container_id], capture_output=True, timeout=60)


# -- 1. deadlines ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_wedged_libcuda_fails_the_start_within_the_probe_deadline(tmp_path: Path, reaper) -> None:
    """cuDriverGetVersion never returns (and its library started a helper process): the
    requirement check's child is killed with its process group at [timeouts] probe (5 s
    by default), the start fails with one line, and runc returns long before its own
    hook timeout."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), cuda_blocks=2)
    reaper(host.driver)
    hook = {**hook_entry(host.write_config()), "timeout": 60}
    bundle = oci_bundle(tmp_path, ["true"], env=["NVIDIA_REQUIRE_CUDA=cuda>=11.0"], hooks={"prestart": [hook]})
    result = run_runc(bundle, timeout=30)  # before: the hook waited for the child for ever
    assert result.returncode != 0
    assert "cuDriverGetVersion did not answer within 5 s (killed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert wait_until_gone(processes_mapping, host.driver) == []


def test_runc_killing_the_hook_at_its_deadline_leaves_no_child_and_is_not_kept_waiting(tmp_path: Path, reaper) -> None:
    """runc's hook timeout comes first: runc kills the hook and must not wait for the
    child (which never holds runc's pipes), and the child dies with the hook."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), cuda_blocks=1)
    reaper(host.driver)
    hook = {**hook_entry(host.write_config()), "timeout": 2}  # before the probe's own 5 s
    bundle = oci_bundle(tmp_path, ["true"], env=["NVIDIA_REQUIRE_CUDA=cuda>=11.0"], hooks={"prestart": [hook]})
    result = run_runc(bundle, timeout=25)  # before: runc waited as long as the child lived
    assert result.returncode != 0
    assert "hook ran past specified timeout" in result.stderr, result.stderr
    assert wait_until_gone(processes_mapping, host.driver) == []


def test_ldconfig_past_its_deadline_is_killed_with_its_process_group(host: FakeHost, rootfs: Path, tmp_path: Path) -> None:
    marker = f"98765{os.getpid() % 1000}"
    slow = tmp_path / "slow-ldconfig"
    slow.write_text(f"#!/bin/sh\nsleep {marker} &\nexec sleep {marker}\n")
    slow.chmod(0o755)
    config = host.base / "config.toml"
    config.write_text(host.config_text().replace("[log]", f'ldconfig = "{slow}"\n[log]') + "[timeouts]\nldconfig = 1\n")
    result = run_ponytail(["-config", str(config), "-root", str(rootfs)])
    assert result.returncode == 1, result.stderr
    assert result.stderr.decode().startswith(f"ponytail: error: {slow} -r ") and "did not finish within 1 s (killed)" in result.stderr.decode()
    assert result.stderr.decode().count("\n") == 1
    assert wait_until_gone(processes_naming, f"sleep {marker}") == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("[timeouts]\nprobe = 0\n", "'timeouts.probe' must be a number of seconds above 0"),
        ("[timeouts]\nldconfig = \"5\"\n", "'timeouts.ldconfig' must be a number of seconds"),
        ("[timeouts]\nlock = true\n", "'timeouts.lock' must be a number of seconds"),
        ("[timeouts]\nprobe = 601\n", "at most 600"),
        ("[timeouts]\nchild = 1\n", "unknown key 'timeouts.child'"),
    ],
)
def test_timeouts_are_validated(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    result = run_ponytail(["-config", str(config), "-debug"])
    assert result.returncode == 2 and message in result.stderr.decode(), result.stderr


# -- 5. closed stdout -----------------------------------------------------------------


def test_a_hook_started_with_stdout_closed_injects_and_exits_0(host: FakeHost, rootfs: Path) -> None:
    config = host.write_config()
    ponytail = console_script("ponytail")
    for redirect in (">&-", ">&- 2>&-", "<&- >&-"):
        result = in_private_mount_ns(f"{ponytail} -config {config} -root {rootfs} {redirect}; echo rc=$?")
        assert result.stdout == "rc=0\n" and "Traceback" not in result.stderr and result.stderr == "", (redirect, result)
    result = in_private_mount_ns(f"{ponytail} -config {config} -debug >&-; echo rc=$?")
    assert result.stdout == "rc=0\n" and result.stderr == "", result
    assert host.log.read_text().count(f"injected into {rootfs}") == 3


# -- 6. the CUDA-version cache --------------------------------------------------------


def requirement_dry_run(host: FakeHost, tmp_path: Path, setup: str, runs: int = 1) -> subprocess.CompletedProcess:
    """``ponytail -debug`` for a container that requires CUDA >= 12.0, with a private /run
    prepared by ``setup`` (bash), in a mount namespace of its own; prints /run/ponytail after."""
    bundle = bundle_for(tmp_path, make_rootfs(tmp_path / "rootfs"), env=["PATH=/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"])
    state = tmp_path / "state.json"
    state.write_text(state_for(bundle, os.getpid()))
    config = host.write_config()
    config.write_text(config.read_text().replace(f'dir = "{host.base}/cache"', 'dir = "/run/ponytail"'))
    run = f"{console_script('ponytail')} -config {config} -debug < {state} > /dev/null; echo rc=$?"
    script = f"mount -t tmpfs -o size=1m tmpfs /run\nmkdir /run/ponytail\n{setup}\n" + f"{run}\n" * runs
    return in_private_mount_ns(script + "ls -A /run/ponytail; cat /run/ponytail/cuda-version.json 2>/dev/null || true")


def libcuda_key(host: FakeHost) -> str:
    """The cache's key for the fake host's libcuda: its real path and its identity."""
    path = host.driver / "usr/lib/x86_64-linux-gnu" / f"libcuda.so.{host.driver_version}"
    st = path.stat()
    return f"{os.path.realpath(path)}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


@pytest.mark.parametrize("value", ['"12040"', "12.04", "true", "[12040]", "-1", "null", "{}"])
def test_an_odd_value_in_the_cuda_cache_is_ignored_and_rewritten(host: FakeHost, tmp_path: Path, value: str) -> None:
    cache = tmp_path / "cache.json"
    cache.write_text(json.dumps({libcuda_key(host): "PLACEHOLDER"}).replace('"PLACEHOLDER"', value))
    result = requirement_dry_run(host, tmp_path, f"install -m 600 {cache} /run/ponytail/cuda-version.json")
    assert result.stdout.splitlines()[0] == "rc=0", result
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {libcuda_key(host): 12040}


@pytest.mark.parametrize("content", ["[1, 2]", "garbage", "", '{"a": 1}' * 20000])
def test_a_cuda_cache_that_is_not_a_table_is_ignored_and_rewritten(host: FakeHost, tmp_path: Path, content: str) -> None:
    cache = tmp_path / "cache.json"
    cache.write_text(content)
    result = requirement_dry_run(host, tmp_path, f"install -m 600 {cache} /run/ponytail/cuda-version.json")
    assert result.stdout.splitlines()[0] == "rc=0" and result.stderr == "", result
    assert json.loads(result.stdout.splitlines()[-1]) == {libcuda_key(host): 12040}


def test_a_full_run_directory_leaves_no_temporary_file(host: FakeHost, tmp_path: Path) -> None:
    fill = "dd if=/dev/zero of=/run/fill bs=4k 2>/dev/null || true"
    result = requirement_dry_run(host, tmp_path, fill, runs=3)
    assert result.stdout.splitlines() == ["rc=0"] * 3, result  # the requirement is still checked: CUDA 12.4
    assert result.stderr == ""


# -- 7. the log -----------------------------------------------------------------------


def test_a_full_log_filesystem_is_said_and_never_glues_records(host: FakeHost, rootfs: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    config = host.base / "config.toml"
    config.write_text(host.config_text().replace(str(host.log), f"{logs}/ponytail.log"))
    ponytail = f"{console_script('ponytail')} -config {config} -root {rootfs}"
    script = (
        f"mount -t tmpfs -o size=8k tmpfs {logs}\n"
        f"head -c 3000 /dev/zero | tr '\\0' x > {logs}/ponytail.log; echo >> {logs}/ponytail.log\n"
        f"head -c 4096 /dev/zero > {logs}/fill\n"
        f"{ponytail}; echo rc=$?\n"  # the log has ~1 KiB left: this run's records are cut
        f"rm {logs}/fill\n"
        f"{ponytail} 2>/dev/null; echo rc=$?\n"
        f"cat {logs}/ponytail.log\n"
    )
    result = in_private_mount_ns(script)
    lines = result.stdout.splitlines()
    assert lines[:2] == ["rc=0", "rc=0"], result
    assert "ponytail: warning: cannot write log file" in result.stderr and "filesystem full" in result.stderr, result.stderr
    records = lines[3:]
    assert all(line.count(" ponytail[") == 1 for line in records), [r for r in records if r.count(" ponytail[") != 1]
    assert any(f"injected into {rootfs}" in line for line in records)


def test_a_record_another_run_is_writing_is_not_taken_for_a_torn_one(host: FakeHost, rootfs: Path, tmp_path: Path) -> None:
    """Another run's record half-way written (the log ends without a newline while it holds the
    log's lock): a run waits for it and appends after it, no blank line and no record split.
    Before, the check read the last byte at open, without the lock, and began its own records with
    a newline: a blank line in the log under concurrency."""
    import fcntl

    log = tmp_path / "ponytail.log"
    config = host.base / "config.toml"
    config.write_text(host.config_text().replace(str(host.log), str(log)))
    log.write_text("2000-01-01T00:00:00Z ponytail[1] info container=other half")
    with open(log, "a") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)
        run = subprocess.Popen(["unshare", "-m", "--propagation", "private", console_script("ponytail"), "-config", str(config), "-root", str(rootfs)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        writer.write(" of a record\n")
        writer.flush()
        fcntl.flock(writer, fcntl.LOCK_UN)
    assert run.wait(timeout=60) == 0, run.stderr.read() if run.stderr else ""
    lines = log.read_text().splitlines()
    assert lines[0] == "2000-01-01T00:00:00Z ponytail[1] info container=other half of a record", lines
    assert "" not in lines and all(line.count(" ponytail[") == 1 for line in lines), lines


def test_a_log_in_a_directory_that_does_not_exist_is_said_and_no_directory_is_made(host: FakeHost, rootfs: Path, tmp_path: Path) -> None:
    """[log] file in a missing directory: before, a run created the directories as root without a
    word. Now it says once why nothing is logged, makes nothing, and the start goes on."""
    log = tmp_path / "missing/dir/ponytail.log"
    config = host.base / "config.toml"
    config.write_text(host.config_text().replace(str(host.log), str(log)))
    result = run_ponytail(["-config", str(config), "-root", str(rootfs), "-debug"])
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert err.splitlines() == [
        f"ponytail: warning: cannot open log file {log}: the directory {log.parent} does not exist; ponytail does not create it: "
        "create it, or set [log] file to a file in an existing directory (nothing is logged meanwhile)"
    ], err
    assert not (tmp_path / "missing").exists()


def test_a_config_error_is_logged_in_the_default_log(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[host]\ndriver_rot = \"/\"\n")
    script = f"mount -t tmpfs tmpfs /var/log\n{console_script('ponytail')} -config {config} -debug && echo rc=0 || echo rc=$?\ncat /var/log/ponytail.log"
    result = in_private_mount_ns(script)
    assert result.stdout.splitlines()[0] == "rc=2", result
    assert f"error container=- config file {config}: unknown key 'host.driver_rot'" in result.stdout, result.stdout


# -- 8. bounded echo of input ---------------------------------------------------------


def test_a_megabyte_of_bad_devices_gives_a_bounded_error_and_log_line(host: FakeHost, tmp_path: Path) -> None:
    selector = ",".join(["0"] * 300000 + ["7"] + ["1"] * 200000)  # 1 MB
    bundle = bundle_for(tmp_path, make_rootfs(tmp_path / "rootfs"), env=["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={selector}"])
    result = run_ponytail(["-config", str(host.write_config()), "-debug"], stdin=state_for(bundle, os.getpid()))
    assert result.returncode == 2
    error = result.stderr.decode()
    assert error.startswith("ponytail: error: unknown GPU '7' in NVIDIA_VISIBLE_DEVICES='0,0,0") and len(error) < 1000, error[:2000]
    assert "characters...]" in error and error.count("\n") == 1
    assert max(len(line) for line in host.log.read_text().splitlines()) < 1000


# -- 2. an inconsistent host ----------------------------------------------------------


def two_gpu_host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host", gpu_list=gpus(2, minors=[0, 1]))


def gpu_dir(host: FakeHost, index: int) -> Path:
    return host.proc / "driver/nvidia/gpus" / host.gpu_list[index].bus_id


@pytest.mark.parametrize("breakage", ["information file", "driver directory", "sysfs entry"])
def test_a_gpu_seen_by_only_one_of_bus_and_driver_fails_naming_it(tmp_path: Path, rootfs: Path, breakage: str) -> None:
    host = two_gpu_host(tmp_path)
    bus_id = host.gpu_list[0].bus_id
    if breakage == "information file":
        (gpu_dir(host, 0) / "information").unlink()
    elif breakage == "driver directory":
        (gpu_dir(host, 0) / "information").unlink()
        gpu_dir(host, 0).rmdir()
    else:
        import shutil

        shutil.rmtree(host.sys / "bus/pci/devices" / bus_id)
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-device", "0"])
    error = result.stderr.decode()
    assert result.returncode == 1 and error.startswith(f"ponytail: error: inconsistent host: GPU {bus_id} "), error
    assert error.count("\n") == 1
    assert not (rootfs / "dev/nvidia1").exists() and not (rootfs / "dev/nvidia0").exists()


def test_a_gpu_held_by_another_driver_is_left_out_with_a_note(tmp_path: Path, rootfs: Path) -> None:
    host = two_gpu_host(tmp_path)
    (gpu_dir(host, 0) / "information").unlink()
    gpu_dir(host, 0).rmdir()
    (host.sys / "bus/pci/devices" / host.gpu_list[0].bus_id / "driver").symlink_to("../../../bus/pci/drivers/vfio-pci")
    result = run_ponytail(["-config", str(host.write_config()), "-device", "0", "-debug"])
    assert result.returncode == 0, result.stderr
    assert f"GPU {host.gpu_list[0].bus_id} is bound to the vfio-pci driver" in result.stdout.decode()
    assert "/dev/nvidia1" in result.stdout.decode() and "/dev/nvidia0 " not in result.stdout.decode()


@pytest.mark.parametrize("minors, message", [([3, 3], "both have device minor 3"), ([0, 255], "device minor 255"), ([254, 1], "device minor 254")])
def test_duplicate_or_control_minors_are_an_inconsistent_host(tmp_path: Path, minors: list[int], message: str) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2, minors=minors))
    result = run_ponytail(["-config", str(host.write_config()), "-debug"])
    assert result.returncode == 1 and "inconsistent host: GPU" in result.stderr.decode(), result.stderr
    assert message in result.stderr.decode()


# -- 3. what a capability needs -------------------------------------------------------


def test_compute_without_libcuda_fails_naming_it(host: FakeHost, rootfs: Path) -> None:
    for path in (host.driver / "usr/lib/x86_64-linux-gnu").glob("libcuda.so*"):
        path.unlink()
    config = str(host.write_config())
    result = run_ponytail(["-config", config, "-root", str(rootfs), "-device", "0"])
    assert result.returncode == 1, result.stderr
    assert result.stderr.decode().startswith("ponytail: error: compute needs libcuda.so.1, and the driver root"), result.stderr
    assert not (rootfs / "dev/nvidia2").exists()  # nothing half-done
    result = run_ponytail(["-config", config, "-root", str(rootfs), "-device", "0", "-capabilities", "utility"])
    assert result.returncode == 0, result.stderr  # utility does not need it


def test_a_wrong_uvm_node_fails_compute_and_a_missing_uvm_tools_node_is_a_warning(host: FakeHost, rootfs: Path) -> None:
    (host.dev / "nvidia-uvm-tools").unlink()
    config = str(host.write_config())
    result = run_ponytail(["-config", config, "-root", str(rootfs), "-device", "0"])
    assert result.returncode == 0, result.stderr
    assert " /dev/nvidia-uvm-tools not injected: " in host.log.read_text()
    (host.dev / "nvidia-uvm").unlink()
    os.mknod(host.dev / "nvidia-uvm", 0o666 | 0o020000, os.makedev(1, 3))
    result = run_ponytail(["-config", config, "-root", str(make_rootfs(rootfs.parent / "rootfs2")), "-device", "0"])
    assert result.returncode == 1
    assert result.stderr.decode() == f"ponytail: error: compute: {host.dev}/nvidia-uvm is c 1:3, expected c 511:0\n"


# -- 8. errors that name what is wrong ------------------------------------------------


def test_a_configured_ldconfig_that_does_not_exist_is_named(host: FakeHost, rootfs: Path) -> None:
    config = host.base / "config.toml"
    config.write_text(host.config_text().replace("[log]", 'ldconfig = "/nonexistent/ldconfig"\n[log]'))
    result = run_ponytail(["-config", str(config), "-root", str(rootfs)])
    assert result.returncode == 1
    assert result.stderr.decode() == (
        "ponytail: error: [host] ldconfig in the config is '/nonexistent/ldconfig', which does not exist: "
        "set it to the host's ldconfig, or leave it empty\n"
    )


def test_a_device_node_removed_while_mounting_is_named(host: FakeHost, rootfs: Path) -> None:
    """The host's node and the rootfs's mount point vanish and come back while the hook runs:
    every run either works or fails with a line naming the node (no bare syscall error)."""
    node, target = host.dev / "nvidia2", rootfs / "dev/nvidia2"
    script = f"""
( while :; do rm -f {target} {node}; mknod {node} c 195 2; done ) 2>/dev/null &
for i in $(seq 40); do
  {console_script('ponytail')} -config {host.write_config()} -root {rootfs} -device 0 2>&1 >/dev/null || true
  umount -q {target} 2>/dev/null || true
done
kill $!
"""
    result = in_private_mount_ns(script)
    errors = result.stdout.splitlines()
    assert errors and all(line.startswith("ponytail: error: ") and "nvidia2" in line for line in errors), errors
    assert not [line for line in errors if "move_mount" in line or "open_tree" in line.split("(for")[0]], errors


# -- 4. containers sharing one rootfs -------------------------------------------------


def test_runc_containers_sharing_one_rootfs_all_start_at_once(host: FakeHost, tmp_path: Path) -> None:
    from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0

    hooks = {"prestart": [hook_entry(host.write_config())]}
    bundles = [oci_bundle(tmp_path, CUDACHECK_GPU0, env=["NVIDIA_VISIBLE_DEVICES=0"], hooks=hooks) for _ in range(6)]
    shared = bundles[0] / "rootfs"
    before = sorted(p.name for p in (shared / "etc").iterdir())
    for bundle in bundles:
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"]["path"] = str(shared)
        (bundle / "config.json").write_text(json.dumps(spec))
    ids = [unique() for _ in bundles]
    runs = [
        subprocess.Popen(RUNTIMES["runc"] + ["run", "--bundle", str(b), i], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        for b, i in zip(bundles, ids, strict=True)
    ]
    try:
        results = [(run.communicate(timeout=120), run.returncode) for run in runs]
    finally:
        for i in ids:
            subprocess.run(RUNTIMES["runc"] + ["delete", "-f", i], capture_output=True, timeout=60)
    for (out, err), code in results:
        assert code == 0 and out.splitlines() == EXPECTED_GPU0, err
    after = sorted(p.name for p in (shared / "etc").iterdir())
    assert not [name for name in after if "ponytail-new" in name or name.endswith("~")], after
    assert set(after) - set(before) <= {"ld.so.cache", "ld.so.conf.d"}, after


def test_a_failing_run_never_takes_back_mounts_a_concurrent_run_relies_on(host: FakeHost, rootfs: Path, tmp_path: Path) -> None:
    """Two runs into one container at once; one fails at its last step (ldconfig) and
    takes back what it mounted. The other, when it says it is done, must be done."""
    failing = tmp_path / "failing-ldconfig"
    failing.write_text("#!/bin/sh\necho no >&2\nexit 1\n")
    failing.chmod(0o755)
    good = host.write_config()
    bad = host.base / "bad.toml"
    bad.write_text(host.config_text().replace("[log]", f'ldconfig = "{failing}"\n[log]'))
    ponytail = console_script("ponytail")
    for attempt in range(8):
        sleeper = Sleeper()
        try:
            bundle = bundle_for(tmp_path, rootfs, name=f"bundle{attempt}")
            state = state_for(bundle, sleeper.pid)
            runs = [
                subprocess.Popen([ponytail, "-config", str(config), "-device", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for config in (bad, good)
            ]
            for run in runs:
                run.stdin.write(state.encode())
                run.stdin.close()
            codes = [run.wait(timeout=60) for run in runs]
            assert codes == [1, 0], [run.stderr.read() for run in runs]
            mounted = sleeper.run(["cat", "/proc/self/mountinfo"]).stdout
            assert f"{rootfs}/dev/nvidia2 " in mounted and f"{rootfs}/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15 " in mounted
        finally:
            sleeper.stop()


# -- the soak -------------------------------------------------------------------------


@pytest.mark.slow
def test_soak_many_runs_at_once_with_sigkills_and_a_flapping_gpu(tmp_path: Path) -> None:
    """bench/soak.py, shortened: 120 runs, 16 at once, 24 containers of which every 3 share
    a rootfs directory, a fifth of the runs SIGKILLed at a random moment, the information
    file of one GPU going and coming back all along."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from soak import soak

    report = soak(tmp_path, console_script("ponytail"), runs=120, concurrency=16, kill_rate=0.2)
    assert report.clean, report.summary() + "\n" + "\n".join(report.wrong_gpus + report.silent_failures + report.leaks)
    assert report.succeeded > 0 and report.killed > 0 and report.runs == 120


def test_sigkill_at_any_moment_leaves_no_partial_or_temporary_linker_config(host: FakeHost, rootfs: Path) -> None:
    conf_dir = rootfs / "etc/ld.so.conf.d"
    script = f"""
mkdir -p {conf_dir}
for i in $(seq 30); do
  echo /stale > {conf_dir}/00-ponytail.conf
  timeout -s KILL 0.$(( 20 + i * 4 )) {console_script('ponytail')} -config {host.write_config()} -root {rootfs} >/dev/null 2>&1 || true
  echo "$(ls -A {conf_dir})"; cat {conf_dir}/00-ponytail.conf 2>/dev/null || echo none; echo --
done
"""
    result = in_private_mount_ns(script)
    rounds = result.stdout.split("--\n")[:-1]
    assert len(rounds) == 30, result
    for text in rounds:
        names, _, content = text.partition("\n")
        assert names in ("00-ponytail.conf", ""), rounds  # no .00-ponytail.conf.ponytail-new
        # the old file, the new one, or (killed between unlinking the old and linking the new) none
        assert content in ("/stale\n", "/usr/lib/x86_64-linux-gnu\n", "none\n"), rounds
    assert any(text.endswith("/usr/lib/x86_64-linux-gnu\n") for text in rounds)


@pytest.mark.parametrize("when", [1, 2])
def test_sigkill_at_the_linker_config_publishing_step_leaves_no_temporary_file(host: FakeHost, rootfs: Path, when: int) -> None:
    """SIGKILL exactly when the linker config is given its name (the first or second link
    or rename: strace injects it), the moment a temporary file would be left behind."""
    conf_dir = rootfs / "etc/ld.so.conf.d"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "00-ponytail.conf").write_text("/stale\n")
    calls = "linkat,renameat,renameat2,rename"
    strace = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={calls}", "-e", f"inject={calls}:signal=KILL:when={when}"]
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs)], command=strace + [console_script("ponytail")])
    assert result.returncode != 0  # killed
    assert [p.name for p in conf_dir.iterdir()] in ([], ["00-ponytail.conf"])
    if (conf_dir / "00-ponytail.conf").exists():
        assert (conf_dir / "00-ponytail.conf").read_text() in ("/stale\n", "/usr/lib/x86_64-linux-gnu\n")


def test_a_libcuda_that_replaces_itself_while_its_cuda_version_is_asked_cannot(tmp_path: Path) -> None:
    """A libcuda whose cuDriverGetVersion renames a CUDA 11.0 build of the same name over itself (a
    same-name reinstall landing mid-check, or hostile driver code): the child that asks it runs as
    nobody in a read-only view of the host, so the rename fails, the file loaded is the file checked
    (it is loaded by its descriptor), and the container gets the 12.4 build that met cuda>=12.0."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    libdir = host.driver / "usr/lib/x86_64-linux-gnu"
    libcuda = libdir / f"libcuda.so.{host.driver_version}"
    older = compile_library("fake_libcuda.c", "libcuda.so.1", libcuda.name, host.driver_version, 11000)
    shutil.copy(older, libdir / ".libcuda-new")
    swapping = (f'SWAP_FROM="{libdir}/.libcuda-new"', f'SWAP_TO="{libcuda}"')
    shutil.copy(compile_library("fake_libcuda.c", "libcuda.so.1", libcuda.name, host.driver_version, 12040, defines=swapping), libcuda)
    before = libcuda.stat()
    bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck"], env=["NVIDIA_REQUIRE_CUDA=cuda>=12.0"],
                        hooks={"prestart": [hook_entry(host.write_config())]})
    result = run_runc(bundle)
    assert (libdir / ".libcuda-new").exists() and libcuda.stat().st_ino == before.st_ino  # the driver code could not swap it
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "cuDriverGetVersion 12040", result.stdout


def test_a_libcuda_replaced_between_its_check_and_its_mount_is_not_mounted(tmp_path: Path, sleeper: Sleeper) -> None:
    """The image ships its own libcuda.so.1 (so the driver's is also cloned late, in the rootfs step);
    the run waits for another run's rootfs lock after NVIDIA_REQUIRE_CUDA was met, and a CUDA
    11.0 build of the same name is installed meanwhile: the start fails naming the host file,
    and the 11.0 build never reaches the container."""
    import fcntl

    from support.fakehost import add_stale_libcuda

    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    libcuda = host.driver / "usr/lib/x86_64-linux-gnu" / f"libcuda.so.{host.driver_version}"
    bundle = oci_bundle(tmp_path, ["true"], env=["NVIDIA_REQUIRE_CUDA=cuda>=12.0"])
    rootfs = bundle / "rootfs"
    add_stale_libcuda(rootfs, "470.82.01", 11040)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"ociVersion": "1.0.2", "id": "swap", "status": "creating", "pid": sleeper.pid, "bundle": str(bundle)}))
    lock = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        with state.open("rb") as stdin:
            run = subprocess.Popen([console_script("ponytail"), "-config", str(host.write_config())], stdin=stdin,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_for(host.log, "step: wait for other runs into")
        new = libcuda.with_name("libcuda.new")
        shutil.copy(compile_library("fake_libcuda.c", "libcuda.so.1", libcuda.name, host.driver_version, 11000), new)
        new.rename(libcuda)
        fcntl.flock(lock, fcntl.LOCK_UN)
        _, err = run.communicate(timeout=60)
    finally:
        os.close(lock)
    # its clone from before the lock is of a file unlinked since (and a clone made now would be another file)
    said = err.decode()
    assert run.returncode == 1 and f"{libcuda} on the host " in said and "rootfs)" not in said, said
    assert "changed after it was checked" in said or "was removed or replaced meanwhile" in said, said
    check = subprocess.run(["nsenter", "-t", str(sleeper.pid), "-m", "chroot", str(rootfs), "/usr/local/bin/cudacheck"],
                           capture_output=True, text=True, timeout=60)
    assert "11000" not in check.stdout, check.stdout


@pytest.mark.parametrize("suffix", [".bak", ".old", ".dpkg-new", "~"])
def test_a_backup_of_an_older_drivers_libcuda_is_never_taken_for_the_running_ones(tmp_path: Path, suffix: str) -> None:
    """550's libcuda is gone; a 535 build kept as libcuda.so.535.104.05.bak (CUDA 11.0) is
    not the running driver's library: the start fails naming what is missing (before: it was
    mounted and linked as libcuda.so.1, exit 0, CUDA 11000 in the container)."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    libdir = host.driver / "usr/lib/x86_64-linux-gnu"
    (libdir / f"libcuda.so.{host.driver_version}").unlink()
    older = compile_library("fake_libcuda.c", "libcuda.so.1", "libcuda.so.535.104.05", "535.104.05", 11000)
    shutil.copy(older, libdir / f"libcuda.so.535.104.05{suffix}")
    bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck"], hooks={"prestart": [hook_entry(host.write_config())]})
    result = run_runc(bundle)
    assert result.returncode != 0 and "11000" not in result.stdout, result.stdout
    assert "compute needs libcuda.so.1" in result.stderr, result.stderr
    debug = run_ponytail(["-config", str(host.write_config()), "-root", str(bundle / "rootfs"), "-debug"])
    assert f"libcuda.so.535.104.05{suffix}: a renamed copy of driver 535.104.05's library" in debug.stdout.decode(), debug.stdout


def test_an_upgrade_without_a_reboot_is_said_the_same_way_by_every_entry_point(tmp_path: Path) -> None:
    """The driver's libraries are 560 now, the loaded module still 550 (NVML's 'Driver/library
    version mismatch'): the hook, -debug, info and check all give check's diagnosis, both
    versions and 'reboot, or reload the module' (before: the hook named one version and the
    config, -debug guessed 'left over from an upgrade?', info said 'no libcuda found')."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), driver_version="560.35.03")
    version = host.proc / "driver/nvidia/version"
    version.write_text(version.read_text().replace("560.35.03", "550.54.15"))
    config = str(host.write_config())
    libcuda = "/usr/lib/x86_64-linux-gnu/libcuda.so.560.35.03"
    said = (f"libcuda.so.1 under {host.driver} is version 560.35.03 ({libcuda}) but the kernel module is 550.54.15 "
            "(Driver/library version mismatch): reboot, or reload the module of the installed driver")
    bundle = oci_bundle(tmp_path, ["true"], hooks={"prestart": [hook_entry(config)]})
    hook = run_runc(bundle)
    assert hook.returncode != 0 and said in hook.stderr, hook.stderr
    debug = run_ponytail(["-config", config, "-root", str(bundle / "rootfs"), "-debug"]).stdout.decode()
    assert f"problem: {said}" in debug and "left over" not in debug, debug
    info = run_ponytail(["info", "-config", config]).stdout.decode()
    assert said in info, info
    check = run_ponytail(["check", "-config", config]).stdout.decode()
    assert said in check, check
    # a container that requires a CUDA version is told the same, not "no libcuda.so.1 of driver 550"
    bundle = oci_bundle(tmp_path, ["true"], env=["NVIDIA_REQUIRE_CUDA=cuda>=12.0"], hooks={"prestart": [hook_entry(config)]})
    hook = run_runc(bundle)
    assert hook.returncode != 0 and said in hook.stderr and "no libcuda.so.1 of driver" not in hook.stderr, hook.stderr


@pytest.mark.parametrize("breakage", ["information file", "driver directory"])
def test_one_lost_gpu_fails_index_and_all_requests_but_not_one_by_uuid_or_bus_id(tmp_path: Path, breakage: str) -> None:
    """GPU 0's information file (or directory) is gone: indices are ambiguous, so '0', '1', 'all'
    and '1:0:0' fail naming it; GPU 1 by UUID or bus id starts, with a warning, and a program in
    the container opens GPU 1's node only (before: every request failed)."""
    host = two_gpu_host(tmp_path)
    lost, healthy = host.gpu_list
    (gpu_dir(host, 0) / "information").unlink()
    if breakage == "driver directory":
        gpu_dir(host, 0).rmdir()
    config = host.write_config()
    for devices in ("0", "1", "all", "1:0:0"):
        bundle = oci_bundle(tmp_path, ["true"], env=[f"NVIDIA_VISIBLE_DEVICES={devices}"], hooks={"prestart": [hook_entry(config)]})
        result = run_runc(bundle)
        assert result.returncode != 0 and f"inconsistent host: GPU {lost.bus_id} " in result.stderr, (devices, result.stderr)
    for devices in (healthy.uuid, healthy.bus_id, healthy.bus_id[5:]):
        bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck", f"/dev/nvidia{healthy.minor}", f"/dev/nvidia{lost.minor}"],
                            env=[f"NVIDIA_VISIBLE_DEVICES={devices}"], hooks={"prestart": [hook_entry(config)]})
        result = run_runc(bundle)
        assert result.returncode == 0, (devices, result.stderr)
        assert f"open /dev/nvidia{healthy.minor} ENXIO" in result.stdout and f"open /dev/nvidia{lost.minor} ENOENT" in result.stdout, result.stdout
    warnings = [line for line in host.log.read_text().splitlines() if " warning container=" in line]
    assert len(warnings) == 3 and all(f"inconsistent host: GPU {lost.bus_id} " in w and "by UUID or bus id only" in w for w in warnings), warnings


def test_the_lost_gpu_asked_by_index_uuid_or_bus_id_fails_alike(tmp_path: Path) -> None:
    """The driver lost GPU 0 (its UUID with its information file): asked by index it exited 1,
    asked by its UUID 2 ("unknown GPU"). Each way now exits 1 with the same line."""
    host = two_gpu_host(tmp_path)
    lost = host.gpu_list[0]
    (gpu_dir(host, 0) / "information").unlink()
    config = str(host.write_config())
    rootfs = make_rootfs(tmp_path / "rootfs")
    said = set()
    for devices in ("0", lost.uuid, lost.bus_id):
        result = run_ponytail(["-config", config, "-root", str(rootfs), "-device", devices])
        err = result.stderr.decode()
        assert result.returncode == 1 and len(err.splitlines()) == 1, (devices, err)
        assert f"inconsistent host: GPU {lost.bus_id} " in err and "unknown GPU" not in err, (devices, err)
        said.add(err)
    assert len(said) == 1, said


def _wait_for(path: Path, text: str, seconds: float = 30) -> str:
    for _ in range(int(seconds / 0.02)):
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}: {content}")


def test_a_killed_run_leaves_which_container_and_step_and_a_node_replaced_meanwhile_is_named(tmp_path: Path, sleeper: Sleeper) -> None:
    """A run waiting for another run's rootfs lock has logged that it started and where it is;
    SIGKILLed there, its record stays (before: nothing in the log). A second run waits there
    while GPU 0's host node is replaced: the line names that host file, not the rootfs."""
    import fcntl
    import signal

    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    bundle = oci_bundle(tmp_path, ["true"])
    rootfs = bundle / "rootfs"
    config = host.write_config()
    state = tmp_path / "state.json"
    lock = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another run into this rootfs, holding it
    try:
        for attempt in ("killed", "replaced"):
            state.write_text(json.dumps({"ociVersion": "1.0.2", "id": f"lock-{attempt}", "status": "creating", "pid": sleeper.pid, "bundle": str(bundle)}))
            with state.open("rb") as stdin:
                run = subprocess.Popen([console_script("ponytail"), "-config", str(config)], stdin=stdin, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True)
            log = _wait_for(host.log, f"container=lock-{attempt} step: wait for other runs into {rootfs} (the rootfs lock)")
            assert f"container=lock-{attempt} started: process {sleeper.pid}, rootfs {rootfs}; step: plan" in log
            if attempt == "killed":
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(timeout=30)
                continue
            node = host.dev / "nvidia0"
            node.unlink()
            os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
            fcntl.flock(lock, fcntl.LOCK_UN)
            _, err = run.communicate(timeout=60)
            assert run.returncode == 1 and f"{node} on the host was removed or replaced meanwhile" in err.decode(), err
    finally:
        os.close(lock)
    assert "injected" not in host.log.read_text()


def test_a_second_run_after_the_driver_was_reinstalled_names_the_host_file(host: FakeHost, tmp_path: Path, sleeper: Sleeper) -> None:
    """A second run into a container whose libcuda mount is of a host file replaced since (a
    same-name reinstall): it cannot mount over that, and says which host file it is and what
    to do (before: 'was removed meanwhile (something else is changing the rootfs)')."""
    bundle = oci_bundle(tmp_path, ["true"])
    state = state_for(bundle, sleeper.pid)
    config = str(host.write_config())
    first = run_ponytail(["-config", config], stdin=state, isolated=False)
    assert first.returncode == 0, first.stderr
    libcuda = host.driver / "usr/lib/x86_64-linux-gnu" / f"libcuda.so.{host.driver_version}"
    shutil.copy(libcuda, libcuda.with_name("libcuda.new"))
    libcuda.with_name("libcuda.new").rename(libcuda)
    again = run_ponytail(["-config", config], stdin=state, isolated=False)
    err = again.stderr.decode()
    assert again.returncode == 1 and len(err.splitlines()) == 1, err
    assert f"an earlier run mounted a host file there that has been removed or replaced since ({libcuda}" in err, err
    assert "something else is changing the rootfs" not in err


def test_a_libcuda_reinstalled_between_its_check_and_its_clone_is_refused(tmp_path: Path, rootfs: Path, sleeper: Sleeper) -> None:
    """NVIDIA_REQUIRE_CUDA=cuda>=12.0 is met by the 12.4 build; the first clone (a device node) is
    held up for 1.5 s (strace's syscall delay), and a CUDA 11.0 build of the same name is
    installed then: the libcuda cloned next is not the file checked, and the start fails naming
    it (before: the 11.0 build was mounted, exit 0, 11000 in the container)."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    libcuda = host.driver / "usr/lib/x86_64-linux-gnu" / f"libcuda.so.{host.driver_version}"
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"])
    traced = tmp_path / "strace.txt"
    command = ["strace", "-o", str(traced), "-e", "trace=open_tree", "-e", "inject=open_tree:delay_enter=1500000:when=1",
               console_script("ponytail"), "-config", str(host.write_config())]
    state = tmp_path / "state.json"
    state.write_text(state_for(bundle, sleeper.pid))
    with state.open("rb") as stdin:
        run = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(traced, "open_tree(")
    new = libcuda.with_name("libcuda.new")
    shutil.copy(compile_library("fake_libcuda.c", "libcuda.so.1", libcuda.name, host.driver_version, 11000), new)
    new.rename(libcuda)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1 and f"{libcuda} on the host changed after it was checked" in err.decode(), err
    check = subprocess.run(["nsenter", "-t", str(sleeper.pid), "-m", "chroot", str(rootfs), "/usr/local/bin/cudacheck"],
                           capture_output=True, text=True, timeout=60)
    assert "11000" not in check.stdout, check.stdout
