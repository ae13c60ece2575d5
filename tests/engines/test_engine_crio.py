"""CRI-O 1.36 (from $ENGINES_DIR, `make test-engines`; conmon from Debian) with ponytail: the runtime
handler `ponytail` from the drop-in `ponytail configure --runtime crio` writes, the prestart hook
from hooks.d (`ponytail install-hook`), and CDI (ponytail's spec; CRI-O resolves the CDIDevices
field and `cdi.k8s.io/*` annotations itself and passes the annotations on to the runtime too:
each node and library must be in the container once). A private CRI-O (tests/support/crio.py)
runs pods through CRI as kubelet does. The ponytail config is strict ([request]
accept_env_when_unprivileged = false): GPUs come from the device plugin's list only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from test_engine_containerd import CUDACHECK_GPU1, DEVICES, EXPECTED_GPU1, Node
from test_engine_containerd2 import MOUNTINFO, mounted

from support.cdi_support import generate
from support.containerd_cri import Pods, gpu_node_files, make_state_dir, oci_archive, remove_state_dir
from support.crio import CONMON, Crio
from support.engines import EXPECTED_GPU0, TIMEOUT, console_script, current_engines

pytestmark = pytest.mark.current_engines


def engines() -> Path:
    found = current_engines()
    if found is None:
        pytest.skip("current engines (CRI-O 1.36, crictl, runc 1.5): run make test-engines (ENGINES_DIR)")
    if not (found / "crio").is_file() or not Path(CONMON).is_file():
        pytest.skip(f"CRI-O needs {found}/crio and {CONMON} (scripts/install-system-packages.sh installs conmon)")
    return found


def configure(config: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([console_script("ponytail"), "configure", "--runtime", "crio", "--config-file", str(config),
                           "--path", console_script("ponytail-runtime"), "--state-dir", str(state / "ponytail"), *args],
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    engines_dir = engines()
    base = tmp_path_factory.mktemp("crio")
    host, ponytail_config, rootfs, image = gpu_node_files(base)
    state = make_state_dir()
    crio = Crio(state, engines_dir, pause_image=image)
    pods = None
    try:
        crio.load_image(oci_archive(rootfs, image, ["/bin/sleep", "100000"], base / "image.tar"))
        configured = configure(crio.config, state)
        assert configured.returncode == 0, configured.stderr
        hook = subprocess.run([console_script("ponytail"), "install-hook", "--dir", str(state / "hooks.d"), "--config", str(ponytail_config)],
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert hook.returncode == 0, hook.stderr
        generate(host, state / "cdi" / "ponytail.yaml", "-config", str(ponytail_config))
        crio.start(ponytail_config.read_text())
        pods = Pods(crio, image, base / "stubs")  # type: ignore[arg-type]  # the same CRI as containerd's
        yield Node(crio, pods, host, crio.config)  # type: ignore[arg-type]  # CRI-O as the node's daemon
    finally:
        if pods is not None:
            pods.close()
        crio.stop()
        remove_state_dir(state)


def test_configure_crio_config_shows_it_uninstall_takes_it_out() -> None:
    """configure -> `crio config` (CRI-O's own reading of crio.conf and crio.conf.d) has the handler and
    the default -> uninstall -> CRI-O's configuration exactly as before, nothing left in crio.conf.d."""
    state = make_state_dir()
    try:
        crio = Crio(state, engines())
        before = crio.crio("config")
        assert before.returncode == 0, before.stderr
        configured = configure(crio.config, state, "--set-as-default")
        assert configured.returncode == 0, configured.stderr
        shown = crio.crio("config")
        assert shown.returncode == 0, shown.stderr
        runtime = tomllib.loads(shown.stdout)["crio"]["runtime"]
        assert runtime["default_runtime"] == "ponytail"
        assert runtime["runtimes"]["ponytail"]["runtime_path"] == console_script("ponytail-runtime")
        removed = configure(crio.config, state, "--uninstall")
        assert removed.returncode == 0, removed.stderr
        assert crio.crio("config").stdout == before.stdout
        assert list(crio.drop_ins.iterdir()) == []
    finally:
        remove_state_dir(state)


def test_crio_runs_with_the_drop_in(node: Node) -> None:
    assert node.pods.version().startswith("cri-o 1.36"), node.pods.version()
    info = node.daemon.crictl("info")
    assert info.returncode == 0, info.stderr


def test_ponytail_handler_gives_the_device_plugins_gpu(node: Node) -> None:
    container_id, code, lines = node.pods.run(CUDACHECK_GPU1, env={"NVIDIA_VISIBLE_DEVICES": DEVICES},
                                              mounts=[("/dev/null", f"{DEVICES}/1")], runtime_handler="ponytail")
    assert code == 0 and lines == EXPECTED_GPU1, (lines, node.log()[-2000:])
    assert f"container={container_id}" in node.log()


def test_hooks_d_hook_under_the_default_runtime(node: Node) -> None:
    """runc as CRI-O's default; the hook from hooks.d, for the container with the GPU annotation."""
    container_id, code, lines = node.pods.run(CUDACHECK_GPU1, env={"NVIDIA_VISIBLE_DEVICES": DEVICES}, mounts=[("/dev/null", f"{DEVICES}/1")],
                                              annotations={"com.example.gpu": "true"})
    assert code == 0 and lines == EXPECTED_GPU1, (lines, node.log()[-2000:])
    logged = [line for line in node.log().splitlines() if f"container={container_id}" in line]
    assert any("injected into" in line for line in logged) and not any("ponytail-runtime" in line for line in logged), logged


@pytest.mark.parametrize("how", ["CDI annotation", "CRI CDIDevices"])
def test_cdi_through_the_ponytail_handler_injects_each_node_and_library_once(node: Node, how: str) -> None:
    request: dict = ({"annotations": {"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=0"}} if how == "CDI annotation"
                     else {"cdi_devices": ("nvidia.com/gpu=0",)})
    container_id, code, lines = node.pods.run(MOUNTINFO, runtime_handler="ponytail", **request)
    assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, node.log()[-2000:])
    counts = mounted(lines)
    assert any("libcuda.so" in target for target in counts), lines
    assert all(n == 1 for n in counts.values()) and "/dev/nvidia2" not in counts, counts
    logged = [line for line in node.log().splitlines() if f"container={container_id}" in line]
    assert not any(" ponytail-runtime: GPU container" in line for line in logged), logged
