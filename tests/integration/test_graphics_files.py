"""What a GPU container needs beyond compute: the selected GPUs' /dev/dri nodes (found through
sysfs) and their by-path links, the graphics and display files (Vulkan ICD of this machine,
EGL platforms, Xorg's driver and GLX module, xorg.conf.d), NVIDIA's recent libraries; where
the driver keeps things (firmware under /lib/firmware/updates and firmware_class.path, the
host's MPS pipe directory, Docker Swarm's GPU resources); and the driver's own file list.
Each: injected when asked, absent when not, refused in one line when asked but broken."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.commands import PONYTAIL, shell
from support.engines import hook_entry, oci_bundle, run_bundle, unique
from support.fakehost import DRM_MAJOR, FakeHost, gpus
from support.harness import bundle_for, in_private_mount_ns, run_ponytail, state_for

V = "550.54.15"
MACHINE = os.uname().machine
GRAPHICS = "graphics,display,compute,utility"


def debug(host: FakeHost, *args: str, config: Path | None = None, stdin: str = "") -> tuple[int, str, str]:
    result = run_ponytail(["-config", str(config or host.write_config()), "-debug", *args], stdin=stdin)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def listed(host: FakeHost, *args: str) -> list[str]:
    result = run_ponytail(["list", "-config", str(host.write_config()), *args])
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().splitlines()


# -- item 2: DRI nodes -------------------------------------------------------------------

@pytest.fixture
def dri_host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host", gpu_list=gpus(2), dri=True, graphics_files=True)


def test_graphics_brings_the_selected_gpus_dri_nodes_and_by_path_links(dri_host: FakeHost) -> None:
    status, out, err = debug(dri_host, "-device", "1", "-capabilities", GRAPHICS)
    assert status == 0, err
    bus = dri_host.gpu_list[1].bus_id
    assert f"{dri_host.dev}/dri/card2 -> /dev/dri/card2  (c 226:2, graphics/display: DRI node of GPU 1 {bus}" in out
    assert f"{dri_host.dev}/dri/renderD129 -> /dev/dri/renderD129  (c 226:129," in out
    assert f"link  /dev/dri/by-path/pci-{bus}-card -> ../card2" in out
    assert f"link  /dev/dri/by-path/pci-{bus}-render -> ../renderD129" in out
    assert "c 226:2 rw" in out and "c 226:129 rw" in out  # the device rules (v1 and v2) cover them
    # never the other GPU's nodes, nor another vendor's card0, nor all of /dev/dri
    assert "card1" not in out and "renderD128" not in out and "card0" not in out
    paths = listed(dri_host, "-device", "1", "-capabilities", "display")
    assert f"{dri_host.dev}/dri/card2" in paths and f"{dri_host.dev}/dri/renderD129" in paths


def test_no_dri_nodes_without_graphics_or_display(dri_host: FakeHost) -> None:
    status, out, err = debug(dri_host, "-device", "all", "-capabilities", "compute,utility,video")
    assert status == 0, err
    assert "/dev/dri" not in out and "226:" not in out


def test_a_dri_node_sysfs_names_but_dev_lacks_is_refused_in_one_line(dri_host: FakeHost, tmp_path: Path) -> None:
    (dri_host.dev / "dri/renderD128").unlink()
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    result = run_ponytail(["-config", str(dri_host.write_config()), "-root", str(rootfs), "-device", "0", "-capabilities", "graphics"])
    err = result.stderr.decode()
    assert result.returncode == 1
    assert len(err.strip().splitlines()) == 1, err
    assert f"graphics: DRI node of GPU 0 {dri_host.gpu_list[0].bus_id}" in err and f"{dri_host.dev}/dri/renderD128 does not exist" in err


def test_a_dri_node_of_the_wrong_device_is_refused(dri_host: FakeHost) -> None:
    (dri_host.dev / "dri/card1").unlink()
    os.mknod(dri_host.dev / "dri/card1", 0o666 | 0o020000, os.makedev(DRM_MAJOR, 7))
    status, out, _ = debug(dri_host, "-device", "0", "-capabilities", "graphics")
    assert f"{dri_host.dev}/dri/card1 is c 226:7, expected c 226:1" in out
    # a sysfs entry that is not a DRM device is not believed either
    (dri_host.sys / "bus/pci/devices" / dri_host.gpu_list[0].bus_id / "drm/card1/dev").write_text("195:1\n")
    status, out, _ = debug(dri_host, "-device", "0", "-capabilities", "graphics")
    assert "not a DRM device (major 226)" in out


def test_a_gpu_without_drm_device_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))  # nvidia-drm not loaded: no drm in sysfs
    status, out, err = debug(host, "-device", "0", "-capabilities", "graphics,compute")
    assert status == 0, err
    assert "has no DRM device in sysfs (nvidia-drm not loaded?" in out and "/dev/dri/" not in out.replace("no /dev/dri nodes", "")


def test_runc_container_opens_its_dri_nodes_and_nothing_else(dri_host: FakeHost, tmp_path: Path) -> None:
    bus = dri_host.gpu_list[0].bus_id
    script = (
        "/usr/local/bin/cudacheck /dev/dri/card1 /dev/dri/renderD128 /dev/dri/card2 /dev/dri/card0; "
        f"readlink /dev/dri/by-path/pci-{bus}-card; readlink /dev/dri/by-path/pci-{bus}-render; ls /dev/dri"
    )
    hooks = {"prestart": [hook_entry(dri_host.write_config())]}
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics,compute"]
    bundle = oci_bundle(tmp_path, ["/bin/sh", "-c", script], env=env, hooks=hooks)
    container_id = unique()
    result = run_bundle("runc", bundle, container_id)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:5] == [
        "cuDriverGetVersion 12040",
        "open /dev/dri/card1 ENXIO",  # visible and allowed by the device cgroup: no driver behind it here
        "open /dev/dri/renderD128 ENXIO",
        "open /dev/dri/card2 ENOENT",  # the other GPU's
        "open /dev/dri/card0 ENOENT",  # another vendor's
    ], result.stdout
    assert lines[5:7] == ["../card1", "../renderD128"]
    assert " ".join(lines[7:]).split() == ["by-path", "card1", "renderD128"]
    allowed = next(line for line in dri_host.log.read_text().splitlines() if f"container={container_id} allowed" in line)
    assert "c 226:1 rw, c 226:128 rw" in allowed


# -- item 2: graphics and display files, recent libraries -----------------------------------

def test_graphics_and_display_files_and_recent_libraries(dri_host: FakeHost) -> None:
    status, out, err = debug(dri_host, "-device", "0", "-capabilities", GRAPHICS)
    assert status == 0, err
    for stem in ("libnvidia-tileiras", "libnvidia-nvvm70"):
        assert f"/{stem}.so.{V}  (library, compute; ro,nosuid,nodev)" in out
    for stem in ("libnvidia-egl-xcb", "libnvidia-egl-xlib", "libnvidia-egl-wayland2", "libnvidia-vulkan-producer", "libnvidia-cbl"):
        assert f"/{stem}.so.{V}  (library, graphics; ro,nosuid,nodev)" in out
    assert f"-> /usr/share/vulkan/icd.d/nvidia_icd.{MACHINE}.json  (file, graphics; ro,nosuid,nodev,noexec)" in out
    assert "-> /usr/share/vulkan/implicit_layer.d/nvidia_layers.json  (file, graphics;" in out
    assert "-> /usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json  (file, graphics;" in out
    assert "-> /usr/share/X11/xorg.conf.d/10-nvidia.conf  (file, display; ro,nosuid,nodev,noexec)" in out
    # Xorg loads these: mounted like libraries (no noexec), and kept out of the linker cache
    assert "-> /usr/lib/xorg/modules/drivers/nvidia_drv.so  (library, display; ro,nosuid,nodev)" in out
    assert f"-> /usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{V}  (library, display; ro,nosuid,nodev)" in out
    assert "/usr/lib/xorg" not in out.split("linker cache:")[1]


def test_display_files_only_with_display(dri_host: FakeHost) -> None:
    glx = dri_host.driver / "usr/lib/xorg/modules/extensions"
    (glx / "libglxserver_nvidia.so.535.104.05").write_bytes((glx / f"libglxserver_nvidia.so.{V}").read_bytes())
    paths = listed(dri_host, "-device", "0", "-capabilities", "graphics")
    text = "\n".join(paths)
    assert f"nvidia_icd.{MACHINE}.json" in text and "libnvidia-cbl" in text
    assert "xorg" not in text.lower() and "libnvidia-tileiras" not in text
    text = "\n".join(listed(dri_host, "-device", "0", "-capabilities", "display"))
    assert f"libglxserver_nvidia.so.{V}" in text and "nvidia_drv.so" in text
    assert "535.104.05" not in text  # the GLX module of another driver version is left alone


def test_injected_graphics_files_are_read_only_in_the_rootfs(dri_host: FakeHost, tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "dev").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    icd = f"/usr/share/vulkan/icd.d/nvidia_icd.{MACHINE}.json"
    result = in_private_mount_ns(
        f"""
        {shell(PONYTAIL)} -config {dri_host.write_config()} -root {rootfs} -device 0 -capabilities graphics,display
        findmnt -n -o OPTIONS {rootfs}{icd}
        findmnt -n -o OPTIONS {rootfs}/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{V}
        readlink {rootfs}/dev/dri/by-path/pci-{dri_host.gpu_list[0].bus_id}-render
        """
    )
    assert result.returncode == 0, result.stderr
    icd_options, glx_options, link = result.stdout.splitlines()
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(icd_options.split(","))
    assert {"ro", "nosuid", "nodev"} <= set(glx_options.split(",")) and "noexec" not in glx_options.split(",")
    assert link == "../renderD128"


# -- item 4: where the driver keeps things ---------------------------------------------------

@pytest.mark.parametrize("where", [f"/lib/firmware/updates/{os.uname().release}", "/lib/firmware/updates", "/opt/fw"])
def test_firmware_where_the_kernel_looks_for_it(tmp_path: Path, where: str) -> None:
    custom = where if where == "/opt/fw" else ""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), firmware_dir=where, firmware_class_path=custom)
    paths = listed(host, "-device", "0")
    assert f"{host.driver}{where}/nvidia/{V}/gsp_ga10x.bin" in paths
    other = host.driver / where.lstrip("/") / "nvidia/535.104.05"
    other.mkdir(parents=True)
    (other / "gsp_tu10x.bin").write_bytes(b"GSP")  # another driver's firmware: never
    assert [p for p in listed(host, "-device", "0") if p.endswith(".bin")] == [f"{host.driver}{where}/nvidia/{V}/gsp_ga10x.bin"]
    (host.driver / "lib/firmware/nvidia/535.104.05").mkdir(parents=True)  # only an old driver's at the usual place
    result = run_ponytail(["check", "-config", str(host.write_config()), "--engine-root", str(host.base), "--json"])
    firmware = [f for f in json.loads(result.stdout)["findings"] if f["subject"] == "firmware"]
    assert firmware == [{"area": "host", "subject": "firmware", "level": "ok", "message": f"{host.driver}{where}/nvidia/{V}"}]


def test_firmware_class_path_that_is_not_plain_is_ignored(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), firmware_dir="/opt/fw/../fw", firmware_class_path="/opt/fw/../fw")
    assert not any(p.endswith(".bin") for p in listed(host, "-device", "0"))


def test_mps_pipe_directory_is_the_hosts_setting_never_the_containers(tmp_path: Path, sleeper) -> None:  # type: ignore[no-untyped-def]
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), daemons=True)
    (host.ipc / "var/mps").mkdir(parents=True)
    (host.ipc / "etc").mkdir(parents=True)
    config = host.write_config()
    default = listed(host, "-device", "0")
    assert f"{host.ipc}/tmp/nvidia-mps" in default
    config.write_text(config.read_text().replace("[host]\n", '[host]\nmps_pipe_directory = "/var/mps"\n'))
    result = run_ponytail(["list", "-config", str(config), "-device", "0"])
    paths = result.stdout.decode().splitlines()
    assert f"{host.ipc}/var/mps" in paths and f"{host.ipc}/tmp/nvidia-mps" not in paths
    # a container naming a host directory as its pipe directory gets nothing from it
    rootfs = tmp_path / "bundle/rootfs"
    rootfs.mkdir(parents=True)
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=0", "CUDA_MPS_PIPE_DIRECTORY=/etc"])
    status, out, err = debug(host, config=config, stdin=state_for(bundle, sleeper.pid))
    assert status == 0, err
    assert f"{host.ipc}/var/mps -> /var/mps" in out and "-> /etc " not in out and f"{host.ipc}/etc" not in out
    assert "warning: the container's CUDA_MPS_PIPE_DIRECTORY='/etc' is not the host's MPS pipe directory /var/mps" in out


def test_mps_pipe_directory_that_is_not_absolute_is_refused(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    config = host.write_config()
    config.write_text(config.read_text().replace("[host]\n", '[host]\nmps_pipe_directory = "/var/../etc/mps"\n'))
    result = run_ponytail(["list", "-config", str(config)])
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.strip().splitlines()) == 1
    assert "'host.mps_pipe_directory' must be a plain absolute path" in err and "'/var/../etc/mps'" in err


def swarm_config(host: FakeHost, *names: str, extra: str = "") -> Path:
    config = host.write_config()
    listed_names = ", ".join(f'"{n}"' for n in names)
    config.write_text(config.read_text() + f"[request]\nswarm_resource = [{listed_names}]\n{extra}")
    return config


def test_docker_swarm_gpu_resources_select_the_gpus(tmp_path: Path, sleeper) -> None:  # type: ignore[no-untyped-def]
    host = FakeHost(tmp_path / "host", gpu_list=gpus(3))
    config = swarm_config(host, "DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_NVIDIA-GPU")
    rootfs = tmp_path / "bundle/rootfs"
    rootfs.mkdir(parents=True)
    uuid1, uuid2 = host.gpu_list[1].uuid, host.gpu_list[2].uuid

    def run(env: list[str]) -> tuple[int, str, str]:
        bundle = bundle_for(tmp_path, rootfs, env=env)
        return debug(host, config=config, stdin=state_for(bundle, sleeper.pid))

    # the named variables win over NVIDIA_VISIBLE_DEVICES=all, which CUDA images set
    status, out, err = run(["NVIDIA_VISIBLE_DEVICES=all", f"DOCKER_RESOURCE_GPU={uuid1}"])
    assert status == 0, err
    assert "-> /dev/nvidia1 " in out and "-> /dev/nvidia0 " not in out and "-> /dev/nvidia2 " not in out
    assert "(from DOCKER_RESOURCE_GPU)" in out
    status, out, err = run([f"DOCKER_RESOURCE_NVIDIA-GPU={uuid1},{uuid2}"])
    assert status == 0, err
    assert "-> /dev/nvidia1 " in out and "-> /dev/nvidia2 " in out and "-> /dev/nvidia0 " not in out
    status, out, err = run(["NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_CPU=3"])  # not a named variable
    assert "-> /dev/nvidia" not in out
    bundle = bundle_for(tmp_path, rootfs, env=["DOCKER_RESOURCE_GPU=GPU-nope"])
    result = run_ponytail(["-config", str(config)], stdin=state_for(bundle, sleeper.pid))
    err = result.stderr.decode()
    assert result.returncode == 2 and "unknown GPU 'GPU-nope' in DOCKER_RESOURCE_GPU='GPU-nope'" in err, err


@pytest.mark.parametrize("image_var", ["DOCKER_RESOURCE_GPU=all", "DOCKER_RESOURCE_NVIDIA-GPU=0,1,2", "DOCKER_RESOURCE_MY_GPU=2,0"])
def test_an_images_swarm_variable_never_widens_the_gpus_the_engine_gave(image_var: str, tmp_path: Path, sleeper) -> None:  # type: ignore[no-untyped-def]
    """docker run --gpus device=0 sets NVIDIA_VISIBLE_DEVICES=0 in the process env, which also
    holds the image's ENV: an image's DOCKER_RESOURCE_* must not bring more GPUs, read or not,
    in the hook or in the runtime shim's device rules."""
    from ponytail.config import load_config
    from ponytail.container.oci import read_spec
    from ponytail.hooks.shim.bundle import device_rules

    host = FakeHost(tmp_path / "host", gpu_list=gpus(3))
    rootfs = tmp_path / "bundle/rootfs"
    rootfs.mkdir(parents=True)
    env = ["NVIDIA_VISIBLE_DEVICES=0", image_var]
    name = image_var.partition("=")[0]
    for config in (host.write_config(), swarm_config(host, name)):  # off by default; named: it may only narrow
        bundle = bundle_for(tmp_path, rootfs, env=env)
        status, out, err = debug(host, config=config, stdin=state_for(bundle, sleeper.pid))
        assert status == 0, err
        assert "-> /dev/nvidia0 " in out and "-> /dev/nvidia1 " not in out and "-> /dev/nvidia2 " not in out, out
        assert "(from NVIDIA_VISIBLE_DEVICES)" in out
        spec = read_spec({"process": {"env": env}}, "config.json")
        rules, note = device_rules(load_config(str(config), True), spec)
        assert note == "" and (195, 1) not in rules and (195, 2) not in rules and (195, 0) in rules, rules


