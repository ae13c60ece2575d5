"""NVIDIA's hook binary as one more front end of ponytail's CDI hook.

NVIDIA's CDI specs (``nvidia-ctk cdi generate``, the device plugin's, the DRA driver's) run
``nvidia-cdi-hook SUBCOMMAND --flag ...`` (older specs ``nvidia-ctk hook SUBCOMMAND ...``) as
createContainer hooks, one process per subcommand. Run under either name (a link to the ponytail
command, ``ponytail install-nvidia-hook``), ponytail reads those command lines into the operations
its own ``cdi-hook`` applies, with the same executor and rules: every path resolved inside the
rootfs, nothing from the image run, the host's ldconfig on a nodev view of the rootfs.

=====================================  ====================================================
NVIDIA's subcommand                    ponytail's operation
=====================================  ====================================================
create-symlinks --link TARGET::LINK    a link LINK -> TARGET in the rootfs
update-ldcache --folder DIR            the linker config and cache with DIR (host ldconfig)
enable-cuda-compat --host-driver-...   the image's /usr/local/cuda/compat first when newer
disable-device-node-modification       /proc/driver/nvidia masked: params with ModifyDeviceFiles: 0
update-application-profile             the driver's EGLVisibleDGPUDevices profile for its GPUs
chmod --mode M --path P                the mode of P (permission bits only)
create-soname-symlinks --folder DIR    SONAME links for the libraries in DIR (1.18.0-rc.1)
noop                                   nothing
=====================================  ====================================================

An unknown subcommand (a spec written by a newer toolkit) is what NVIDIA's own binary makes of it:
a warning (in the log, and one line on stderr) and exit 0, the start goes on; ``[cdi]
unknown_nvidia_hooks = "fail"`` stops the start instead. An unknown flag of a known subcommand is a
usage error (exit 2), never a silent success. A spec made for another driver than the running one (``--host-driver-version``, or a versioned driver library a
link names) stops the start.

**One process does the work of all.** The engine has written the container's hooks into the
bundle's config.json; the first of them that runs ponytail under NVIDIA's names reads all the
others there and applies their work at once, and each later one finds it was done (its own command
line is in that list behind the first) and exits at once. A hook whose command line is not in the
list does its own work alone.
"""

from __future__ import annotations

import os
import sys

from ponytail.errors import InjectionError, UsageError
from ponytail.hooks.run import open_log, run

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.config import Config
    from ponytail.container.oci import Container
    from ponytail.logfile import RunLog
    from ponytail.plan.operations import Operation, Symlink

HOOK_NAME = "nvidia-cdi-hook"
CTK_NAME = "nvidia-ctk"
NAMES = (HOOK_NAME, CTK_NAME)
_MANY, _ONE, _FLAG = "many", "one", "flag"
_STATE = {"container-spec": _ONE}  # NVIDIA's testing flag: the OCI state comes from stdin ("" or "-") only
# every subcommand and flag NVIDIA's specs emit (toolkit 1.14-1.20, device plugin v0.17-v0.20, DRA driver)
SUBCOMMANDS: dict[str, dict[str, str]] = {
    "create-symlinks": {"link": _MANY, **_STATE},
    "update-ldcache": {"folder": _MANY, "ldconfig-path": _ONE, **_STATE},
    "enable-cuda-compat": {"host-driver-version": _ONE, "host-cuda-version": _ONE, "cuda-compat-container-root": _ONE, **_STATE},
    "disable-device-node-modification": dict(_STATE),
    "update-application-profile": dict(_STATE),
    "chmod": {"path": _MANY, "mode": _ONE, **_STATE},
    "create-soname-symlinks": {"folder": _MANY, "ldconfig-path": _ONE, **_STATE},
    "noop": {},
}
GLOBAL_FLAGS = {"debug": _FLAG, "d": _FLAG, "quiet": _FLAG}  # logging: ponytail's log file has its own levels
CTK_GLOBAL_FLAGS = {**GLOBAL_FLAGS, "config": _ONE}
MARK = ".ponytail-nvidia-hooks-done"  # in the bundle, with the hooks' parent's pid: this start's hooks are done (nvidiainstall's script)
APPLICATION_PROFILE = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
COMPAT_CONF_FILE = "/etc/ld.so.conf.d/00-compat-ponytail.conf"
_DRIVER_LIBRARIES = ("libcuda.so.", "libnvidia-")  # a link to one of these with a version suffix names the driver's version


