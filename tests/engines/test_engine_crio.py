"""What ponytail writes for CRI-O, checked against CRI-O's documented configuration format (support.crio): no
package registry this project reaches has CRI-O, so no test starts one (the README's compatibility table says
so). `ponytail configure --runtime crio` adds the runtime handler `ponytail` in a drop-in of crio.conf.d, which
CRI-O merges over crio.conf; uninstall gives the configuration back byte for byte; `ponytail install-hook` writes
a hooks.d file (containers/common's format, version 1.0.0) into CRI-O's hooks_dir; on a spec as CRI-O writes
it, the hook reads the pod's namespace from CRI-O's own key."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.containerd_cri import make_state_dir, remove_state_dir
from support.crio import CrioFiles
from support.engines import TIMEOUT, console_script, oci_bundle
from support.fakehost import FakeHost
from support.harness import run_ponytail, state_for


def configure(config: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([console_script("ponytail"), "configure", "--runtime", "crio", "--config-file", str(config),
                           "--path", console_script("ponytail-runtime"), "--state-dir", str(state / "ponytail"), *args],
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture
def crio() -> Iterator[CrioFiles]:
    state = make_state_dir()
    try:
        yield CrioFiles(state)
    finally:
        remove_state_dir(state)


@pytest.mark.parametrize("default", [False, True], ids=["handler", "handler and default"])
def test_configure_adds_a_drop_in_crio_merges_and_uninstall_takes_it_out(crio: CrioFiles, default: bool) -> None:
    before, original = crio.effective(), crio.config.read_bytes()
    configured = configure(crio.config, crio.state, *(["--set-as-default"] if default else []))
    assert configured.returncode == 0, configured.stderr
    assert crio.config.read_bytes() == original  # crio.conf itself untouched: a drop-in of crio.conf.d
    runtime = crio.effective()["crio"]["runtime"]
    assert runtime["default_runtime"] == ("ponytail" if default else "runc")
    assert runtime["runtimes"]["ponytail"]["runtime_path"] == console_script("ponytail-runtime")
    assert runtime["runtimes"]["ponytail"]["runtime_type"] == "oci"
    assert runtime["runtimes"]["runc"] == before["crio"]["runtime"]["runtimes"]["runc"]  # the default runtime kept
    assert "nothing changed" in configure(crio.config, crio.state, *(["--set-as-default"] if default else [])).stdout
    removed = configure(crio.config, crio.state, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert crio.effective() == before and crio.config.read_bytes() == original
    assert list(crio.drop_ins.iterdir()) == []  # nothing left that CRI-O would read as config


def test_a_site_drop_in_sorting_after_ponytails_keeps_its_say(crio: CrioFiles) -> None:
    """CRI-O reads crio.conf.d in name order: a site's later file overrides ponytail's default, and uninstall
    leaves the site's file alone."""
    site = crio.drop_ins / "99-zz-site.conf"
    site.write_text("[crio.runtime]\ndefault_runtime = 'runc'\n")
    assert configure(crio.config, crio.state, "--set-as-default").returncode == 0
    runtime = crio.effective()["crio"]["runtime"]
    assert runtime["default_runtime"] == "runc" and "ponytail" in runtime["runtimes"]
    assert configure(crio.config, crio.state, "--uninstall").returncode == 0
    assert sorted(p.name for p in crio.drop_ins.iterdir()) == [site.name]
    assert site.read_text() == "[crio.runtime]\ndefault_runtime = 'runc'\n"


def test_the_hooks_d_file_in_crios_hooks_dir_is_one_crio_runs(crio: CrioFiles, tmp_path: Path) -> None:
    """The file install-hook writes into the hooks_dir of CRI-O's configuration, in containers/common's format:
    version 1.0.0, an existing executable path (a missing one is dropped silently), the GPU annotation as
    anchored regexes, the prestart stage."""
    config = tmp_path / "ponytail.toml"
    config.write_text("")
    [hooks_dir] = crio.effective()["crio"]["runtime"]["hooks_dir"]
    installed = subprocess.run([console_script("ponytail"), "install-hook", "--dir", hooks_dir, "--config", str(config)],
                               capture_output=True, text=True, timeout=TIMEOUT)
    assert installed.returncode == 0, installed.stderr
    [hook_file] = Path(hooks_dir).iterdir()
    hook = json.loads(hook_file.read_text())
    assert hook["version"] == "1.0.0" and hook["stages"] == ["prestart"]
    assert hook["hook"]["path"] == console_script("ponytail") and os.access(hook["hook"]["path"], os.X_OK)
    assert hook["hook"]["args"] == ["ponytail", "-config", str(config)]
    [(key, value)] = hook["when"]["annotations"].items()
    assert re.search(key, "com.example.gpu") and not re.search(key, "com.example.gpu.other")
    assert re.search(value, "true") and not re.search(value, "nottrue")


FORGED = "gpu-operator"


def test_the_pod_namespace_in_a_spec_as_crio_writes_it(host: FakeHost, tmp_path: Path) -> None:
    """CRI-O copies a pod's annotations into each container's spec, then the container's, then the kubelet's
    container labels (internal/factory/container SpecAddAnnotations): the kubelet's io.kubernetes.pod.namespace is
    written last, while containerd's key, io.kubernetes.cri.sandbox-namespace, stays as the pod wrote it. On
    such a config.json (a pod in `default` that forged both keys) the hook believes the namespace only through
    the configured CRI implementation's key."""
    annotations = {"example.com/passed": "yes", "io.kubernetes.pod.namespace": "default", "io.kubernetes.cri.sandbox-namespace": FORGED}
    bundle = oci_bundle(tmp_path, ["/bin/true"], env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=annotations)
    strict = f'[request]\naccept_env_when_unprivileged = false\nenv_namespaces = ["{FORGED}"]\n'
    for cri, believed in (("cri-o", False), ("containerd", True)):
        config = tmp_path / f"{cri}.toml"
        config.write_text(host.config_text() + strict + f'cri = "{cri}"\n')
        output = run_ponytail(["-config", str(config), "-debug"], stdin=state_for(bundle, 1)).stdout.decode()
        assert ("devices requested: 'all' (from NVIDIA_VISIBLE_DEVICES)" in output) is believed, output