def test_swarm_variables_are_read_only_when_configured(tmp_path: Path, sleeper) -> None:  # type: ignore[no-untyped-def]
    host = FakeHost(tmp_path / "host", gpu_list=gpus(3))
    rootfs = tmp_path / "bundle/rootfs"
    rootfs.mkdir(parents=True)
    uuid1 = host.gpu_list[1].uuid
    bundle = bundle_for(tmp_path, rootfs, env=[f"DOCKER_RESOURCE_GPU={uuid1}", "NVIDIA_VISIBLE_DEVICES=2"])
    status, out, err = debug(host, stdin=state_for(bundle, sleeper.pid))  # not configured: ignored
    assert status == 0 and "-> /dev/nvidia2 " in out and "-> /dev/nvidia1 " not in out, out + err
    # configured, the two name different GPUs: neither widens the other, the start stops with one line
    config = swarm_config(host, "DOCKER_RESOURCE_GPU")
    result = run_ponytail(["-config", str(config)], stdin=state_for(bundle, sleeper.pid))
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert f"DOCKER_RESOURCE_GPU='{uuid1}' and NVIDIA_VISIBLE_DEVICES='2' name different GPUs" in err
    # a name that is no variable name is a config error
    bad = swarm_config(host, "1GPU")
    result = run_ponytail(["list", "-config", str(bad)])
    assert result.returncode == 2 and "'request.swarm_resource' entry '1GPU' is not an environment variable name" in result.stderr.decode()


