"""Each engine's editor, text in and text out, and its ``registered()`` reading back what the edit
wrote: a table per engine (an empty file, other runtimes, ponytail's entry already there, containerd
1.x's and 2.x's configs, a 2.x drop-in, a k3s template), then the node under a tmp root finds
ponytail, the uninstall's edit, and the node finds nothing. No root, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponytail.engines import crio, docker, hooksd, podman, registry
from ponytail.engines.containerd import config as containerd
from ponytail.engines.containerd import dropin, k3s
from ponytail.engines.model import Edit, Settings

pytestmark = pytest.mark.unit

RUNTIME = "/usr/local/bin/ponytail-runtime"
SETTINGS = Settings(runtime_path=RUNTIME, hook_path="/usr/local/bin/ponytail")


def _write(root: Path, path: str, text: str | None) -> None:
    """The node's ``path`` under ``root`` holds ``text`` (None: no file)."""
    where = root / path.lstrip("/")
    if text is None:
        where.unlink(missing_ok=True)
        return
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(text)


def _round_trip(tmp_path: Path, engine: str, path: str, old: str | None, edit: Edit, remove: Edit, program: str = RUNTIME) -> None:
    """The edit's text at ``path`` is registered (running ``program``); the uninstall's is not."""
    _write(tmp_path, path, edit.new_text)
    found = registry.engine(engine).registered(str(tmp_path))
    assert found is not None and found.program == program and found.path == str(tmp_path) + path, found
    assert remove.new_text == old or remove.new_text is None
    _write(tmp_path, path, remove.new_text)
    assert registry.engine(engine).registered(str(tmp_path)) is None


# -- docker: daemon.json ----------------------------------------------------------------

DOCKER_EMPTY = '{\n    "runtimes": {\n        "ponytail": {\n            "path": "/usr/local/bin/ponytail-runtime"\n        }\n    }\n}\n'
DOCKER_OTHER = '{\n  "runtimes": {\n    "crun": {\n      "path": "/usr/bin/crun"\n    }\n  },\n  "log-level": "warn"\n}\n'
DOCKER_OTHER_AND_OURS = (
    '{\n  "runtimes": {\n    "crun": {\n      "path": "/usr/bin/crun"\n    },\n    "ponytail": {\n'
    '      "path": "/usr/local/bin/ponytail-runtime"\n    }\n  },\n  "log-level": "warn"\n}\n'
)


@pytest.mark.parametrize(
    "old, new",
    [
        (None, DOCKER_EMPTY),
        ("", DOCKER_EMPTY),
        (DOCKER_OTHER, DOCKER_OTHER_AND_OURS),  # the other runtime, the other key, their order and indent kept
        (DOCKER_OTHER_AND_OURS, DOCKER_OTHER_AND_OURS),  # already there: nothing changes
    ],
)
def test_docker(tmp_path: Path, old: str | None, new: str) -> None:
    edit = docker.edit(docker.CONFIG_PATH, old, SETTINGS)
    assert edit.new_text == new and edit.changed == (old != new)
    remove = docker.edit(docker.CONFIG_PATH, new, SETTINGS, remove=True, added=edit.added)
    assert remove.new_text == (DOCKER_OTHER if old in (DOCKER_OTHER, DOCKER_OTHER_AND_OURS) else "{}\n")
    _round_trip(tmp_path, "docker", docker.CONFIG_PATH, None, edit, Edit(docker.CONFIG_PATH, new, None, ()))
    assert docker.registered(str(tmp_path)) is None
    _write(tmp_path, docker.CONFIG_PATH, remove.new_text)
    assert docker.registered(str(tmp_path)) is None


def test_docker_as_the_default_runtime(tmp_path: Path) -> None:
    edit = docker.edit(docker.CONFIG_PATH, '{\n  "default-runtime": "crun"\n}\n', Settings(runtime_path=RUNTIME, set_as_default=True))
    assert edit.new_text == '{\n  "default-runtime": "ponytail",\n  "runtimes": {\n    "ponytail": {\n      "path": "/usr/local/bin/ponytail-runtime"\n    }\n  }\n}\n'
    assert edit.added == {"default": "crun"}
    _write(tmp_path, docker.CONFIG_PATH, edit.new_text)
    found = docker.registered(str(tmp_path))
    assert found is not None and "(the default runtime)" in found.where
    remove = docker.edit(docker.CONFIG_PATH, edit.new_text, SETTINGS, remove=True, added=edit.added)
    assert remove.new_text == '{\n  "default-runtime": "crun"\n}\n'