Invocation = tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]  # (subcommand, ((flag, values), ...) in table order)


class UnknownSubcommand(UsageError):
    """A hook subcommand ponytail does not serve: a warning, or an error where [cdi] unknown_nvidia_hooks says so."""

    def __init__(self, name: str, subcommand: str) -> None:
        super().__init__(f"{name}: unknown hook subcommand {subcommand!r}: ponytail serves {', '.join(SUBCOMMANDS)}")
        self.subcommand = subcommand


def parse(name: str, args: list[str]) -> Invocation:
    """The subcommand and flags of ``name args`` (name: nvidia-cdi-hook or nvidia-ctk); a
    UsageError for anything NVIDIA's hook would not take or ponytail does not do."""
    rest = list(args)
    if name == CTK_NAME:
        _global_flags(rest, CTK_GLOBAL_FLAGS, name)
        if not rest or rest[0] != "hook":
            said = rest[0] if rest else "nothing"
            raise UsageError(f"run as {CTK_NAME}, ponytail serves only '{CTK_NAME} hook SUBCOMMAND' (a CDI spec's hook), not {said!r}")
        rest.pop(0)
    _global_flags(rest, CTK_GLOBAL_FLAGS if name == CTK_NAME else GLOBAL_FLAGS, name)
    if not rest:
        raise UsageError(f"{name}: no hook subcommand given (one of {', '.join(SUBCOMMANDS)})")
    subcommand = rest.pop(0)
    table = SUBCOMMANDS.get(subcommand)
    if table is None:
        raise UnknownSubcommand(name, subcommand)
    found = _flags(rest, {**table, **GLOBAL_FLAGS}, f"{name} {subcommand}")
    for flag in GLOBAL_FLAGS:
        found.pop(flag, None)
    _check_values(name, subcommand, found)
    return subcommand, tuple((flag, tuple(found[flag])) for flag in table if flag in found and flag != "container-spec")


def main(prog: str, args: list[str]) -> int:
    """Run as NVIDIA's hook binary (``prog``: the name it was started by), through the error door
    (ponytail.hooks.run); the exit status."""
    name = os.path.basename(prog)
    return run(lambda log: _start(name, prog, args, log), name)


def _start(name: str, prog: str, args: list[str], log: RunLog) -> int:
    """The hook's own command line parsed (parse), then its work, or an unknown subcommand's warning."""
    try:
        mine = parse(name, args)
    except UnknownSubcommand as e:
        return _unknown(name, e.subcommand, log)
    return _run(mine, prog, log)


def served_invocations(hooks: object, own_program: str, unknown: list[str] | None = None) -> list[Invocation]:
    """The createContainer hooks of a config.json's ``hooks`` that run this same program under
    NVIDIA's names, parsed, in order (a usage error for one ponytail cannot serve). A hook with a
    subcommand ponytail does not know is left out, its subcommand added to ``unknown``."""
    stage = hooks.get("createContainer") if isinstance(hooks, dict) else None
    own = os.path.realpath(own_program)
    found: list[Invocation] = []
    for hook in stage if isinstance(stage, list) else []:
        path, args = (hook.get("path"), hook.get("args")) if isinstance(hook, dict) else (None, None)
        if not isinstance(path, str) or os.path.basename(path) not in NAMES or os.path.realpath(path) != own:
            continue
        words = [a for a in args if isinstance(a, str)] if isinstance(args, list) else []
        try:
            found.append(parse(os.path.basename(path), words[1:]))
        except UnknownSubcommand as e:
            if unknown is not None:
                unknown.append(e.subcommand)
    return found