def test_docker_swarm_resources_follow_the_strict_env_policy(tmp_path: Path, sleeper) -> None:  # type: ignore[no-untyped-def]
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    config = swarm_config(host, "DOCKER_RESOURCE_GPU", extra="accept_env_when_unprivileged = false\n")
    rootfs = tmp_path / "bundle/rootfs"
    rootfs.mkdir(parents=True)
    bundle = bundle_for(tmp_path, rootfs, env=[f"DOCKER_RESOURCE_GPU={host.gpu_list[0].uuid}"])
    status, out, err = debug(host, config=config, stdin=state_for(bundle, sleeper.pid))
    assert "-> /dev/nvidia0 " not in out
    assert "DOCKER_RESOURCE_GPU=" in out + err and "refused: unprivileged container" in out + err


# -- item 5: the driver's own file list -------------------------------------------------------

FILELIST = json.dumps({
    "files": [
        {"path": f"/usr/lib/x86_64-linux-gnu/libnvidia-future.so.{V}", "type": "graphics"},
        {"path": "/usr/share/nvidia/future-profile.json", "capabilities": ["compute"]},
        {"path": f"/usr/lib/x86_64-linux-gnu/libcuda.so.{V}", "capability": "compute"},  # the tables know it
        {"path": "/usr/share/nvidia/absent.json", "type": "compute"},
        {"path": "/usr/bin/nvidia-future-tool", "type": "utility"},
        {"path": "../../etc/shadow", "type": "compute"},
        {"path": "/usr/share/nvidia/*", "type": "compute"},
        {"path": "/usr/share/doc/nvidia/README", "type": "documentation"},
        "a bare string",
        7,
    ]
})


