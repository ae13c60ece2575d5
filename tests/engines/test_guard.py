"""ponytail guard on real runc containers started with ponytail's prestart hook, on cgroup v1 and on a
pure cgroup v2 view: their device rules rewritten the way systemctl daemon-reload leaves them
(the GPU's rules taken out of devices.list; on v2 the device program replaced by the engine's own,
without the GPU). ``--report-only`` names the container and changes nothing; ``--once`` gives back
exactly the allotted nodes (checked inside the container: ENXIO = allowed on a fake node, EPERM =
denied; a GPU node nobody was given stays denied); a second pass is a no-op. A driver upgrade while
the container runs is reported; records survive the guard being killed and started again."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from ponytail.apply import bpf
from ponytail.plan.devicefilter import allow_block

from support.cdi_support import generate
from support.engines import RUNTIMES, TIMEOUT, Podman, console_script, hook_entry, oci_bundle, unique
from support.fakehost import FakeHost, compile_program, make_rootfs

GPU0 = ((195, 2), (195, 255), (511, 0), (511, 1))  # what NVIDIA_VISIBLE_DEVICES=0 injects on conftest's host
DENIED = "/denied-nvidia200"  # c 195:200: a GPU node nobody was given
CHECK = ["/usr/local/bin/cudacheck", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", DENIED]
ALLOWED = ["open /dev/nvidia2 ENXIO", "open /dev/nvidiactl ENXIO", "open /dev/nvidia-uvm ENXIO", f"open {DENIED} EPERM"]
LOST = ["open /dev/nvidia2 EPERM", "open /dev/nvidiactl EPERM", "open /dev/nvidia-uvm EPERM", f"open {DENIED} EPERM"]


class Running:
    """A runc container running ``busybox sleep`` with ponytail as its prestart hook."""

    def __init__(self, runtime: str, host: FakeHost, base: Path, command: list[str] | None = None, cdi: dict | None = None,
                 hooks: bool = True, cgroupns: bool = False, programs: tuple[str, ...] = ()) -> None:
        self.runtime = RUNTIMES[runtime]
        self.id = unique("guard")
        if cdi is None:
            bundle = oci_bundle(base, command or ["/bin/busybox", "sleep", "600"], env=["NVIDIA_VISIBLE_DEVICES=0"],
                                hooks={"prestart": [hook_entry(host.write_config())]})
        else:
            bundle = oci_bundle(base, command or ["/bin/busybox", "sleep", "600"])
            apply_cdi(bundle / "config.json", cdi, "0", hooks)
        if cgroupns:  # the container in a cgroup namespace of its own, as containerd and CRI-O do on cgroup v2
            config = json.loads((bundle / "config.json").read_text())
            config["linux"]["namespaces"].append({"type": "cgroup"})
            (bundle / "config.json").write_text(json.dumps(config))
        os.mknod(bundle / "rootfs" / DENIED.lstrip("/"), 0o666 | stat.S_IFCHR, os.makedev(195, 200))
        for program in ("cudahold.c", *programs):
            shutil.copy(compile_program(program), bundle / "rootfs/usr/local/bin" / Path(program).stem)
        self.proc = subprocess.Popen([*self.runtime, "run", "--bundle", str(bundle), self.id], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.pid = self._wait_running()

    def _wait_running(self) -> int:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            state = subprocess.run([*self.runtime, "state", self.id], capture_output=True, text=True)
            if state.returncode == 0 and json.loads(state.stdout)["status"] == "running":
                return int(json.loads(state.stdout)["pid"])
            if self.proc.poll() is not None:
                raise AssertionError(f"the container did not start: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            time.sleep(0.05)
        raise AssertionError("the container did not start in time")

    def opens(self) -> list[str]:
        result = subprocess.run([*self.runtime, "exec", self.id, *CHECK], capture_output=True, text=True, timeout=TIMEOUT)
        return [line for line in result.stdout.splitlines() if line.startswith("open ")]

    def opens_without_libcuda(self) -> list[str]:
        """The same opens with busybox's cat, for a container without libcuda (cudacheck needs it)."""
        script = " ".join(f'echo "open {node} $(cat {node} 2>&1 >/dev/null)";' for node in CHECK[1:])
        result = subprocess.run([*self.runtime, "exec", self.id, "/bin/sh", "-c", script], capture_output=True, text=True, timeout=TIMEOUT)
        names = {"No such device or address": "ENXIO", "Operation not permitted": "EPERM"}
        return [" ".join(line.split()[:2] + [next((v for k, v in names.items() if k in line), line)]) for line in result.stdout.splitlines()]

    def stop(self) -> None:
        subprocess.run([*self.runtime, "delete", "-f", self.id], capture_output=True, timeout=TIMEOUT)
        self.proc.wait(timeout=TIMEOUT)