def test_docker_registers_a_runtime_by_its_name_or_its_program(tmp_path: Path) -> None:
    _write(tmp_path, docker.CONFIG_PATH, '{"runtimes": {"ponytail": {"path": "/opt/gpu/runtime"}, "nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}')
    found = docker.registered(str(tmp_path))
    assert found is not None and found.program == "/opt/gpu/runtime" and "'docker run --runtime ponytail'" in found.where
    _write(tmp_path, docker.CONFIG_PATH, '{"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}')
    assert docker.registered(str(tmp_path)) is None
    missing = docker.unregistered(str(tmp_path))
    assert missing.what.endswith("/etc/docker/daemon.json registers no ponytail-runtime") and not missing.mentioned
    _write(tmp_path, docker.CONFIG_PATH, "{not json")
    assert docker.registered(str(tmp_path)) is None


# -- containerd: config.toml, 2.x drop-ins, k3s templates ---------------------------------

CONTAINERD_EMPTY = """version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.ponytail]
runtime_type = "io.containerd.runc.v2"
container_annotations = ["cdi.k8s.io/*"]

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.ponytail.options]
BinaryName = "/usr/local/bin/ponytail-runtime"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
"""
CONTAINERD_1 = """version = 2

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""
CONTAINERD_1_AND_OURS = CONTAINERD_1 + """
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.ponytail]
runtime_type = "io.containerd.runc.v2"
container_annotations = ["cdi.k8s.io/*"]

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.ponytail.options]
SystemdCgroup = true
BinaryName = "/usr/local/bin/ponytail-runtime"

"""
CONTAINERD_2 = """version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
"""
CONTAINERD_2_AND_OURS = CONTAINERD_2 + """
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.ponytail]
runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.ponytail.options]
BinaryName = "/usr/local/bin/ponytail-runtime"