@pytest.fixture
def listed_host(tmp_path: Path) -> FakeHost:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), filelist=FILELIST)
    from support.fakehost import LIB_DIR, compile_library

    built = compile_library("fake_plain.c", "libnvidia-future.so.1", f"libnvidia-future.so.{V}", V)
    (host.driver / LIB_DIR.lstrip("/") / f"libnvidia-future.so.{V}").write_bytes(built.read_bytes())
    (host.driver / "usr/share/nvidia/future-profile.json").write_text("{}\n")
    (host.driver / "usr/bin/nvidia-future-tool").write_bytes((host.driver / "usr/bin/nvidia-smi").read_bytes())
    return host


def test_files_the_driver_lists_and_the_tables_miss_are_injected_for_their_capability(listed_host: FakeHost) -> None:
    status, out, err = debug(listed_host, "-device", "0", "-capabilities", "graphics,compute,utility")
    assert status == 0, err
    reason = "from the driver's file list /usr/share/nvidia/files.d/sandboxutils-filelist.json"
    assert f"-> /usr/lib/x86_64-linux-gnu/libnvidia-future.so.{V}  (library, graphics, {reason}" in out
    assert f"link  /usr/lib/x86_64-linux-gnu/libnvidia-future.so.1 -> libnvidia-future.so.{V}" in out
    assert f"-> /usr/share/nvidia/future-profile.json  (file, compute, {reason}" in out
    assert f"-> /usr/bin/nvidia-future-tool  (binary, utility, {reason}, in /usr/bin; ro,nosuid,nodev)" in out
    assert "'../../etc/shadow' is not a plain absolute path" in out and "'/usr/share/nvidia/*' is not a plain" in out
    assert "absent.json" not in out.split("libraries, binaries and driver files:")[1]
    assert out.count(f"/libcuda.so.{V}  (library") == 1  # found by the tables once, not again