def operations(
    invocations: list[Invocation], container: Container, config: Config, running_driver: str | None, log: RunLog | None = None,
) -> tuple[Operation, ...]:
    """The operations that do the work of ``invocations`` in ``container`` (read-only: the image's
    compat directory and SONAMEs are read inside the rootfs; nothing is changed)."""
    from ponytail.plan.operations import LD_CONF_FILE, Chmod, LinkerCache, Symlink, WriteFile

    flags: dict[str, list[str]] = {}
    done: set[str] = set()
    for subcommand, given in invocations:
        done.add(subcommand)
        for flag, values in given:
            flags.setdefault(f"{subcommand} {flag}", []).extend(values)
    _check_driver(flags, running_driver)
    ops: list[Operation] = []
    seen: set[str] = set()
    for spec in flags.get("create-symlinks link", []):
        target, _, link = spec.partition("::")
        if link not in seen:
            seen.add(link)
            ops.append(Symlink(os.path.normpath(link), target, f"create-symlinks --link {spec}", replace_file=True))
    for folder in flags.get("create-soname-symlinks folder", []):
        for made in _soname_links(container.rootfs, folder):
            if made.target not in seen:
                seen.add(made.target)
                ops.append(made)
    for subcommand, given in invocations:  # each chmod hook with its own mode
        if subcommand == "chmod":
            chmod = dict(given)
            mode = chmod["mode"][0]
            ops += [Chmod(path, int(mode, 8), f"chmod --mode {mode}") for path in chmod.get("path", ())]
    if "disable-device-node-modification" in done:
        from ponytail.hooks.cdi import proc_mask_for

        mask = proc_mask_for(config.proc_root, container.char_devices)
        if mask is not None:
            ops.append(mask)
    if "update-application-profile" in done:
        profile = _application_profile(container.char_devices)
        if profile is not None:
            ops.append(WriteFile(APPLICATION_PROFILE, profile, "update-application-profile: EGL and Vulkan see only the container's GPUs"))
    compat_dir = _compat_directory(flags, container, log)
    folders = list(dict.fromkeys(flags.get("update-ldcache folder", []) + flags.get("create-soname-symlinks folder", [])))
    if "update-ldcache" in done or "create-soname-symlinks" in done:
        from ponytail.host.driver_search import find_ldconfig

        ldconfig = find_ldconfig(config.ldconfig)
        if ldconfig is None:
            raise InjectionError("update-ldcache: the host has no ldconfig (/sbin/ldconfig, /usr/sbin/ldconfig): install libc-bin or set [host] ldconfig")
        directories = ([compat_dir] if compat_dir else []) + [d for d in folders if d != compat_dir]
        ops.append(LinkerCache(LD_CONF_FILE, tuple(directories), ldconfig, (), "update-ldcache: make the driver's libraries loadable by SONAME"))
    elif compat_dir:  # enable-cuda-compat alone: the linker path file, for a later update-ldcache (as NVIDIA's)
        ops.append(WriteFile(COMPAT_CONF_FILE, f"{compat_dir}\n".encode(), "enable-cuda-compat: the image's newer libcuda first"))
    return tuple(ops)


# -- the run ---------------------------------------------------------------------------


