"""NVIDIA's hook command lines (nvidia-cdi-hook, nvidia-ctk hook) as ponytail reads them: every subcommand
and flag NVIDIA's specs emit (toolkit 1.14-1.20, the device plugin, the DRA driver), in Go's flag forms;
anything else a usage error; the hooks of one container served by its first ponytail hook."""

from __future__ import annotations

import pytest

from ponytail.errors import UsageError
from ponytail.hooks import nvidia as nvidiahook

SPEC_HOOKS = [  # nvidia-ctk 1.20's, as `cdi generate` writes them (tests/engines/test_nvidia_spec_podman.py runs them)
    ["nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"],
    ["nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"],
    ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
    ["nvidia-cdi-hook", "disable-device-node-modification"],
    ["nvidia-cdi-hook", "update-application-profile"],
]


@pytest.mark.parametrize("name, args, expected", [
    ("nvidia-cdi-hook", ["create-symlinks", "--link", "a::/b", "--link=c::/d"], ("create-symlinks", (("link", ("a::/b", "c::/d")),))),
    ("nvidia-cdi-hook", ["-d", "create-symlinks", "-link", "../card1::/dev/dri/by-path/pci-0000:18:00.0-card"],
     ("create-symlinks", (("link", ("../card1::/dev/dri/by-path/pci-0000:18:00.0-card",)),))),
    ("nvidia-cdi-hook", ["update-ldcache", "--ldconfig-path", "/sbin/ldconfig", "--folder", "/usr/lib64", "--folder", "/usr/lib"],
     ("update-ldcache", (("folder", ("/usr/lib64", "/usr/lib")), ("ldconfig-path", ("/sbin/ldconfig",))))),
    ("nvidia-cdi-hook", ["update-ldcache", "--ldconfig-path", "@/sbin/ldconfig.real", "--folder", "/usr/lib64"],
     ("update-ldcache", (("folder", ("/usr/lib64",)), ("ldconfig-path", ("@/sbin/ldconfig.real",))))),
    ("nvidia-cdi-hook", ["enable-cuda-compat", "--host-driver-version=570.124.06", "--host-cuda-version=12.8",
                         "--cuda-compat-container-root=/usr/local/cuda/compat"],
     ("enable-cuda-compat", (("host-driver-version", ("570.124.06",)), ("host-cuda-version", ("12.8",)),
                             ("cuda-compat-container-root", ("/usr/local/cuda/compat",))))),
    ("nvidia-cdi-hook", ["disable-device-node-modification"], ("disable-device-node-modification", ())),
    ("nvidia-cdi-hook", ["--quiet", "update-application-profile", "--debug=false"], ("update-application-profile", ())),
    ("nvidia-cdi-hook", ["chmod", "--mode", "755", "--path", "/dev/dri"], ("chmod", (("path", ("/dev/dri",)), ("mode", ("755",))))),
    ("nvidia-cdi-hook", ["create-soname-symlinks", "--folder", "/usr/lib/x86_64-linux-gnu"],
     ("create-soname-symlinks", (("folder", ("/usr/lib/x86_64-linux-gnu",)),))),
    ("nvidia-cdi-hook", ["noop"], ("noop", ())),
    ("nvidia-ctk", ["hook", "update-ldcache", "--folder", "/usr/lib64"], ("update-ldcache", (("folder", ("/usr/lib64",)),))),
    ("nvidia-ctk", ["--config", "/etc/nvidia-container-runtime/config.toml", "hook", "chmod", "--mode", "755", "--path", "/dev/dri"],
     ("chmod", (("path", ("/dev/dri",)), ("mode", ("755",))))),
    ("nvidia-cdi-hook", ["create-symlinks", "--container-spec", "-", "--link", "a::/b"], ("create-symlinks", (("link", ("a::/b",)),))),
])
def test_nvidias_command_lines_are_read_into_one_form(name: str, args: list[str], expected: tuple) -> None:
    assert nvidiahook.parse(name, args) == expected