def apply_cdi(config_json: Path, spec: dict, device: str, hooks: bool = True) -> None:
    """What an engine does with a CDI device: the spec's and the device's edits into config.json."""
    config = json.loads(config_json.read_text())
    [entry] = [d for d in spec["devices"] if d["name"] == device]
    for edits in (spec["containerEdits"], entry["containerEdits"]):
        config["process"]["env"] += edits.get("env", [])
        for node in edits.get("deviceNodes", []):
            config["linux"].setdefault("devices", []).append(
                {"path": node["path"], "type": "c", "major": node["major"], "minor": node["minor"], "fileMode": 0o666})
            config["linux"]["resources"]["devices"].append(
                {"allow": True, "type": "c", "major": node["major"], "minor": node["minor"], "access": "rwm"})
        for mount in edits.get("mounts", []):
            config["mounts"].append({"destination": mount["containerPath"], "source": mount["hostPath"], "type": "bind",
                                     "options": mount["options"]})
        for hook in edits.get("hooks", []) if hooks else []:
            entry = {"path": hook["path"], "args": hook["args"], **({"env": hook["env"]} if hook.get("env") else {})}
            config.setdefault("hooks", {}).setdefault(hook["hookName"], []).append(entry)
    config_json.write_text(json.dumps(config))


@pytest.fixture
def v1(host: FakeHost, tmp_path: Path):
    container = Running("runc", host, tmp_path)
    yield container
    container.stop()


def guard(host: FakeHost, *args: str, command: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*(command or [console_script("ponytail")]), "guard", "--config", str(host.base / "config.toml"), *args],
                          capture_output=True, text=True, timeout=TIMEOUT)


def devices_dir(pid: int) -> Path:
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ":devices:" in x)
    return Path("/sys/fs/cgroup/devices") / line.split(":", 2)[2].lstrip("/")


def unified_dir(pid: int) -> Path:
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x.startswith("0::"))
    return Path("/sys/fs/cgroup/unified") / line[3:].lstrip("/")


def records(host: FakeHost) -> Path:
    return host.base / "cache" / "containers"


def reload_v1(pid: int) -> None:
    """What systemd's reload leaves on cgroup v1: the GPU's rules gone from devices.list."""
    for major, minor in GPU0:
        (devices_dir(pid) / "devices.deny").write_text(f"c {major}:{minor} rwm")