def _run(mine: Invocation, prog: str, log: RunLog) -> int:
    from ponytail.container.oci import MAX_STATE_BYTES, load_container, parse_state, read_bounded, read_bundle_config

    state = parse_state(read_bounded(sys.stdin.buffer, MAX_STATE_BYTES, "OCI state on stdin"), lowest_pid=0)
    raw = read_bundle_config(state.bundle)
    unknown: list[str] = []
    served = served_invocations(raw.get("hooks"), _own_program(prog), unknown)
    if mine in served and served.index(mine) > 0:
        return 0  # the first of this container's hooks that run ponytail did this one's work too
    work = served if mine in served else [mine]
    log.context = state.id
    config = open_log(log)
    if work is served:  # the hooks this run serves for the others: their unknown ones are told here (the script skips them)
        for subcommand in unknown:
            _tell_unknown(os.path.basename(prog), subcommand, config, log)
    container = load_container(state, raw)
    log.write("info", f"{os.path.basename(prog)} started: rootfs {container.rootfs}; {len(work)} NVIDIA hook(s): {', '.join(s for s, _ in work)}")
    from ponytail.hooks.cdi import check_stage

    check_stage(container.rootfs, state.pid, os.path.basename(prog))
    from ponytail.host.driver import read_driver_version

    running = read_driver_version(config.proc_root) if _names_a_driver(work) else None
    ops = operations(work, container, config, running, log)
    from ponytail.apply.executor import apply_operations

    outcome = apply_operations(
        ops, container.rootfs, None, config.timeout_ldconfig, config.timeout_lock, progress=lambda step: log.write("info", f"step: {step}")
    )
    log.write_all("debug", outcome.done)
    log.write_all("warning", outcome.warnings)
    from ponytail.hooks.cdi import record_for_guard

    record_for_guard(config, state.id, container.char_devices, "", log, os.path.basename(prog))
    if len(work) > 1:
        _mark_done(state.bundle)
    log.write("info", f"{os.path.basename(prog)} in {container.rootfs}: {len(outcome.done)} change(s), "
                      f"{len(outcome.unchanged)} already in place; {log.elapsed_ms():.1f} ms")
    return 0


def _unknown(name: str, subcommand: str, log: RunLog) -> int:
    """A hook subcommand ponytail does not know, run on its own: warned about (exit 0), or refused."""
    config = open_log(log)
    _tell_unknown(name, subcommand, config, log)
    print(f"ponytail: warning: unsupported CDI hook: {subcommand} (skipped; {name} is served by ponytail)", file=sys.stderr)
    return 0


def _tell_unknown(name: str, subcommand: str, config: Config, log: RunLog) -> None:
    """Log the unknown hook ``subcommand``, or stop the start where [cdi] unknown_nvidia_hooks is "fail"."""
    if config.unknown_nvidia_hooks == "fail":
        raise InjectionError(
            f"the CDI spec runs '{name} {subcommand}', a hook ponytail does not serve, and {config.path} sets [cdi] "
            f'unknown_nvidia_hooks = "fail": generate the spec with a toolkit whose hooks ponytail serves, or set it to "warn"'
        )
    log.write("warning", f"unsupported CDI hook: {subcommand} ({name}; a spec from a newer toolkit?): skipped, as NVIDIA's own {name} does")