@pytest.mark.parametrize("name, args, said", [
    ("nvidia-cdi-hook", ["frobnicate"], "unknown hook subcommand 'frobnicate'"),
    ("nvidia-cdi-hook", [], "no hook subcommand given"),
    ("nvidia-cdi-hook", ["create-symlinks", "--lnk", "a::/b"], "unknown flag '--lnk'"),
    ("nvidia-cdi-hook", ["update-ldcache", "--folder"], "--folder needs a value"),
    ("nvidia-cdi-hook", ["update-ldcache", "/usr/lib"], "unexpected argument '/usr/lib'"),
    ("nvidia-cdi-hook", ["update-ldcache", "--folder", "usr/lib"], "must be an absolute path"),
    ("nvidia-cdi-hook", ["create-symlinks", "--link", "a:/b"], "is not TARGET::LINK"),
    ("nvidia-cdi-hook", ["create-symlinks", "--link", "a::b"], "is not TARGET::LINK"),
    ("nvidia-cdi-hook", ["chmod", "--mode", "4755", "--path", "/dev/dri"], "at most 777"),
    ("nvidia-cdi-hook", ["chmod", "--path", "/dev/dri"], "--mode none"),
    ("nvidia-cdi-hook", ["enable-cuda-compat", "--host-driver-version=latest"], "is not a version"),
    ("nvidia-cdi-hook", ["create-symlinks", "--container-spec", "/tmp/state.json"], "from stdin only"),
    ("nvidia-cdi-hook", ["create-symlinks", "--csv-filename", "/etc/x.csv"], "unknown flag '--csv-filename'"),
    ("nvidia-cdi-hook", ["--config", "/x", "noop"], "unknown flag '--config'"),
    ("nvidia-cdi-hook", ["--help"], "served by ponytail"),
    ("nvidia-ctk", ["cdi", "generate"], "serves only 'nvidia-ctk hook SUBCOMMAND'"),
    ("nvidia-ctk", ["hook", "runtime-hook"], "unknown hook subcommand"),
])
def test_anything_else_is_a_usage_error_never_a_silent_success(name: str, args: list[str], said: str) -> None:
    with pytest.raises(UsageError) as raised:
        nvidiahook.parse(name, args)
    assert said in raised.value.message and "\n" not in raised.value.message