"""


@pytest.mark.parametrize(
    "old, new",
    [
        (None, CONTAINERD_EMPTY),  # a new file: containerd 1.x's version, runc defined (the default must be)
        (CONTAINERD_1, CONTAINERD_1_AND_OURS),  # runc's options copied, CDI annotations passed to ponytail-runtime
        (CONTAINERD_1_AND_OURS, CONTAINERD_1_AND_OURS),  # already there
        (CONTAINERD_2, CONTAINERD_2_AND_OURS),  # containerd 2.x resolves CDI itself: no annotations passed
    ],
)
def test_containerd(tmp_path: Path, old: str | None, new: str) -> None:
    path = containerd.CONFIG_PATH
    edit = containerd.edit(path, old, SETTINGS)
    assert edit.new_text == new and edit.changed == (old != new)
    remove = containerd.edit(path, new, SETTINGS, remove=True, added=edit.added)
    # what was there before, and the blank line ponytail's table began with (configure's record restores the bytes)
    expected = {None: "version = 2\n", CONTAINERD_1_AND_OURS: CONTAINERD_1}.get(old, old) + "\n"
    assert remove.new_text == expected
    _round_trip(tmp_path, "containerd", path, expected, edit, remove)


def test_a_containerd_2_drop_in(tmp_path: Path) -> None:
    """config.toml imports conf.d/*.toml (NVIDIA's default since toolkit 1.18): ponytail's entry goes to
    conf.d/99-ponytail.toml, config.toml is not changed, and the node reads it there."""
    main_text = CONTAINERD_2.replace("version = 3\n", 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    main = str(tmp_path) + containerd.CONFIG_PATH
    _write(tmp_path, containerd.CONFIG_PATH, main_text)
    path = dropin.drop_in_for(main, main_text, None)
    assert path == str(tmp_path) + "/etc/containerd/conf.d/99-ponytail.toml"
    assert not dropin.main_edit(main, main_text, path).changed  # the import covers it already
    edit = dropin.drop_in_edit(path, None, main_text, SETTINGS)
    assert edit.new_text == """version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.ponytail]
runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.ponytail.options]
BinaryName = "/usr/local/bin/ponytail-runtime"
"""
    assert not dropin.drop_in_edit(path, edit.new_text, main_text, SETTINGS).changed
    remove = dropin.drop_in_edit(path, edit.new_text, main_text, SETTINGS, remove=True)
    _round_trip(tmp_path, "containerd", "/etc/containerd/conf.d/99-ponytail.toml", None, edit, remove)
    assert containerd.registered(str(tmp_path)) is None and not containerd.unregistered(str(tmp_path)).mentioned


@pytest.mark.parametrize(
    "imports, drop_in, added",
    [
        ([], "/etc/containerd/conf.d/99-ponytail.toml", "/etc/containerd/conf.d/*.toml"),
        (["/etc/containerd/conf.d/*.toml"], "/etc/containerd/conf.d/99-ponytail.toml", None),
        # containerd's * stops at / (Go's filepath.Match): a directory below needs its own import
        (["/etc/containerd/conf.d/*.toml"], "/etc/containerd/conf.d/gpu/99-ponytail.toml", "/etc/containerd/conf.d/gpu/*.toml"),
        (["/etc/containerd/conf.d/*.conf"], "/etc/containerd/conf.d/99-ponytail.toml", "/etc/containerd/conf.d/*.toml"),
    ],
)
def test_the_import_of_a_drop_in(tmp_path: Path, imports: list[str], drop_in: str, added: str | None) -> None:
    main = str(tmp_path) + containerd.CONFIG_PATH
    text = "version = 3\n" + (f"imports = {imports!r}\n".replace("'", '"') if imports else "")
    edit = dropin.main_edit(main, text, str(tmp_path) + drop_in)
    assert edit.added == ({"imports": added} if added else {})
    if added is None:
        assert not edit.changed
        return
    assert edit.new_text == "version = 3\n" + "imports = " + str([*imports, added]).replace("'", '"') + "\n"
    remove = dropin.main_edit(main, edit.new_text, str(tmp_path) + drop_in, remove=True, added=edit.added)
    assert remove.new_text == text
    _write(tmp_path, containerd.CONFIG_PATH, edit.new_text)
    _write(tmp_path, drop_in, dropin.drop_in_edit(drop_in, None, edit.new_text, SETTINGS).new_text)
    assert containerd.registered(str(tmp_path)) is not None


K3S_BASE = '{{ template "base" . }}\n'
K3S_OURS = K3S_BASE + """
# ponytail: its runtime (ponytail configure --runtime containerd; --uninstall takes this block out)
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.ponytail]
  runtime_type = "io.containerd.runc.v2"
  container_annotations = ["cdi.k8s.io/*"]
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.ponytail.options]
  BinaryName = "/usr/local/bin/ponytail-runtime"
# end of ponytail's runtime
"""


@pytest.mark.parametrize("old, new", [(K3S_BASE, K3S_OURS), (K3S_OURS, K3S_OURS), (None, K3S_BASE + "\n" + K3S_OURS[len(K3S_BASE) + 1:])])
def test_a_k3s_template(tmp_path: Path, old: str | None, new: str) -> None:
    """k3s writes config.toml from config.toml.tmpl at every start: the template gets ponytail's block,
    and the node's generated config.toml leads to it."""
    template = "/etc/containerd/config.toml.tmpl"
    edit = containerd.edit(template, old, SETTINGS)  # the template is k3s's: edited the way k3s expects
    assert edit.new_text == new and edit.changed == (old != new)
    remove = k3s.edit(template, new, SETTINGS, remove=True)
    assert remove.new_text == K3S_BASE
    _write(tmp_path, containerd.CONFIG_PATH, "# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.\nversion = 2\n")
    _round_trip(tmp_path, "containerd", template, K3S_BASE, edit, remove)


# -- CRI-O: its drop-in crio.conf.d/99-ponytail.conf --------------------------------------

CRIO_EMPTY = crio.HEADER + """
[crio.runtime.runtimes.ponytail]
runtime_path = "/usr/local/bin/ponytail-runtime"
runtime_type = "oci"
"""
CRIO_OTHER = '[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n'
CRIO_OTHER_AND_OURS = CRIO_OTHER + '\n[crio.runtime.runtimes.ponytail]\nruntime_path = "/usr/local/bin/ponytail-runtime"\nruntime_type = "oci"\n'


@pytest.mark.parametrize("old, new", [(None, CRIO_EMPTY), (CRIO_OTHER, CRIO_OTHER_AND_OURS), (CRIO_EMPTY, CRIO_EMPTY)])
def test_crio(tmp_path: Path, old: str | None, new: str) -> None:
    path = crio.drop_in_path(crio.CONFIG_PATH)
    assert path == "/etc/crio/crio.conf.d/99-ponytail.conf"
    edit = crio.edit(path, old, SETTINGS)
    assert edit.new_text == new and edit.changed == (old != new)
    remove = crio.edit(path, new, SETTINGS, remove=True)
    _round_trip(tmp_path, "crio", path, None, edit, remove)
    found_as = crio.runtime(path, new)
    assert found_as is not None and found_as.where == f"runtime_path in {path}"


def test_crio_without_its_runtime_reads_its_hooks_directory(tmp_path: Path) -> None:
    _write(tmp_path, "/etc/crio/crio.conf.d/10-hooks.conf", '[crio.runtime]\nhooks_dir = [\n  "/etc/crio-hooks",  # ours\n]\n')
    missing = crio.unregistered(str(tmp_path))
    assert missing.what == f"no ponytail.json in /etc/crio-hooks (hooks_dir in {tmp_path}/etc/crio/crio.conf.d/10-hooks.conf)"
    assert missing.fix == "'ponytail install-hook --dir /etc/crio-hooks'"
    _write(tmp_path, "/etc/crio-hooks/ponytail.json", podman.edit("", None, SETTINGS).new_text)
    found = crio.registered(str(tmp_path))
    assert found is not None and found.hook and found.program == "/usr/local/bin/ponytail"


# -- podman: the hooks.d file -------------------------------------------------------------

@pytest.mark.parametrize("default", [False, True])
def test_podman(tmp_path: Path, default: bool) -> None:
    settings = Settings(hook_path="/usr/local/bin/ponytail", set_as_default=default)
    edit = podman.edit(podman.CONFIG_PATH, None, settings)
    assert edit.new_text == hooksd.hook_file_text("/usr/local/bin/ponytail", always=default)
    assert ('"always": true' in (edit.new_text or "")) == default
    assert not podman.edit(podman.CONFIG_PATH, edit.new_text, settings).changed
    remove = podman.edit(podman.CONFIG_PATH, edit.new_text, settings, remove=True)
    _round_trip(tmp_path, "podman", podman.CONFIG_PATH, None, edit, remove, program="/usr/local/bin/ponytail")


def test_podman_reads_its_hooks_dir_and_a_broken_file(tmp_path: Path) -> None:
    _write(tmp_path, "/etc/containers/containers.conf", '[engine]\nhooks_dir = ["/etc/my-hooks"]\n')
    _write(tmp_path, podman.CONFIG_PATH, podman.edit(podman.CONFIG_PATH, None, SETTINGS).new_text)
    assert podman.registered(str(tmp_path)) is None  # in a directory podman no longer reads
    assert podman.unregistered(str(tmp_path)).mentioned
    _write(tmp_path, "/etc/my-hooks/ponytail.json", "{broken")
    found = podman.registered(str(tmp_path))
    assert found is not None and found.program is None and found.hook


@pytest.mark.parametrize(
    "text, dirs",
    [
        ('[engine]\nhooks_dir = ["/a", "/b"]\n', ("/a", "/b")),
        ('[crio.runtime]\nhooks_dir = [\n  "/a",  # ours\n  "relative",\n]\n', ("/a",)),
        ("[engine]\n", None),
        ("not = [toml", None),
    ],
)
def test_hooks_dir_setting(text: str, dirs: tuple[str, ...] | None) -> None:
    assert hooksd.hooks_dir_setting(text) == dirs


def test_podmans_runtime_is_the_last_containers_conf_that_sets_it(tmp_path: Path) -> None:
    assert podman.configured_runtime(str(tmp_path)) is None
    _write(tmp_path, "/usr/share/containers/containers.conf", '[engine]\nruntime = "crun"  # the package\'s\n')
    assert podman.configured_runtime(str(tmp_path)) == ("crun", "/usr/share/containers/containers.conf")
    _write(tmp_path, "/etc/containers/containers.conf", '[engine]\nruntime = "runc"\n[machine]\nruntime = "other"\n')
    assert podman.configured_runtime(str(tmp_path)) == ("runc", "/etc/containers/containers.conf")