def _mark_done(bundle: str) -> None:
    """Leave MARK in the bundle for the later hooks of this start (their parent is this one's), and
    take away the marks of earlier starts. The bundle is the engine's directory on the host, named
    by the engine; the mark is a new empty file, never written through a link."""
    name = f"{MARK}.{os.getppid()}"
    try:
        for old in os.listdir(bundle):
            if old.startswith(MARK + ".") and old != name:
                os.unlink(os.path.join(bundle, old))
        fd = os.open(os.path.join(bundle, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
    except OSError:  # noqa: S110 - no mark: the later hooks ask ponytail, which finds them done in config.json
        pass


def _own_program(prog: str) -> str:
    """The file this process was started from, as a hook's ``path`` names it: the path it was
    started by (install-nvidia-hook's script passes its own; a link's, for the console script), else
    the executable's (the frozen binary started by a name alone)."""
    return prog if os.path.isabs(prog) else sys.executable


# -- the command line ---------------------------------------------------------------------


def _global_flags(rest: list[str], table: dict[str, str], name: str) -> None:
    """Take the global flags in front of the subcommand off ``rest``."""
    while rest and rest[0].startswith("-"):
        flag, eq, _ = rest[0].lstrip("-").partition("=")
        kind = table.get(flag)
        if kind is None:
            if flag in ("help", "h", "version", "v"):
                raise UsageError(f"{name} is served by ponytail here: see 'ponytail install-nvidia-hook --help'")
            raise UsageError(f"{name}: unknown flag {rest[0]!r} (ponytail takes {', '.join('--' + f for f in table)} there)")
        rest.pop(0)
        if kind == _ONE and not eq:
            if not rest:
                raise UsageError(f"{name}: --{flag} needs a value")
            rest.pop(0)


def _flags(rest: list[str], table: dict[str, str], where: str) -> dict[str, list[str]]:
    """``--flag VALUE``, ``--flag=VALUE``, ``-flag VALUE`` (Go's flag syntax); a boolean flag may
    say ``=true`` or ``=false``."""
    found: dict[str, list[str]] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("---"):
            raise UsageError(f"{where}: unexpected argument {arg!r} (NVIDIA's hooks take flags only)")
        flag, eq, inline = arg.lstrip("-").partition("=")
        kind = table.get(flag)
        if kind is None:
            allowed = ", ".join(f"--{f}" for f in table if f not in GLOBAL_FLAGS) or "no flags"
            raise UsageError(f"{where}: unknown flag {arg!r} (it takes {allowed})")
        if kind == _FLAG:
            if eq and inline not in ("true", "false"):
                raise UsageError(f"{where}: --{flag} is true or false, not {inline!r}")
            i += 1
            continue
        if eq:
            value = inline
        elif i + 1 < len(rest):
            i += 1
            value = rest[i]
        else:
            raise UsageError(f"{where}: --{flag} needs a value")
        if kind == _ONE and flag in found:
            raise UsageError(f"{where}: --{flag} given twice")
        found.setdefault(flag, []).append(value)
        i += 1
    return found


def _check_values(name: str, subcommand: str, found: dict[str, list[str]]) -> None:
    where = f"{name} {subcommand}"
    for spec in found.get("container-spec", []):
        if spec not in ("", "-"):
            raise UsageError(f"{where}: --container-spec {spec!r}: ponytail reads the OCI state from stdin only")
    for spec in found.get("link", []):
        target, sep, link = spec.partition("::")
        if not sep or not target or "::" in link or not link.startswith("/") or "\0" in spec:
            raise UsageError(f"{where}: --link {spec!r} is not TARGET::LINK with an absolute LINK")
    for flag in ("folder", "path", "ldconfig-path", "cuda-compat-container-root"):
        for value in found.get(flag, []):
            if not value.lstrip("@").startswith("/") or "\0" in value:
                raise UsageError(f"{where}: --{flag} {value!r} must be an absolute path")
    for flag in ("host-driver-version", "host-cuda-version"):
        for value in found.get(flag, []):
            if not value or not all(part.isdecimal() and part.isascii() for part in value.split(".")):
                raise UsageError(f"{where}: --{flag} {value!r} is not a version such as 550.54.15")
    if subcommand == "chmod":
        modes = found.get("mode", [])
        if not modes or not modes[0] or not all(c in "01234567" for c in modes[0]) or int(modes[0], 8) > 0o777:
            said = repr(modes[0]) if modes else "none"
            raise UsageError(f"{where}: --mode {said}: an octal mode of permission bits (at most 777) is needed")


# -- what the work reads --------------------------------------------------------------------


def _names_a_driver(work: list[Invocation]) -> bool:
    """Whether the hooks name the driver they were made for (then the running one is read)."""
    for subcommand, given in work:
        for flag, values in given:
            if (subcommand, flag) == ("enable-cuda-compat", "host-driver-version"):
                return True
            if (subcommand, flag) == ("create-symlinks", "link") and any(_library_version(v) for v in values):
                return True
    return False


def _library_version(link: str) -> str | None:
    """The driver version in a --link's target named like a versioned driver library, else None."""
    target = os.path.basename(link.partition("::")[0])
    if not target.startswith(_DRIVER_LIBRARIES) or ".so." not in target:
        return None
    suffix = target.split(".so.", 1)[1]
    parts = suffix.split(".")
    return suffix if len(parts) >= 2 and all(p.isdecimal() for p in parts) else None


def _check_driver(flags: dict[str, list[str]], running: str | None) -> None:
    """A spec made for another driver than the running one stops the start."""
    if running is None:
        return
    for version in flags.get("enable-cuda-compat host-driver-version", []):
        if version != running:
            raise InjectionError(
                f"the CDI spec was generated for NVIDIA driver {version} but {running} is running: generate it again "
                "(nvidia-ctk cdi generate, or restart the device plugin that writes it)"
            )
    for spec in flags.get("create-symlinks link", []):
        made_for = _library_version(spec)
        if made_for is not None and made_for != running:
            target = os.path.basename(spec.partition("::")[0])
            raise InjectionError(
                f"the CDI spec links {target}, a library of NVIDIA driver {made_for}, but {running} is running: generate the spec again"
            )


def _compat_directory(flags: dict[str, list[str]], container: Container, log: RunLog | None) -> str | None:
    """The image's CUDA compat directory when enable-cuda-compat asks for it and its libcuda is a
    newer major than the driver's (ponytail.plan.compat decides, as for the prestart hook)."""
    versions = flags.get("enable-cuda-compat host-driver-version", [])
    if not versions:
        return None
    from ponytail.container.image_compat import COMPAT_DIR, read_compat_dir
    from ponytail.plan.compat import decide

    where = (flags.get("enable-cuda-compat cuda-compat-container-root") or [COMPAT_DIR])[-1]
    found = read_compat_dir(container.rootfs, where)
    if found is None:
        return None
    compat = decide(*found, versions[-1], container.env)
    if log is not None:
        log.write("info", f"enable-cuda-compat: {compat.directory}: {compat.why}")
    return compat.directory if compat.used else None


def _application_profile(char_devices: tuple[tuple[int, int], ...]) -> bytes | None:
    """The driver's application profile that shows EGL and Vulkan only the container's GPUs
    (their minors as a bit mask), or None when it has none."""
    from ponytail.capabilities import NVIDIA_MAJOR

    mask = 0
    for major, minor in char_devices:
        if major == NVIDIA_MAJOR and minor < 64:
            mask |= 1 << minor
    if not mask:
        return None
    return (
        '{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",' + hex(mask) + ']}],'
        '"rules":[{"pattern":[],"profile":"_container_"}]}'
    ).encode()


def _soname_links(rootfs: str, folder: str) -> list[Symlink]:
    """SONAME links for the libraries in ``folder`` of the rootfs, from their ELF headers read
    inside the rootfs (create-soname-symlinks)."""
    from ponytail.container.image_compat import sonames_in
    from ponytail.plan.operations import Symlink

    return [Symlink(os.path.join(folder, soname), name, f"create-soname-symlinks --folder {folder}")
            for name, soname in sonames_in(rootfs, folder)]


# -- a spec's hook, read before a start ---------------------------------------------------


def parse_hook_line(path: str, args: list[str]) -> Invocation | UsageError | None:
    """What a start makes of a CDI spec's hook ``path`` with ``args`` (``args[0]``: the program's
    name, as specs write it), read with the hook's own parser: its Invocation where ponytail serves
    it; else the UsageError the hook answers (an UnknownSubcommand: warned about, or refused where
    [cdi] unknown_nvidia_hooks says "fail"; any other, such as an unknown flag: the start stops).
    None where ``path`` is not one of NVIDIA's hook names."""
    name = os.path.basename(path)
    if name not in NAMES:
        return None
    try:
        return parse(name, list(args[1:]))
    except UsageError as e:
        return e
