"""``ponytail cdi generate | list | check``: the click commands."""

from __future__ import annotations

import sys

import click

from ponytail.cdi.files import DEFAULT_STRATEGY, STRATEGIES, default_spec_path, qualified_names, read_spec, stale
from ponytail.cdi.files import generate as make_spec
from ponytail.cdi.generate import run_generate  # a plain command line gets there without click
from ponytail.cli.clickclasses import CONTEXT, Group, one_line_errors
from ponytail.config import Config, config_path, load_config
from ponytail.fs.hostfiles import under_root

_CONFIG = click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook); the spec's hook is run with it.")


@click.group(cls=Group, context_settings=CONTEXT)
def cdi() -> None:
    """Container Device Interface specs for podman, containerd, CRI-O and Docker.

    \b
    sudo ponytail cdi generate --output /etc/cdi/nvidia.yaml
    podman run --device nvidia.com/gpu=0 IMAGE nvidia-smi
    ponytail cdi check      # exit 1 when the driver changed since: generate again
    """


@cdi.command(context_settings=CONTEXT)
@click.option("--output", "-output", "output", metavar="FILE", help="Write the spec here, atomically (default: stdout). Engines read /etc/cdi and /var/run/cdi, .yaml or .json.")
@click.option("--format", "-format", "form", type=click.Choice(["yaml", "json"]), help="Default: from the --output extension, else yaml.")
@click.option("--device-name-strategy", "strategy", type=click.Choice(STRATEGIES), default=DEFAULT_STRATEGY, show_default=True,
              help="Name GPUs by index (0, MIG 0:1:0), by UUID (GPU-..., MIG-...), or both (what Docker's --gpus and the device plugin ask for).")
@click.option("--spec-version", "version", metavar="X.Y.Z", help="Declare this cdiVersion (default: the lowest that has every feature the spec uses).")
@click.option("--capabilities", "-capabilities", "capabilities", metavar="LIST", default="all", show_default=True, help="Driver capabilities whose files the spec mounts.")
@click.option("--hook-path", "hook_path", metavar="CMD", help="The ponytail command the spec's hook runs (default: this install's, by absolute path).")
@_CONFIG
def generate(output: str | None, form: str | None, strategy: str, version: str | None, capabilities: str, hook_path: str | None, config: str | None) -> None:
    """Write a CDI spec of this host's GPUs (kind nvidia.com/gpu): one device per GPU, per
    MIG device, and 'all'; the same plan as the hook, rendered as data. The same host always
    gives the same bytes."""
    code = run_generate(output, form, strategy, version, capabilities, hook_path, config)
    if code:
        sys.exit(code)


@cdi.command("list", context_settings=CONTEXT)
@click.argument("spec_file", metavar="[FILE]", required=False)
@click.option("--device-name-strategy", "strategy", type=click.Choice(STRATEGIES), default=DEFAULT_STRATEGY, show_default=True,
              help="Without FILE: the names of which strategy.")
@_CONFIG
def list_devices(spec_file: str | None, strategy: str, config: str | None) -> None:
    """The device names a spec FILE offers, or (without FILE) this host would offer."""
    with one_line_errors():
        specs = [read_spec(spec_file)] if spec_file is not None else []
        if spec_file is None:
            spec, _, features = make_spec(_config(config), "/ponytail", strategy)
            specs = [spec, *features.values()]  # and the multi-node features this host has (nvidia.com/gds=all ...)
    for name in (n for spec in specs for n in qualified_names(spec)):
        click.echo(name)
    _show_clashes({spec["kind"] for spec in specs})


def _show_clashes(kinds: set[str]) -> None:
    """The kinds listed that more than one file of the engines' spec directories defines (on stderr)."""
    from ponytail.cdi.owners import clash_message, clashes, scan

    for kind, group in clashes(scan()).items():
        if kind in kinds:
            click.echo(f"clash: {clash_message(kind, group)}", err=True)


@cdi.command(context_settings=CONTEXT)
@click.argument("spec_file", metavar="[FILE]", required=False)
@_CONFIG
def check(spec_file: str | None, config: str | None) -> None:
    """Is the spec FILE (default: nvidia.yaml or .json in /etc/cdi, /var/run/cdi) still true for
    the running driver? Exit 0 yes, 1 stale (generate it again), 2 no valid spec."""
    from ponytail.cdi.owners import SpecFile, generator_of, regenerate_advice

    with one_line_errors():
        path = spec_file or default_spec_path()
        spec = read_spec(path)
        reasons = stale(spec, _config(config))
    if reasons:
        for reason in reasons:
            click.echo(f"stale: {reason}")
        owned = SpecFile(path, spec["kind"], generator_of(spec, path), (), spec)
        click.echo(f"{owned.label} is stale: {regenerate_advice(owned)}", err=True)  # never over another generator's file
        sys.exit(1)
    click.echo(f"{path}: up to date")


@cdi.command(context_settings=CONTEXT)
@click.option("--root", "root", metavar="DIR", default="/", show_default=True, help="The node's / (e.g. /host from a pod).")
@click.option("--may-write", "may_write", metavar="PATH",
              help="Only say whether ponytail may write its nvidia.com/gpu spec to PATH (a path on the node): exit 1, with why, when not.")
def owners(root: str, may_write: str | None) -> None:
    """Who owns each CDI kind on this node: every spec file in /etc/cdi and /var/run/cdi, its kind and
    the generator that wrote it (ponytail, nvidia-ctk, another); each kind two files define is a clash
    (exit 1): the engines refuse or shadow its devices."""
    from ponytail.cdi.owners import clash_message, clashes, scan, write_refusal

    if may_write is not None:
        refusal = write_refusal("nvidia.com/gpu", under_root(root, may_write), root)
        if refusal is not None:
            click.echo(f"ponytail: {refusal}", err=True)
            sys.exit(1)
        return
    files = scan(root)
    for f in files:
        click.echo(f"{f.path}\t{f.kind or '?'}\t{f.generator}" + (f"\t{f.error}" if f.error else f"\t{len(f.devices)} device(s)"))
    found = clashes(files)
    for kind, group in found.items():
        click.echo(f"clash: {clash_message(kind, group)}")
    if found:
        sys.exit(1)


def _config(path: str | None) -> Config:
    return load_config(*config_path(path))
