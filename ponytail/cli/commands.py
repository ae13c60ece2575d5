"""The click command: help that teaches, ``info``, and clear usage errors.

The hook's plain command line is parsed by ponytail.options without importing
click (see ponytail.entry); both routes end in ponytail.hooks.prestart.run_hook.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import TypeVar

import click

from ponytail import __version__
from ponytail.capabilities import FEATURES, IMEX_FEATURE
from ponytail.cli.clickclasses import CONTEXT, Group, OneLineErrors, one_line_errors, remember_options_before
from ponytail.cli.info import run_info
from ponytail.config import CONFIG_ENV_VAR, config_path, load_config
from ponytail.engines.registry import ENGINES
from ponytail.engines.registry import NAMES as ENGINE_NAMES
from ponytail.errors import EXIT_INJECTION_FAILED, UsageError
from ponytail.hooks.command import installed_command, transient_warning
from ponytail.install import nvidiahook as nvidiainstall
from ponytail.install.files import write_atomically
from ponytail.options import HOOK_OPTIONS, HookOptions

F = TypeVar("F", bound=Callable[..., object])


def _hook_options(function: F) -> F:
    for spec in reversed(HOOK_OPTIONS):
        names = (f"-{spec.name}", f"--{spec.name}")
        if spec.metavar is None:
            function = click.option(*names, spec.name, is_flag=True, help=spec.help)(function)
        else:
            function = click.option(*names, spec.name, metavar=spec.metavar, help=spec.help)(function)
    return function


@click.group(cls=Group, invoke_without_command=True, context_settings=CONTEXT)
@_hook_options
@click.version_option(__version__, "-version", "--version", prog_name="ponytail")
@click.pass_context
def cli(ctx: click.Context, **values: object) -> None:
    """Give a container the host's NVIDIA GPUs (an OCI prestart hook).

    \b
    Hook mode (no -root): the container engine runs ponytail with the OCI state
    on stdin; it reads the bundle's config.json, enters the container's mount
    namespace and bind-mounts the GPU device nodes, the driver's libraries and
    nvidia-smi into the rootfs, then refreshes the rootfs's linker cache.

    \b
    Examples:
      ponytail -debug                                 # what would be injected here
      ponytail -root /tmp/test-rootfs -device 0       # inject GPU 0 into a rootfs by hand
      ponytail -root /tmp/test-rootfs -libs /usr/lib/x86_64-linux-gnu/libcuda.so.1
      ponytail info --json                            # driver version and GPUs

    The options below may also stand before a subcommand that takes them: they apply to it
    (ponytail -config FILE info is ponytail info -config FILE). Every option takes both
    spellings, -name and --name.

    Exit status: 0 done, 1 injection failed, 2 bad usage, config or input.
    Every run is logged to [log] file (default /var/log/ponytail.log).
    """
    if ctx.invoked_subcommand is not None:  # ponytail -config FILE info: the subcommand takes them
        remember_options_before(ctx, [spec.name for spec in HOOK_OPTIONS])
    else:
        from ponytail.hooks.prestart import run_hook

        ctx.exit(run_hook(HookOptions(**values)))  # type: ignore[arg-type]  # click gives each option the type HOOK_OPTIONS declares


@cli.command(context_settings=CONTEXT)
@click.option("--json", "-json", "as_json", is_flag=True, help="Print JSON: {driver_version, cuda_version, gpus: [...]}.")
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook).")
def info(as_json: bool, config: str | None) -> None:
    """Driver and CUDA version, and each GPU's index, minor, PCI bus id, UUID, model and MIG devices.

    The index is the GPU's position in PCI bus order (what nvidia-smi shows);
    the minor is the N of /dev/nvidiaN, which need not equal the index.
    """
    code = run_info(as_json, config)
    if code:
        sys.exit(code)


@cli.command("list", context_settings=CONTEXT)
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook).")
@click.option("-device", "--device", "device", metavar="SEL", default="all", show_default=True, help="GPUs, as for the hook.")
@click.option("-capabilities", "--capabilities", "capabilities", metavar="LIST", help="Driver capabilities (default utility,compute).")
@click.option("-driver", "--driver", "driver", metavar="NAME", help="A registered [drivers.NAME] tree, as PONYTAIL_DRIVER=NAME selects it.")
@click.option("-feature", "--feature", "features", metavar="NAME[=SEL]", multiple=True,
              help=f"An opt-in feature, as its variable asks for it (repeatable): {IMEX_FEATURE}[=all|0,1] ({FEATURES[IMEX_FEATURE].variable}), "
                   + ", ".join(f"{name} ({f.variable}=enabled)" for name, f in FEATURES.items() if name != IMEX_FEATURE) + ".")
def list_paths(config: str | None, device: str, capabilities: str | None, driver: str | None, features: tuple[str, ...]) -> None:
    """Every host path that would be injected, one per line: device nodes, libraries,
    binaries, driver files and firmware, daemons' sockets (like nvidia-container-cli list).
    Which driver tree they come from, and why, is said on stderr."""
    from ponytail.container.request import build_request, feature_options
    from ponytail.plan.make import make_plan

    with one_line_errors():
        request = build_request(cli_device=device, cli_capabilities=capabilities, env=feature_options(features))
        loaded = load_config(*config_path(config))
        asked = (driver, "--driver") if driver is not None else None
        plan, _ = make_plan(loaded, request, dry_run=True, driver=asked)  # every problem, not the first
    if plan.problems:
        click.echo(f"ponytail: error: {'; '.join(plan.problems)}", err=True)
        sys.exit(EXIT_INJECTION_FAILED)
    for choice in plan.choices:
        click.echo(f"ponytail: {choice}", err=True)
    for path in plan.host_paths():
        click.echo(path)


@cli.command("install-hook", context_settings=CONTEXT)
@click.option("--dir", "-dir", "directory", metavar="DIR", default=None,
              help="Hooks directory. Default: /usr/share/containers/oci/hooks.d (what Debian's podman reads).")
@click.option("--config", "-config", "config", metavar="FILE", default=None,
              help="Config file the hook is run with (it must exist, or pass --write-config). Default: $PONYTAIL_CONFIG; "
                   "without it none is named: the hook reads /etc/ponytail/config.toml if it exists, else its built-in defaults.")
@click.option("--write-config", "write_config", is_flag=True,
              help="Write a default config file (empty: the built-in defaults) at --config FILE if there is none.")
@click.option("--path", "-path", "command", metavar="CMD", default=None,
              help="The hook command. Default: this install's ponytail command.")
@click.option("--dry-run", "-dry-run", "dry_run", is_flag=True, help="Print the hook file and where it would go; write nothing.")
def install_hook(directory: str | None, config: str | None, write_config: bool, command: str | None, dry_run: bool) -> None:
    """Write ponytail.json into a hooks.d directory (podman, CRI-O).

    \b
    The hook runs at prestart of containers started with the annotation
    com.example.gpu=true, e.g.
      podman run --annotation com.example.gpu=true -e NVIDIA_VISIBLE_DEVICES=0 IMAGE nvidia-smi
    Its path is this install's absolute ponytail command: podman silently skips a hook
    whose path does not exist. Podman 4.3 on Debian reads only
    /usr/share/containers/oci/hooks.d, or the directories given with --hooks-dir.
    """
    from ponytail.engines.hooksd import DEFAULT_HOOKS_DIR, FILE_NAME, hook_file_text
    from ponytail.engines.hooksd import install_hook as write_hook_file

    command = command or installed_command()
    from_env = config is None and bool(os.environ.get(CONFIG_ENV_VAR))
    if from_env:  # what this shell's ponytail commands read: the hook reads the same
        config = os.path.abspath(os.environ[CONFIG_ENV_VAR])
    with one_line_errors():
        if command is None:
            raise UsageError("cannot find this install's ponytail command; pass --path CMD")
        if dry_run:
            if config is not None and not os.path.lexists(config) and not write_config:
                raise UsageError(f"--config {config}: no such file; every GPU container would fail to start until it exists")
            click.echo(f"would write {os.path.join(directory or DEFAULT_HOOKS_DIR, FILE_NAME)}:")
            click.echo(hook_file_text(command, config), nl=False)
            click.echo("dry run: nothing written")
            return
        wrote_config = _hook_config(config, write_config)
        path = write_hook_file(directory or DEFAULT_HOOKS_DIR, command, config)
    warning = transient_warning(command)
    if warning is not None:  # podman would run a command that goes with the checkout
        click.echo(f"ponytail: warning: {warning}", err=True)
    if from_env:
        click.echo(f"the hook reads {config}, the config ${CONFIG_ENV_VAR} names (pass --config FILE for another)")
    if wrote_config:
        click.echo(f"wrote {config}: an empty config (the built-in defaults; see config/config.toml for every key)")
    with_config = f" -config {config}" if config else ""
    click.echo(f"wrote {path}: runs {command}{with_config} at prestart of containers annotated com.example.gpu=true")


DEFAULT_CONFIG_TEXT = (
    "# ponytail configuration, written by 'ponytail install-hook --write-config'.\n"
    "# Every key is optional: this file means the built-in defaults (config/config.toml lists every key).\n"
)


def _hook_config(config: str | None, write_config: bool) -> bool:
    """Refuse a --config FILE that does not exist (every GPU container would fail to start),
    unless --write-config asks for a default one there; True when one was written."""
    if config is None:
        if write_config:
            raise UsageError("--write-config: name the file with --config FILE")
        return False
    if not os.path.isabs(config):
        raise UsageError(f"--config {config}: must be an absolute path (the hook runs in the bundle directory)")
    if os.path.lexists(config):
        return False
    if not write_config:
        raise UsageError(
            f"--config {config}: no such file; every GPU container would fail to start until it exists: "
            "create it, or pass --write-config to write a default one there"
        )

    write_atomically(config, DEFAULT_CONFIG_TEXT)
    return True


@cli.command("install-docker-gpus", context_settings=CONTEXT)
@click.option("--bin-dir", "-bin-dir", "bin_dir", metavar="DIR", default=None,
              help="Where to make the link: a directory on dockerd's PATH. Default: /usr/local/bin.")
@click.option("--path", "-path", "command", metavar="CMD", default=None,
              help="The ponytail command the link leads to. Default: this install's.")
@click.option("--dry-run", "-dry-run", "dry_run", is_flag=True, help="Say what would be done; change nothing.")
@click.option("--uninstall", "-uninstall", "uninstall", is_flag=True, help="Remove the link again (only if it is ponytail's).")
def install_docker_gpus(bin_dir: str | None, command: str | None, dry_run: bool, uninstall: bool) -> None:
    """Make `docker run --gpus` work with ponytail alone (Docker 20.10 and 25+).

    \b
    dockerd offers --gpus only when a program named nvidia-container-runtime-hook is on
    its PATH when it starts; it then sets NVIDIA_VISIBLE_DEVICES (all, 0..N-1, or the
    device= ids) in the container and runs that program as a prestart hook. This makes
    DIR/nvidia-container-runtime-hook a link to ponytail, which runs ponytail's hook;
    a file of that name that is not ponytail's (NVIDIA's toolkit) is never replaced.
    The hook reads $PONYTAIL_CONFIG from dockerd's environment (Docker 25+), else
    /etc/ponytail/config.toml. Restart dockerd afterwards. Examples:
      ponytail install-docker-gpus && systemctl restart docker
      docker run --rm --gpus all IMAGE nvidia-smi
      docker run --rm --gpus '"device=0,GPU-<uuid>"' IMAGE nvidia-smi
    """
    from ponytail.install import dockergpus

    with one_line_errors():
        command = command or installed_command()
        if command is None:
            raise UsageError("cannot find this install's ponytail command; pass --path CMD")
        action = dockergpus.uninstall if uninstall else dockergpus.install
        lines = action(bin_dir or dockergpus.DEFAULT_BIN_DIR, command, dry_run)
    for line in lines:
        click.echo(line, err=line.startswith("ponytail: warning:"))


@cli.command("install-nvidia-hook", context_settings=CONTEXT)
@click.option("--at", "at", metavar="PATH", multiple=True,
              help="A path a spec names as its hook (nvidia-ctk's or the device plugin's --nvidia-cdi-hook-path); repeatable.")
@click.option("--spec", "specs", metavar="FILE", multiple=True, help="A CDI spec whose NVIDIA hook paths to serve; repeatable.")
@click.option("--toolkit-dir", "toolkit_dirs", metavar="DIR", multiple=True,
              help="A toolkit directory (the GPU Operator's /usr/local/nvidia/toolkit): DIR/nvidia-cdi-hook.")
@click.option("--path", "-path", "command", metavar="CMD", default=None,
              help="The ponytail command the hook scripts run. Default: this install's.")
@click.option("--config", "-config", "config", metavar="FILE", default=None,
              help="The config file the hooks read. Default: $PONYTAIL_CONFIG of the hook's environment, else /etc/ponytail/config.toml.")
@click.option("--dry-run", "-dry-run", "dry_run", is_flag=True, help="Say what would be done; change nothing.")
@click.option("--uninstall", "-uninstall", "uninstall", is_flag=True, help="Remove the hook scripts again (only ponytail's).")
def install_nvidia_hook(at: tuple[str, ...], specs: tuple[str, ...], toolkit_dirs: tuple[str, ...], command: str | None,
                        config: str | None, dry_run: bool, uninstall: bool) -> None:
    """Serve NVIDIA's CDI specs' hooks (nvidia-cdi-hook, nvidia-ctk hook) with ponytail.

    \b
    NVIDIA's specs (nvidia-ctk cdi generate, the device plugin's CDI modes, the DRA
    driver's claims) run their hook binary by absolute path. This makes each such path a
    small script that runs ponytail, which reads the hooks' subcommands into its own
    in-root work (one ponytail process does all the hooks of a start; the later hooks end
    in the script). A file there that is not ponytail's (NVIDIA's toolkit) is never
    replaced nor removed. Default: /usr/bin/nvidia-cdi-hook.
    Examples:
      ponytail install-nvidia-hook --spec /etc/cdi/nvidia.yaml
      ponytail install-nvidia-hook --at /usr/bin/nvidia-ctk          # the device plugin's default
      ponytail install-nvidia-hook --toolkit-dir /usr/local/nvidia/toolkit
      ponytail install-nvidia-hook --uninstall --at /usr/bin/nvidia-cdi-hook
    """
    with one_line_errors():
        command = command or installed_command()
        if command is None:
            raise UsageError("cannot find this install's ponytail command; pass --path CMD")
        warnings: list[str] = []
        paths = nvidiainstall.hook_paths(at, specs, toolkit_dirs, warnings)
        if uninstall:
            lines, warnings = nvidiainstall.uninstall(paths, command, dry_run), []
        else:
            lines = nvidiainstall.install(paths, command, dry_run, config)
    for line in lines:
        click.echo(line)
    for warning in warnings:
        click.echo(f"ponytail: warning: {warning}", err=True)


@cli.command("dev-char-links", context_settings=CONTEXT)
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (its [host] dev_root and proc_root).")
@click.option("--dev-root", "-dev-root", "dev_root", metavar="DIR", default=None,
              help="The /dev to link in (e.g. the node's, mounted at /host/dev). Default: [host] dev_root, /dev.")
@click.option("--dry-run", "-dry-run", "dry_run", is_flag=True, help="Say what would be done; change nothing.")
def dev_char_links(config: str | None, dev_root: str | None, dry_run: bool) -> None:
    """Make /dev/char/MAJOR:MINOR links for every NVIDIA device node, so that running
    containers keep their GPUs on 'systemctl daemon-reload' under the systemd cgroup driver.

    \b
    runc hands each device rule to systemd as DeviceAllow=/dev/char/M:m and leaves out a
    rule whose link is missing; the driver's nodes (made by nvidia-modprobe, not udev) have
    none. Links the GPUs, nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset and the
    nvidia-caps nodes, as udev does (char/195:0 -> ../nvidia0). Idempotent; a file or a link
    to something else at a link's name is left as it is, said, and the exit status is 1.
    The ponytail-dev-char-links units and udev rule (packaging/) run it at boot and when a
    node appears. Examples:
      ponytail dev-char-links --dry-run
      ponytail dev-char-links --dev-root /host/dev
    """
    from ponytail.guard.devchar import make_char_links

    with one_line_errors():
        loaded = load_config(*config_path(config))
        lines, complete = make_char_links(dev_root or loaded.dev_root, loaded.proc_root, dry_run)
    for line in lines:
        click.echo(line, err=line.startswith("ponytail: warning:"))
    if not complete:
        sys.exit(1)


@cli.command("guard", context_settings=CONTEXT)
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (its [guard] table; as for the hook).")
@click.option("--once", is_flag=True, help="One pass, then exit: 0 all well, 1 something found or repaired.")
@click.option("--report-only", "report_only", is_flag=True, help="Give nothing back and remove no record: only say what is found.")
@click.option("--json", "-json", "as_json", is_flag=True, help="With --once: print JSON {watched, lost, repaired, stale, containers: [...]}.")
@click.option("--textfile", metavar="PATH", default=None,
              help="Write Prometheus metrics here after each pass (node exporter's textfile collector). Default: [guard] textfile.")
@click.option("--interval", type=click.FloatRange(min=1.0, max=86400.0), metavar="SECONDS", default=None,
              help="Seconds between the daemon's safety passes. Default: [guard] interval.")
@click.option("--cdi-spec", "cdi_specs", metavar="PATH", multiple=True,
              help="A CDI spec of ponytail's to write again (cdi generate --output PATH) on the driver's events.")
@click.option("--events", metavar="FIFO", default=None, hidden=True, help="Tests: read events from FIFO instead of the kernel.")
@click.option("--watch", "also", metavar="SUBSYSTEM[:NAME]", multiple=True, hidden=True, help="Tests: act on these uevents too.")
def guard(config: str | None, once: bool, report_only: bool, as_json: bool, textfile: str | None, interval: float | None,
          cdi_specs: tuple[str, ...], events: str | None, also: tuple[str, ...]) -> None:
    """Watch the GPU containers ponytail started and give back GPU nodes their device rules lost.

    \b
    Each start through the hook or the CDI hook records the container (its process, cgroups,
    GPU nodes, driver) in root-only files ([guard] records). A pass checks each recorded
    container that still runs: its cgroup v1 devices.list, or its cgroup v2 device programs,
    must allow every node it was given; 'systemctl daemon-reload' under the systemd cgroup
    driver rewrites them and can take the GPUs away. The guard gives back exactly the lost
    nodes (never more; --report-only or [guard] repair = false: it only says so), one line per
    container, and reports containers still bound to a driver that no longer runs (a deleted
    libcuda mapped, another driver version, a stale CDI spec). Records of containers that are
    gone are removed. Without --once it runs as the node's agent: a pass on the driver's udev
    events (after making /dev/char links and --cdi-spec files true again) and every --interval.
    Examples:
      ponytail guard --once --report-only
      ponytail guard --once --json
      ponytail guard --textfile /var/lib/node_exporter/textfile/ponytail.prom --cdi-spec /var/run/cdi/ponytail.yaml
    """
    from ponytail.guard.daemon import run_daemon, run_once

    with one_line_errors():
        loaded = load_config(*config_path(config))
    repair = loaded.guard_repair and not report_only
    metrics = loaded.guard_textfile if textfile is None else textfile
    if once:
        sys.exit(run_once(loaded, repair, as_json, metrics))
    if as_json:
        raise click.UsageError("--json goes with --once (the daemon writes its status to --textfile and the log)")
    sys.exit(run_daemon(loaded, config, repair, metrics, interval, events, cdi_specs, also))


@cli.command("configure", context_settings=CONTEXT)
@click.option("--runtime", "engine", required=True, type=click.Choice(ENGINE_NAMES), help="The engine whose configuration to edit.")
@click.option("--config-file", "config_file", metavar="PATH", default=None,
              help="The engine's config. Default: " + ", ".join(f"{e.config_path} ({e.name})" for e in ENGINES)
                   + "; CRI-O's drop-in goes to crio.conf.d/ beside crio.conf.")
@click.option("--set-as-default", is_flag=True, help="Make ponytail the engine's default runtime (podman: run the hook for every container).")
@click.option("--dry-run", is_flag=True, help="Print the change as a diff; write nothing.")
@click.option("--uninstall", is_flag=True, help="Take ponytail out again (restores the backup when nothing else changed since).")
@click.option("--path", "command", metavar="CMD", default=None,
              help="ponytail-runtime (podman: ponytail) as the engine will run it. Default: this install's.")
@click.option("--name", default="ponytail", show_default=True, help="The runtime's name (a RuntimeClass handler).")
@click.option("--state-dir", "state_dir", metavar="DIR", default="/var/lib/ponytail/configure", show_default=True,
              help="Where the file as it was before ponytail is kept, for --uninstall (no engine reads there).")
@click.option("--drop-in-config", "drop_in", metavar="PATH", default=None,
              help="containerd 2.x: write the runtime to this drop-in and import it from config.toml (default: a drop-in in "
                   "the first directory config.toml imports, else config.toml itself).")
def configure(engine: str, config_file: str | None, set_as_default: bool, dry_run: bool, uninstall: bool,
              command: str | None, name: str, state_dir: str, drop_in: str | None) -> None:
    """Register ponytail with docker, containerd, CRI-O or podman by editing the engine's config.

    \b
    Idempotent (a second run changes nothing), atomic, the original kept in --state-dir (outside
    every directory an engine reads); every other key and comment stays. --uninstall leaves the
    file byte for byte as it was (or, if it was edited since, takes out exactly what ponytail
    added) and nothing of ponytail's behind. Examples:
      ponytail configure --runtime containerd --dry-run
      ponytail configure --runtime containerd --set-as-default
      ponytail configure --runtime docker --config-file /host/etc/docker/daemon.json --path /usr/local/bin/ponytail-runtime
    """
    from ponytail.install.configure import configure as run_configure

    with one_line_errors():
        lines = run_configure(engine, config_file, command, name, set_as_default, dry_run, uninstall, state_dir, drop_in)
    for line in lines:
        click.echo(line, err=line.startswith("ponytail: warning:"))


@cli.command("check", context_settings=CONTEXT)
@click.option("--json", "-json", "as_json", is_flag=True, help="Print JSON: {ok, findings: [{area, subject, level, message}]}.")
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook).")
@click.option("--bundle", "-bundle", "bundle", metavar="DIR", help="Also check this OCI bundle's container (config.json, rootfs, env).")
@click.option("--rootfs", "-rootfs", "rootfs", metavar="DIR", help="Also check this rootfs (an unpacked image), with an empty env.")
@click.option("--engine", "-engine", "engines", multiple=True, type=click.Choice(ENGINE_NAMES),
              help="Check this engine (again for more). Default: those whose service runs and those configured for ponytail.")
@click.option("--engine-root", "engine_root", metavar="DIR", default="/", hidden=True, help="Read the engines' configuration under DIR.")
def check(as_json: bool, config: str | None, bundle: str | None, rootfs: str | None, engines: tuple[str, ...], engine_root: str) -> None:
    """The doctor: is this host, its container engines, and (with --bundle or --rootfs) a
    container ready for GPUs? One line per finding: what is wrong and what to do.

    \b
    Host: driver loaded; kernel module, libraries and firmware of one version; device
    nodes; nvidia-uvm; nvidia-persistenced; cgroup version; each registered driver tree.
    Engines: those in use (--engine, else each whose service runs or that is configured for
    ponytail) are configured to run ponytail; one only installed is not checked.
    Container: which libcuda.so.1 and libnvidia-ml.so.1 its loader will pick.
    Exit status: 0 all is well, 1 something needs attention, 2 bad usage or config.
    """
    from ponytail.doctor.check import run_check

    with one_line_errors():
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() and not as_json else None
        report, status = run_check(load_config(*config_path(config)), bundle, rootfs, engine_root, as_json, engines, width)
    click.echo(report, nl=False)
    sys.exit(status)


@cli.command("cdi-hook", cls=OneLineErrors, hidden=True, context_settings=CONTEXT)
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (absolute).")
@click.option("--driver-version", "driver_version", metavar="V", help="Refuse to start when another driver is running.")
@click.option("--major", "major", nargs=2, multiple=True, metavar="MODULE N", help="A module's major the spec's nodes were made with.")
@click.option("--gpu", "gpu", nargs=3, multiple=True, metavar="MINOR BUS-ID UUID", help="A GPU the spec's nodes were made for.")
@click.option("--link", "link", nargs=3, multiple=True, metavar="PATH TARGET LIBRARY", help="A SONAME link to make in the rootfs.")
@click.option("--device-link", "device_link", nargs=2, multiple=True, metavar="PATH TARGET",
              help="A device node's link (a GPU's /dev/dri/by-path link) to make in the rootfs.")
@click.option("--mask-proc", "mask_proc", is_flag=True, help="Mask /proc/driver/nvidia to the GPUs whose nodes the engine created.")
@click.option("--ldconfig", "ldconfig", metavar="PATH", help="Refresh the rootfs's linker cache with the host's ldconfig.")
@click.option("--directory", "directory", multiple=True, metavar="DIR", help="A directory for the linker cache.")
@click.option("--check", "check", nargs=2, multiple=True, metavar="SONAME PATH", help="Check the cache resolves SONAME to PATH.")
def cdi_hook(**options: object) -> None:
    """The createContainer hook of a CDI spec written by 'ponytail cdi generate' (OCI state on
    stdin); not meant to be run by hand."""
    # its plain command line takes the fast path in ponytail.entry (no click); this one gives help and words the errors
    from ponytail.hooks.cdi import main as run_cdi_hook

    sys.exit(run_cdi_hook(options))


@cli.command("help", context_settings=CONTEXT)
@click.argument("command", nargs=-1)
@click.pass_context
def help_command(ctx: click.Context, command: tuple[str, ...]) -> None:
    """Show the help of ponytail, or of COMMAND: ponytail help cdi generate."""
    target: click.Command = cli
    path = ["ponytail"]
    for name in command:
        sub = target.get_command(ctx, name) if isinstance(target, click.Group) else None
        if sub is None:
            raise click.UsageError(f"no command '{' '.join([*path[1:], name])}': 'ponytail help' lists them", ctx)
        target, path = sub, [*path, name]
    with click.Context(target, info_name=" ".join(path)) as shown:
        click.echo(target.get_help(shown))


@cli.command("version", context_settings=CONTEXT)
def version_command() -> None:
    """Print ponytail's version (as 'ponytail --version')."""
    click.echo(f"ponytail, version {__version__}")


from ponytail.cli.cdi import cdi  # noqa: E402 - the cdi group beside the commands above

cli.add_command(cdi)

from ponytail.cli.migrate import migrate  # noqa: E402 - the migration from NVIDIA's toolkit

cli.add_command(migrate)

from ponytail.cli.dra import dra_plugin  # noqa: E402 - the DRA kubelet plugin

cli.add_command(dra_plugin)

from ponytail.cli.habits import config, runtime  # noqa: E402 - NVIDIA's command lines: an alias or a pointer

cli.add_command(runtime)
cli.add_command(config)