def test_listed_files_only_for_the_requested_capabilities(listed_host: FakeHost) -> None:
    text = "\n".join(listed(listed_host, "-device", "0", "-capabilities", "utility"))
    assert "nvidia-future-tool" in text and "future-profile" not in text and "libnvidia-future" not in text
    text = "\n".join(listed(listed_host, "-device", "0", "-capabilities", "compute"))
    assert "future-profile.json" in text and "libnvidia-future" not in text and "nvidia-future-tool" not in text


def test_check_reports_what_the_tables_miss(listed_host: FakeHost) -> None:
    result = run_ponytail(["check", "-config", str(listed_host.write_config()), "--engine-root", str(listed_host.base), "--json"])
    findings = [f for f in json.loads(result.stdout)["findings"] if f["subject"] == "driver file list"]
    missing = next(f for f in findings if "not in ponytail's capability tables" in f["message"])
    assert missing["level"] == "warning"
    assert f"libnvidia-future.so.{V} (graphics)" in missing["message"] and "future-profile.json (compute)" in missing["message"]
    assert "libcuda" not in missing["message"]
    assert any("../../etc/shadow" in f["message"] for f in findings)


@pytest.mark.parametrize("content", ["not json {", '{"files": 3}', "[" * 5000 + "]" * 5000, "\xff"])
def test_a_broken_file_list_changes_nothing(tmp_path: Path, content: str) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), filelist=content)
    plain = FakeHost(tmp_path / "plain", gpu_list=gpus(1))
    status, out, err = debug(host, "-device", "0")
    assert status == 0, err
    assert "sandboxutils-filelist.json" in out  # said in the dry run, as a skipped entry
    ours = [line.replace(str(host.base), "") for line in listed(host, "-device", "0")]
    assert ours == [line.replace(str(plain.base), "") for line in listed(plain, "-device", "0")]