def test_the_first_ponytail_hook_of_a_container_serves_all_of_them(tmp_path) -> None:
    ponytail = tmp_path / "ponytail"
    ponytail.write_text("")
    (tmp_path / "nvidia-cdi-hook").symlink_to(ponytail)
    other = tmp_path / "other" / "nvidia-cdi-hook"  # NVIDIA's own binary elsewhere: not ours to serve
    other.parent.mkdir()
    other.write_text("")
    hooks = {"createContainer": [
        {"path": "/usr/bin/some-other-hook", "args": ["x"]},
        *({"path": str(tmp_path / "nvidia-cdi-hook"), "args": args} for args in SPEC_HOOKS),
        {"path": str(other), "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "x::/y"]},
        {"path": str(ponytail), "args": ["ponytail", "cdi-hook", "--mask-proc"]},
    ]}
    served = nvidiahook.served_invocations(hooks, str(tmp_path / "nvidia-cdi-hook"))
    assert [s for s, _ in served] == [args[1] for args in SPEC_HOOKS]
    assert served.index(nvidiahook.parse("nvidia-cdi-hook", SPEC_HOOKS[2][1:])) == 2  # a later one: its work is done


def test_a_hook_ponytail_cannot_serve_in_the_list_stops_the_first() -> None:
    import sys

    hooks = {"createContainer": [{"path": sys.executable, "args": ["nvidia-cdi-hook", "create-symlinks", "--lnk", "a::/b"]}]}
    assert nvidiahook.served_invocations(hooks, sys.executable) == []  # not named nvidia-cdi-hook: not ours
    link_hooks = {"createContainer": [{"path": "/nonexistent/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "create-symlinks", "--lnk", "a::/b"]}]}
    with pytest.raises(UsageError):
        nvidiahook.served_invocations(link_hooks, "/nonexistent/nvidia-cdi-hook")


def test_an_unknown_subcommand_in_the_list_is_left_out_and_named() -> None:
    """A spec from a newer toolkit: the first hook serves the others and names the unknown one (to warn, or
    to stop where the config says so); an unknown flag of a known subcommand still stops it."""
    hook = "/nonexistent/nvidia-cdi-hook"
    hooks = {"createContainer": [{"path": hook, "args": args} for args in (
        SPEC_HOOKS[0], ["nvidia-cdi-hook", "frobnicate-devices", "--any", "x"], SPEC_HOOKS[2])]}
    unknown: list[str] = []
    served = nvidiahook.served_invocations(hooks, hook, unknown)
    assert [s for s, _ in served] == ["create-symlinks", "update-ldcache"] and unknown == ["frobnicate-devices"]


def test_an_unknown_subcommand_is_its_own_error_an_unknown_flag_is_not() -> None:
    with pytest.raises(nvidiahook.UnknownSubcommand) as raised:
        nvidiahook.parse("nvidia-ctk", ["hook", "frobnicate", "--whatever"])
    assert raised.value.subcommand == "frobnicate"
    with pytest.raises(UsageError) as flag:
        nvidiahook.parse("nvidia-cdi-hook", ["update-ldcache", "--frobnicate"])
    assert not isinstance(flag.value, nvidiahook.UnknownSubcommand)


@pytest.mark.parametrize("setting, code", [("", 0), ('[cdi]\nunknown_nvidia_hooks = "warn"\n', 0), ('[cdi]\nunknown_nvidia_hooks = "fail"\n', 1)])
def test_an_unknown_subcommand_warns_and_succeeds_unless_the_config_says_fail(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], setting: str, code: int,
) -> None:
    """As NVIDIA's binary (1.20.0: "Unsupported CDI hook: create-soname-symlinks", exit 0), never a failed start,
    unless [cdi] unknown_nvidia_hooks = "fail": then one line, exit 1."""
    config = tmp_path / "config.toml"
    config.write_text(f'[log]\nfile = "{tmp_path}/log"\n{setting}')
    monkeypatch.setenv("PONYTAIL_CONFIG", str(config))
    assert nvidiahook.main("/usr/bin/nvidia-cdi-hook", ["frobnicate-devices", "--folder", "/x"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    log = (tmp_path / "log").read_text()
    if code:
        assert "frobnicate-devices" in err and 'unknown_nvidia_hooks = "fail"' in err and "error" in log, (err, log)
    else:
        assert "unsupported CDI hook: frobnicate-devices" in err and "unsupported CDI hook: frobnicate-devices (nvidia-cdi-hook" in log


def test_the_application_profile_names_the_containers_gpu_minors() -> None:
    profile = nvidiahook._application_profile(((195, 1), (195, 3), (195, 255), (511, 0)))
    assert profile == b'{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0xa]}],"rules":[{"pattern":[],"profile":"_container_"}]}'
    assert nvidiahook._application_profile(((195, 255),)) is None


@pytest.mark.parametrize("flags, said", [
    ({"enable-cuda-compat host-driver-version": ["535.104.05"]}, "generated for NVIDIA driver 535.104.05 but 550.54.15 is running"),
    ({"create-symlinks link": ["libcuda.so.535.104.05::/usr/lib/libcuda.so.1"]}, "a library of NVIDIA driver 535.104.05"),
])
def test_a_spec_for_another_driver_is_refused(flags: dict, said: str) -> None:
    from ponytail.errors import InjectionError

    with pytest.raises(InjectionError) as raised:
        nvidiahook._check_driver(flags, "550.54.15")
    assert said in raised.value.message
    nvidiahook._check_driver({"create-symlinks link": ["libcuda.so.550.54.15::/usr/lib/libcuda.so.1", "../card1::/dev/dri/by-path/x"],
                              "enable-cuda-compat host-driver-version": ["550.54.15"]}, "550.54.15")


def test_each_hooks_work_becomes_ponytails_operations(tmp_path) -> None:
    """Two chmod hooks keep their own modes; links once each; folders and the compat directory in one
    linker-cache run; the application profile from the container's GPU nodes."""
    from ponytail.config import Config
    from ponytail.container.oci import Container
    from ponytail.plan.operations import Chmod, LinkerCache, Symlink, WriteFile

    container = Container(id="c", pid=0, bundle=str(tmp_path), rootfs=str(tmp_path / "rootfs"), status="creating", env={},
                          annotations={}, cgroups_path=None, privileged=False, plugin_devices=None, char_devices=((195, 1),),
                          plugin_features=())
    work = [nvidiahook.parse("nvidia-cdi-hook", args) for args in (
        ["create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so", "--link", "libcuda.so.1::/usr/lib/libcuda.so"],
        ["chmod", "--mode", "755", "--path", "/dev/dri"],
        ["chmod", "--mode", "700", "--path", "/var/x"],
        ["update-ldcache", "--folder", "/usr/lib64", "--folder", "/usr/lib"],
        ["update-ldcache", "--folder", "/usr/lib"],
        ["update-application-profile"],
    )]
    ops = nvidiahook.operations(work, container, Config(ldconfig="/sbin/ldconfig"), None)
    assert [op for op in ops if isinstance(op, Symlink)] == [
        Symlink("/usr/lib/libcuda.so", "libcuda.so.1", "create-symlinks --link libcuda.so.1::/usr/lib/libcuda.so", replace_file=True)
    ]
    assert [(op.target, op.mode) for op in ops if isinstance(op, Chmod)] == [("/dev/dri", 0o755), ("/var/x", 0o700)]
    caches = [op for op in ops if isinstance(op, LinkerCache)]
    assert len(caches) == 1 and caches[0].directories == ("/usr/lib64", "/usr/lib") and caches[0].ldconfig == "/sbin/ldconfig"
    assert [op.target for op in ops if isinstance(op, WriteFile)] == [nvidiahook.APPLICATION_PROFILE]