def test_the_hook_records_the_container_root_only(host: FakeHost, v1: Running) -> None:
    path = records(host) / f"{v1.id}.json"
    assert stat.S_IMODE(records(host).stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    record = json.loads(path.read_text())
    assert record["id"] == v1.id and record["pid"] == v1.pid and record["started_by"] == "hook"
    assert record["cgroup"]["v1"] == "/" + str(devices_dir(v1.pid).relative_to("/sys/fs/cgroup/devices"))
    assert [(d["type"], d["major"], d["minor"], d["path"]) for d in record["devices"]] == [
        ("c", 195, 2, "/dev/nvidia2"), ("c", 195, 255, "/dev/nvidiactl"), ("c", 511, 0, "/dev/nvidia-uvm"), ("c", 511, 1, "/dev/nvidia-uvm-tools")]
    assert record["driver_version"] == host.driver_version and record["libcuda"]["path"].endswith(f"libcuda.so.{host.driver_version}")


def test_cgroup_v1_report_only_then_once_gives_back_exactly_the_gpu(host: FakeHost, v1: Running, ponytail_command: list[str]) -> None:
    run = functools.partial(guard, command=ponytail_command)  # the installed command, then the binary
    assert v1.opens() == ALLOWED
    first = run(host, "--once")
    assert first.returncode == 0 and "all 4 allotted node(s) allowed" in first.stdout, first.stdout + first.stderr
    reload_v1(v1.pid)
    before = (devices_dir(v1.pid) / "devices.list").read_text()
    assert v1.opens() == LOST

    report = run(host, "--once", "--report-only")
    assert report.returncode == 1, report.stdout + report.stderr
    [(level, subject, message)] = check(host)
    assert (level, subject) == ("problem", v1.id) and message.startswith("lost access to c 195:2 /dev/nvidia2"), message
    assert f"container {v1.id}" in report.stdout and "has lost c 195:2 /dev/nvidia2, c 195:255 /dev/nvidiactl" in report.stdout
    assert (devices_dir(v1.pid) / "devices.list").read_text() == before and v1.opens() == LOST

    repaired = run(host, "--once", "--json")
    assert repaired.returncode == 1, repaired.stdout + repaired.stderr
    status = json.loads(repaired.stdout)
    assert (status["watched"], status["lost"], status["repaired"]) == (1, 1, 1)
    assert v1.opens() == ALLOWED  # the GPU back, the node nobody was given still denied
    after = set((devices_dir(v1.pid) / "devices.list").read_text().splitlines())
    assert after - set(before.splitlines()) == {f"c {major}:{minor} rw" for major, minor in GPU0}
    assert f"container={v1.id}" not in host.log.read_text() or "given back" in host.log.read_text()

    again = run(host, "--once")
    assert again.returncode == 0 and "all 4 allotted node(s) allowed" in again.stdout, again.stdout
    assert set((devices_dir(v1.pid) / "devices.list").read_text().splitlines()) == after
    assert check(host) == [("ok", "guard", "1 running GPU container(s) recorded: none lost a node, none on a stale driver")]


def check(host: FakeHost) -> list[tuple[str, str, str]]:
    """ponytail check's findings about the running containers."""
    result = subprocess.run([console_script("ponytail"), "check", "--json", "--config", str(host.base / "config.toml")],
                            capture_output=True, text=True, timeout=TIMEOUT)
    return [(f["level"], f["subject"], f["message"]) for f in json.loads(result.stdout)["findings"] if f["area"] == "container"]


def test_a_driver_upgrade_while_the_container_runs_is_reported(host: FakeHost, tmp_path: Path) -> None:
    container = Running("runc", host, tmp_path, ["/usr/local/bin/cudahold"])  # a job with libcuda loaded
    try:
        assert guard(host, "--once").returncode == 0
        version = host.proc / "driver/nvidia/version"
        version.write_text(version.read_text().replace(host.driver_version, "570.86.10"))
        found = next(host.driver.rglob(f"libcuda.so.{host.driver_version}"))
        replacement = found.with_name(found.name + ".new")
        replacement.write_bytes(found.read_bytes())
        os.rename(replacement, found)  # the package manager's way: the old file deleted, a new one in its place
        result = guard(host, "--once", "--report-only")
        assert result.returncode == 1, result.stdout + result.stderr
        line = next(x for x in result.stdout.splitlines() if container.id in x)
        assert f"given driver {host.driver_version}, 570.86.10 runs now" in line
        assert "has been replaced" in line and "map a deleted" in line and "libcuda.so" in line, line
        status = json.loads(guard(host, "--once", "--json").stdout)
        assert status["stale"] == 1 and status["containers"][0]["id"] == container.id
        [(level, subject, message)] = check(host)
        assert (level, subject) == ("warning", container.id) and "bound to a driver that no longer runs" in message, message
    finally:
        container.stop()


def test_the_record_of_a_container_that_is_gone_is_removed(host: FakeHost, tmp_path: Path) -> None:
    container = Running("runc", host, tmp_path)
    path = records(host) / f"{container.id}.json"
    assert path.exists()
    container.stop()
    report = guard(host, "--once", "--report-only")
    assert f"container {container.id}" in report.stdout and "gone; its record kept (report only)" in report.stdout and path.exists()
    removed = guard(host, "--once")
    assert removed.returncode == 0 and "gone; its record removed" in removed.stdout and not path.exists()


def test_a_record_not_root_only_is_not_believed(host: FakeHost, v1: Running) -> None:
    path = records(host) / f"{v1.id}.json"
    reload_v1(v1.pid)
    os.chmod(path, 0o644)
    result = guard(host, "--once")
    assert result.returncode == 1 and "record ignored" in result.stdout and v1.opens() == LOST, result.stdout


def test_records_under_a_directory_others_can_change_are_not_believed(host: FakeHost, v1: Running, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # noqa: S103 - the point: anyone could rename the records directory away and plant another
    shutil.copytree(records(host), shared / "containers")
    config = host.base / "other.toml"
    config.write_text(host.config_text() + f'[guard]\nrecords = "{shared}/containers"\n')
    reload_v1(v1.pid)
    result = subprocess.run([console_script("ponytail"), "guard", "--once", "--config", str(config)], capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1 and "is not root's alone" in result.stdout and v1.opens() == LOST, result.stdout


def test_repair_off_in_the_config_only_reports(host: FakeHost, v1: Running) -> None:
    config = host.base / "report-only.toml"
    config.write_text(host.config_text() + "[guard]\nrepair = false\n")
    reload_v1(v1.pid)
    result = subprocess.run([console_script("ponytail"), "guard", "--once", "--config", str(config)], capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1 and "not given back (report only)" in result.stdout, result.stdout
    assert v1.opens() == LOST


def test_the_daemon_killed_and_restarted_keeps_its_records(host: FakeHost, v1: Running, tmp_path: Path) -> None:
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    textfile = tmp_path / "ponytail.prom"
    command = [console_script("ponytail"), "guard", "--config", str(host.base / "config.toml"), "--events", str(fifo),
               "--textfile", str(textfile), "--interval", "600"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait(lambda: textfile.exists())
    assert "ponytail_guard_containers_watched 1" in textfile.read_text()
    first.kill()
    first.wait()
    reload_v1(v1.pid)
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(lambda: v1.opens() == ALLOWED)  # its first pass: the record was still there
        _wait(lambda: "ponytail_guard_containers_repaired 1" in textfile.read_text())  # written after the pass
        reload_v1(v1.pid)
        with open(fifo, "w") as f:  # a driver event (a test FIFO stands for the kernel's uevents)
            f.write("add module nvidia\n")
        _wait(lambda: v1.opens() == ALLOWED)
        _wait(lambda: "ponytail_guard_events_total 1" in textfile.read_text() and "ponytail_guard_repairs_total 2" in textfile.read_text())
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    assert "guard stopped" in host.log.read_text()


def test_a_cdi_container_is_recorded_by_the_cdi_hook_and_given_back_its_gpu(host: FakeHost, tmp_path: Path) -> None:
    spec = generate(host, tmp_path / "spec.json")
    container = Running("runc", host, tmp_path, cdi=spec)
    try:
        assert container.opens() == ALLOWED
        record = json.loads((records(host) / f"{container.id}.json").read_text())
        assert record["started_by"] == "cdi-hook" and record["pid"] == container.pid, record
        assert record["spec_driver_version"] == host.driver_version
        assert {(d["major"], d["minor"], d["path"]) for d in record["devices"]} >= {(195, 2, "/dev/nvidia2"), (195, 255, "/dev/nvidiactl")}
        reload_v1(container.pid)
        assert container.opens() == LOST
        result = guard(host, "--once")
        assert result.returncode == 1 and "given back" in result.stdout, result.stdout + result.stderr
        assert container.opens() == ALLOWED
        version = host.proc / "driver/nvidia/version"
        version.write_text(version.read_text().replace(host.driver_version, "570.86.10"))
        stale = guard(host, "--once", "--report-only")
        assert f"started from a CDI spec made for driver {host.driver_version}, 570.86.10 runs now (stale spec)" in stale.stdout
    finally:
        container.stop()


def test_the_daemon_acts_on_real_kernel_uevents(host: FakeHost, v1: Running, tmp_path: Path, ponytail_command: list[str]) -> None:
    """A real uevent from the kernel (what 'udevadm trigger' makes: a write to a device's uevent file),
    on a device this machine has (/dev/null; the guard is told to count it as the driver's). On the
    event the guard makes the /dev/char links and the CDI spec true to the driver, then runs a pass."""
    spec = tmp_path / "cdi" / "ponytail.yaml"
    spec.parent.mkdir()
    command = [*ponytail_command, "guard", "--config", str(host.base / "config.toml"), "--watch", "mem:null",
               "--cdi-spec", str(spec), "--interval", "600"]
    daemon = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(lambda: "guard started" in host.log.read_text() and "pass (start)" in host.log.read_text())
        reload_v1(v1.pid)
        assert not spec.exists() and not (host.dev / "char" / "195:2").exists()
        Path("/sys/devices/virtual/mem/null/uevent").write_text("change")
        _wait(lambda: v1.opens() == ALLOWED)
        _wait(lambda: "1 event(s): change mem null" in host.log.read_text())  # the pass's line comes after its repair
        assert os.readlink(host.dev / "char" / "195:2") == "../nvidia2" and "nvidia.com/gpu" in spec.read_text()
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, daemon.stderr.read() if daemon.stderr else ""


def test_the_daemon_links_a_node_the_driver_makes_without_a_uevent(host: FakeHost, tmp_path: Path) -> None:
    """nvidia-modprobe makes the nodes (MIG's nvidia-caps ones too) with mknod, which sends no uevent:
    the guard watches /dev and /dev/nvidia-caps itself, and links the new node."""
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    daemon = subprocess.Popen([console_script("ponytail"), "guard", "--config", str(host.write_config()), "--events", str(fifo)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(lambda: "pass (start)" in host.log.read_text())
        caps = host.dev / "nvidia-caps"
        caps.mkdir(exist_ok=True)
        time.sleep(0.5)  # the directory made after the guard started: it watches it from its creation
        os.mknod(caps / "nvidia-cap5", 0o400 | stat.S_IFCHR, os.makedev(239, 5))
        _wait(lambda: os.path.islink(host.dev / "char" / "239:5"))
        assert os.readlink(host.dev / "char" / "239:5") == "../nvidia-caps/nvidia-cap5"
        _wait(lambda: "event(s): add" in host.log.read_text() and "nvidia-cap5" in host.log.read_text())  # logged after the links
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0


def test_a_container_started_through_the_shim_is_recorded_and_given_back_its_gpu(host: FakeHost, tmp_path: Path) -> None:
    """ponytail-runtime, as containerd calls it: the device rules in config.json, and the prestart hook it adds records it."""
    config = host.write_config()
    bundle = oci_bundle(tmp_path, ["/bin/busybox", "sleep", "600"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    os.mknod(bundle / "rootfs" / DENIED.lstrip("/"), 0o666 | stat.S_IFCHR, os.makedev(195, 200))
    container_id = unique("guard")
    runc = ["runc", "--root", str(tmp_path / "runc-state")]
    env = {"PATH": os.environ["PATH"], "PONYTAIL_CONFIG": str(config)}
    shim = [console_script("ponytail-runtime"), "--root", str(tmp_path / "runc-state")]
    with open(tmp_path / "out", "w") as out:  # create leaves the container holding its stdio: no pipes
        created = subprocess.run([*shim, "create", "--bundle", str(bundle), container_id], env=env, stdout=out, stderr=out,
                                 timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    try:
        assert created.returncode == 0, (tmp_path / "out").read_text()
        assert subprocess.run([*shim, "start", container_id], env=env, capture_output=True, timeout=TIMEOUT).returncode == 0
        pid = int(json.loads(subprocess.run([*runc, "state", container_id], capture_output=True, text=True).stdout)["pid"])

        def opens() -> list[str]:
            result = subprocess.run([*runc, "exec", container_id, *CHECK], capture_output=True, text=True, timeout=TIMEOUT)
            return [line for line in result.stdout.splitlines() if line.startswith("open ")]

        assert opens() == ALLOWED
        assert json.loads((records(host) / f"{container_id}.json").read_text())["pid"] == pid
        reload_v1(pid)
        assert opens() == LOST
        result = guard(host, "--once")
        assert result.returncode == 1 and f"container {container_id}" in result.stdout and "given back" in result.stdout, result.stdout
        assert opens() == ALLOWED
    finally:
        subprocess.run([*runc, "delete", "-f", container_id], capture_output=True, timeout=TIMEOUT)


def test_a_podman_container_started_through_hooks_d_is_given_back_its_gpu(host: FakeHost, tmp_path: Path) -> None:
    hooks_dir = tmp_path / "hooks.d"
    installed = subprocess.run([console_script("ponytail"), "install-hook", "--dir", str(hooks_dir), "--config", str(host.write_config())],
                               capture_output=True, text=True, timeout=TIMEOUT)
    assert installed.returncode == 0, installed.stderr
    podman = Podman(hooks_dir)
    name = unique("guard")
    rootfs = make_rootfs(tmp_path / "rootfs")
    os.mknod(rootfs / DENIED.lstrip("/"), 0o666 | stat.S_IFCHR, os.makedev(195, 200))
    try:
        started = subprocess.run(podman.base + ["run", "-d", "--name", name, "--network=none", "--ulimit", "nofile=1024:1024",
                                                "--ulimit", "nproc=4096:4096", "--annotation", "com.example.gpu=true",
                                                "-e", "NVIDIA_VISIBLE_DEVICES=0", "--rootfs", str(rootfs), "/bin/busybox", "sleep", "600"],
                                 capture_output=True, text=True, timeout=TIMEOUT)
        assert started.returncode == 0, started.stderr
        container_id = started.stdout.strip()
        pid = int(subprocess.run(podman.base + ["inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True).stdout)

        def opens() -> list[str]:
            result = subprocess.run(podman.base + ["exec", name, *CHECK], capture_output=True, text=True, timeout=TIMEOUT)
            return [line for line in result.stdout.splitlines() if line.startswith("open ")]

        assert opens() == ALLOWED
        record = json.loads((records(host) / f"{container_id}.json").read_text())
        assert record["pid"] == pid and record["started_by"] == "hook"
        reload_v1(pid)
        assert opens() == LOST
        result = guard(host, "--once")
        assert result.returncode == 1 and f"container {container_id}" in result.stdout and "given back" in result.stdout, result.stdout
        assert opens() == ALLOWED
    finally:
        subprocess.run(podman.base + ["rm", "-f", "-t", "0", name], capture_output=True, timeout=TIMEOUT)
        podman.close()


def test_a_container_ponytail_did_not_start_is_never_touched(host: FakeHost, v1: Running, tmp_path: Path) -> None:
    """Another container with the same GPU (its nodes and rules from config.json, no ponytail hook): not
    recorded, so when both lose the GPU only ponytail's gets it back."""
    other = Running("runc", host, tmp_path / "other", cdi=generate(host, tmp_path / "spec.json"), hooks=False)
    try:
        assert other.opens_without_libcuda() == ALLOWED and not (records(host) / f"{other.id}.json").exists()
        reload_v1(v1.pid)
        reload_v1(other.pid)
        before = (devices_dir(other.pid) / "devices.list").read_text()
        result = guard(host, "--once")
        assert result.returncode == 1 and other.id not in result.stdout, result.stdout
        assert v1.opens() == ALLOWED and other.opens_without_libcuda() == LOST
        assert (devices_dir(other.pid) / "devices.list").read_text() == before
    finally:
        other.stop()


def test_the_systemd_unit_runs_a_guard_command_line_ponytail_accepts(host: FakeHost, v1: Running) -> None:
    unit = (Path(__file__).resolve().parents[2] / "packaging/systemd/ponytail-guard.service").read_text()
    [exec_start] = [line.split("=", 1)[1].split() for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start[:2] == ["/usr/local/ponytail/ponytail", "guard"] and "Restart=always" in unit
    result = subprocess.run([console_script("ponytail"), *exec_start[1:], "--config", str(host.base / "config.toml"), "--once"],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0 and "1 container(s) watched" in result.stdout, result.stdout + result.stderr


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not _holds(condition):
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)


def _holds(condition) -> bool:
    try:
        return bool(condition())
    except FileNotFoundError:  # the log, before the guard wrote its first line
        return False


# --- a pure cgroup v2 view -------------------------------------------------------------------

def reload_v2(pid: int) -> tuple[int, bytes]:
    """What systemd's reload leaves on cgroup v2: the container's program replaced by the engine's
    own, without the GPU (ponytail's allow block taken off the front)."""
    fd = os.open(unified_dir(pid), os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags, ids = bpf.query_device_programs(fd)
        assert len(ids) == 1, ids
        old = bpf.program_fd(ids[0])
        info = bpf.program_info(old)
        block = allow_block(GPU0)
        assert info.instructions.startswith(block)
        engines = info.instructions[len(block):]
        new = bpf.load_device_program(engines, "systemd_like")
        bpf.attach_device_program(fd, new, flags | bpf.BPF_F_REPLACE, old)
        os.close(old)
        os.close(new)
        return ids[0], engines
    finally:
        os.close(fd)


def program_ids(pid: int) -> tuple[int, ...]:
    fd = os.open(unified_dir(pid), os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bpf.query_device_programs(fd)[1]
    finally:
        os.close(fd)


def test_pure_cgroup_v2_report_only_then_once_gives_back_exactly_the_gpu(host: FakeHost, tmp_path: Path) -> None:
    container = Running("runc-v2", host, tmp_path)
    try:
        assert container.opens() == ALLOWED
        record = json.loads((records(host) / f"{container.id}.json").read_text())
        assert record["cgroup"]["v2"] == "/" + str(unified_dir(container.pid).relative_to("/sys/fs/cgroup/unified"))
        reload_v2(container.pid)
        assert container.opens() == LOST
        reloaded = program_ids(container.pid)

        report = guard(host, "--once", "--report-only")
        assert report.returncode == 1 and f"container {container.id}" in report.stdout and "has lost" in report.stdout, report.stdout
        assert program_ids(container.pid) == reloaded and container.opens() == LOST

        repaired = guard(host, "--once")
        assert repaired.returncode == 1 and "given back (only those)" in repaired.stdout, repaired.stdout + repaired.stderr
        assert container.opens() == ALLOWED
        fixed = program_ids(container.pid)
        assert fixed != reloaded and len(fixed) == 1

        again = guard(host, "--once")
        assert again.returncode == 0 and "all 4 allotted node(s) allowed" in again.stdout, again.stdout
        assert program_ids(container.pid) == fixed
    finally:
        container.stop()


# --- pinned processes, records read and removed, containers in a cgroup namespace, the bounded scan --------


@pytest.fixture
def other_cgroup():
    """A devices cgroup of nobody's container that allows no device: where a reused pid lands."""
    other = Path("/sys/fs/cgroup/devices") / unique("guard-other")
    other.mkdir()
    (other / "devices.deny").write_text("a")
    yield other
    for pid in (other / "cgroup.procs").read_text().split():
        os.kill(int(pid), signal.SIGKILL)
    _wait(lambda: not (other / "cgroup.procs").read_text().strip())
    other.rmdir()


def test_a_pid_reused_between_the_check_and_the_write_is_given_nothing(host: FakeHost, v1: Running, other_cgroup: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The window between the guard's check of the recorded process and its write, widened: the
    container's process ends there and its pid is taken by a process in another cgroup. That
    process's cgroup is given nothing; the container's line says why."""
    from ponytail.config import load_config
    from ponytail.guard import watch

    at_pid = compile_program("at_pid.c")
    real = watch.denied_devices
    reused: list[int] = []

    def widened(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = real(*args, **kwargs)
        if not reused:
            os.kill(v1.pid, signal.SIGKILL)
            v1.proc.wait(timeout=TIMEOUT)
            _wait(lambda: not Path(f"/proc/{v1.pid}").exists())
            at = subprocess.run([str(at_pid), str(v1.pid), str(other_cgroup / "cgroup.procs")], capture_output=True, text=True, timeout=TIMEOUT)
            assert at.returncode == 0, at.stderr
            reused.append(int(at.stdout))
        return found

    reload_v1(v1.pid)
    monkeypatch.setattr(watch, "denied_devices", widened)
    report = watch.guard_pass(load_config(str(host.base / "config.toml"), True), repair=True)
    assert reused == [v1.pid] and Path(f"/proc/{v1.pid}/cgroup").read_text().count(other_cgroup.name) == 1
    assert (other_cgroup / "devices.list").read_text() == ""  # nothing granted to the process that has the pid now
    [container] = report.containers
    assert container.state == "lost" and "not given back: " in container.line(), container.line()  # its cgroup gone, or the process


def _private_dir(path: Path) -> Path:
    from ponytail.apply.containerrecord import open_records_dir

    os.close(open_records_dir(str(path), create=True))
    return path


def test_a_record_cut_short_is_removed_once_said(host: FakeHost) -> None:
    host.write_config()
    directory = _private_dir(records(host))
    cut = directory / "cut-short.json"
    fd = os.open(cut, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b'{"version": 1, "id": "cut-short", "pid": 12')
    os.close(fd)
    report = guard(host, "--once", "--report-only")
    assert report.returncode == 1 and "is not JSON (cut short?): kept (report only)" in report.stdout and cut.exists(), report.stdout
    first = guard(host, "--once")
    assert first.returncode == 1 and "is not JSON (cut short?): removed" in first.stdout and not cut.exists(), first.stdout
    again = guard(host, "--once")
    assert again.returncode == 0 and "problem" not in again.stdout, again.stdout


@pytest.fixture
def restart(host: FakeHost):
    """A container's process that has ended after its hook recorded it, and its next one under the same id."""
    from ponytail.apply.containerrecord import record_container
    from ponytail.config import load_config

    config = load_config(str(host.write_config()), True)
    ended, restarted = (subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL) for _ in range(2))
    record_container(config.records_dir, "restarted", ended.pid, "hook", [("c", 195, 2, "/dev/nvidia2")], host.driver_version)
    ended.kill()
    ended.wait()
    yield config, ended, restarted
    restarted.kill()
    restarted.wait()


def test_a_pass_never_removes_the_new_record_of_a_container_restarted_under_its_id(host: FakeHost, restart,  # type: ignore[no-untyped-def]
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The container's process ended (its record is gone's), and between the pass's reading and its
    removal the container started again under the same id (its hook wrote a new record)."""
    from ponytail.apply.containerrecord import record_container
    from ponytail.guard import watch

    config, _, restarted = restart
    real = watch._check

    def restarted_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = real(*args, **kwargs)
        record_container(config.records_dir, "restarted", restarted.pid, "hook", [("c", 195, 2, "/dev/nvidia2")], host.driver_version)
        return result

    monkeypatch.setattr(watch, "_check", restarted_meanwhile)
    report = watch.guard_pass(config, repair=True)
    assert [c.state for c in report.containers] == ["gone"] and not report.containers[0].removed
    assert json.loads((records(host) / "restarted.json").read_text())["pid"] == restarted.pid
    assert [p.name for p in records(host).iterdir()] == ["restarted.json"]


def test_a_start_s_pruning_never_removes_the_new_record_of_a_restarted_container(host: FakeHost, restart,  # type: ignore[no-untyped-def]
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ponytail.apply import containerrecord

    config, ended, restarted = restart
    real = containerrecord.process_start
    written: list[int] = []

    def restarted_meanwhile(pid: int) -> int:
        result = real(pid)
        if pid == ended.pid and not written:
            written.append(pid)
            containerrecord.record_container(config.records_dir, "restarted", restarted.pid, "hook", [], host.driver_version)
        return result

    monkeypatch.setattr(containerrecord, "process_start", restarted_meanwhile)
    fd = containerrecord.open_records_dir(config.records_dir)
    try:
        assert containerrecord.prune_records(fd) == 0 and written
    finally:
        os.close(fd)
    assert json.loads((records(host) / "restarted.json").read_text())["pid"] == restarted.pid
    assert [p.name for p in records(host).iterdir()] == ["restarted.json"]


def test_a_cdi_container_in_a_cgroup_namespace_is_recorded_as_the_host_sees_it(host: FakeHost, tmp_path: Path) -> None:
    """The CDI hook runs in the container's cgroup namespace, where its cgroup reads "/": the record holds
    the host's path, and the guard gives the GPU back. A record of a hook that could not leave that namespace
    (a rootless engine's: "/" and the namespace) is still the container's: the guard reads the host's view."""
    container = Running("runc", host, tmp_path, cdi=generate(host, tmp_path / "spec.json"), cgroupns=True)
    try:
        path = records(host) / f"{container.id}.json"
        record = json.loads(path.read_text())
        namespace = os.stat(f"/proc/{container.pid}/ns/cgroup").st_ino
        assert namespace != os.stat("/proc/self/ns/cgroup").st_ino  # the container has a cgroup namespace of its own
        assert record["cgroup"]["v1"] == "/" + str(devices_dir(container.pid).relative_to("/sys/fs/cgroup/devices")), record
        assert record["cgroup_ns"] == os.stat("/proc/self/ns/cgroup").st_ino, record
        for how in ("as the host sees it", "from inside its namespace"):
            if how == "from inside its namespace":
                record.update(cgroup={"v1": "/", "v2": "/"}, cgroup_ns=namespace)
                path.write_text(json.dumps(record))
            reload_v1(container.pid)
            assert container.opens() == LOST
            result = guard(host, "--once")
            assert result.returncode == 1 and "given back (only those)" in result.stdout, (how, result.stdout)
            assert container.opens() == ALLOWED and path.exists(), how
    finally:
        container.stop()


def test_a_container_from_nvidias_spec_with_ponytails_hook_script_is_recorded_and_given_back(host: FakeHost, tmp_path: Path) -> None:
    """The device plugin's and the DRA driver's route: a spec whose hooks are NVIDIA's (nvidia-cdi-hook
    create-symlinks, noop), served by the script install-nvidia-hook writes; the container in a cgroup
    namespace of its own."""
    link = tmp_path / "bin" / "nvidia-cdi-hook"
    installed = subprocess.run([console_script("ponytail"), "install-nvidia-hook", "--at", str(link), "--path", console_script("ponytail")],
                               capture_output=True, text=True, timeout=TIMEOUT)
    assert installed.returncode == 0, installed.stderr
    spec = generate(host, tmp_path / "spec.json")
    for edits in [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]:
        edits.pop("hooks", None)
    env = [f"PONYTAIL_CONFIG={host.write_config()}"]
    spec["containerEdits"]["hooks"] = [
        {"hookName": "createContainer", "path": str(link), "env": env,
         "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda-guard-test.so"]},
        {"hookName": "createContainer", "path": str(link), "env": env, "args": ["nvidia-cdi-hook", "noop"]},
    ]
    container = Running("runc", host, tmp_path, cdi=spec, cgroupns=True)
    try:
        record = json.loads((records(host) / f"{container.id}.json").read_text())
        assert record["started_by"] == "nvidia-cdi-hook" and record["pid"] == container.pid, record
        assert record["cgroup"]["v1"] == "/" + str(devices_dir(container.pid).relative_to("/sys/fs/cgroup/devices")), record
        given = {f"c {d['major']}:{d['minor']} rw" for d in record["devices"]}
        assert f"c 195:{host.gpu_list[0].minor} rw" in given and "c 195:255 rw" in given, given
        for rule in given:
            (devices_dir(container.pid) / "devices.deny").write_text(rule.replace(" rw", " rwm"))
        assert not given & set((devices_dir(container.pid) / "devices.list").read_text().splitlines())
        result = guard(host, "--once")
        assert result.returncode == 1 and f"container {container.id}" in result.stdout and "given back" in result.stdout, result.stdout
        assert given <= set((devices_dir(container.pid) / "devices.list").read_text().splitlines())
    finally:
        container.stop()


def test_the_stale_driver_scan_is_bounded_and_believes_no_mere_name(host: FakeHost, tmp_path: Path) -> None:
    """A container whose process maps a deleted file merely named libcuda.so.1, and 30,000 mappings of a
    file under a 3,800-character path (about 115 MB of /proc/<pid>/maps). While the driver is the one it
    was given, its maps are not read: no stale, a fast pass. Once the driver's libcuda is replaced, they
    are read, bounded, and the bound is said; the decoy is still not taken for the driver."""
    container = Running("runc", host, tmp_path, ["/usr/local/bin/mapmany", "30000"], programs=("mapmany.c",))
    try:
        _wait(lambda: Path(f"/proc/{container.pid}/root/dev/shm/ready").exists(), timeout=120)
        first = guard(host, "--once", "--json")
        status = json.loads(first.stdout)
        assert first.returncode == 0 and status["stale"] == 0 and status["bounded"] == [], first.stdout
        assert status["duration_s"] < 1.0, status["duration_s"]  # its maps not read
        assert not [finding for finding in check(host) if finding[1] == container.id]
        found = next(host.driver.rglob(f"libcuda.so.{host.driver_version}"))
        replacement = found.with_name(found.name + ".new")
        replacement.write_bytes(found.read_bytes())
        os.rename(replacement, found)
        result = guard(host, "--once", "--json", "--report-only")
        status = json.loads(result.stdout)
        [watched] = status["containers"]
        assert result.returncode == 1 and any("has been replaced" in r for r in watched["stale"]), result.stdout
        assert not any("map" in r for r in watched["stale"]), watched  # the decoy is not the driver's file
        assert status["bounded"] and "bytes of its maps read" in status["bounded"][0], status["bounded"]
        assert any("stale-driver scan bounded" in n for n in watched["notes"]), watched
        assert status["duration_s"] < 3.0, status["duration_s"]
    finally:
        container.stop()


def test_a_process_maps_to_the_container_ponytail_recorded(host: FakeHost, v1: Running) -> None:
    """What another part of ponytail (a DRA plugin) asks the records: whose container is process PID?"""
    from ponytail.apply.containerrecord import container_of

    found = container_of(str(records(host)), v1.pid)
    assert found is not None and found["id"] == v1.id and found["pid"] == v1.pid
    assert container_of(str(records(host)), os.getpid()) is None


def test_the_soak_s_guard_under_pid_reuse(tmp_path: Path) -> None:
    """bench/soak_guard.py, shortened: containers' pids taken by processes in nobody's cgroup while the
    guard runs (half the rounds inside the window between its check and its write)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from soak_guard import guard_soak

    report = guard_soak(tmp_path, console_script("ponytail"), rounds=6)
    assert report.clean and report.in_window > 0 and report.repaired > 0, report.summary() + "\n" + "\n".join(
        report.wrong_gpus + report.silent_failures + report.stuck)