def test_cdi_devices_carry_their_gpus_dri_nodes(dri_host: FakeHost, tmp_path: Path) -> None:
    from support.cdi_support import generate

    spec = generate(dri_host, tmp_path / "nvidia.json")
    nodes = {d["name"]: [(n["path"], n["major"], n["minor"]) for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert ("/dev/dri/card1", 226, 1) in nodes["0"] and ("/dev/dri/renderD128", 226, 128) in nodes["0"]
    assert not any("card2" in path or "renderD129" in path for path, _, _ in nodes["0"])
    assert ("/dev/dri/renderD129", 226, 129) in nodes["1"]
    spec = generate(dri_host, tmp_path / "compute.json", "--capabilities", "compute,utility")
    assert "/dev/dri" not in json.dumps(spec)


def test_swarm_resources_make_a_gpu_container_for_the_runtime_shim() -> None:
    from ponytail.container.gpu_markers import asks_for_gpus

    named = ("DOCKER_RESOURCE_NVIDIA-GPU", "DOCKER_RESOURCE_GPU")
    assert asks_for_gpus({"DOCKER_RESOURCE_NVIDIA-GPU": "GPU-1"}, {}, named)
    assert not asks_for_gpus({"DOCKER_RESOURCE_NVIDIA-GPU": "GPU-1"}, {})  # not configured: not read
    assert not asks_for_gpus({"DOCKER_RESOURCE_GPU": ""}, {}, named)  # Swarm gave no GPU: not NVIDIA_VISIBLE_DEVICES=all
    assert not asks_for_gpus({"DOCKER_RESOURCE_GPU": "", "NVIDIA_VISIBLE_DEVICES": "all"}, {}, named)
    assert not asks_for_gpus({"DOCKER_RESOURCE_FPGA": "1"}, {}, named)
