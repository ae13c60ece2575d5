"""``ponytail cdi generate | list | check``: the click commands."""

from __future__ import annotations

import sys

import click

from ponytail.cli.clickclasses import CONTEXT, Group, one_line_errors
from ponytail.config import Config
from ponytail.engines.cdi.files import DEFAULT_STRATEGY, STRATEGIES

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
    from ponytail.cli.cdigenerate import run_generate  # a plain command line gets there without click

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
    from ponytail.engines.cdi.files import generate as make_spec
    from ponytail.engines.cdi.files import qualified_names, read_spec

    with one_line_errors():
        specs = [read_spec(spec_file)] if spec_file is not None else []
        if spec_file is None:
            spec, _, features = make_spec(_config(config), "/ponytail", strategy)
            specs = [spec, *features.values()]  # and the multi-node features this host has (nvidia.com/gds=all ...)
    for name in (n for spec in specs for n in qualified_names(spec)):
        click.echo(name)


@cdi.command(context_settings=CONTEXT)
@click.argument("spec_file", metavar="[FILE]", required=False)
@_CONFIG
def check(spec_file: str | None, config: str | None) -> None:
    """Is the spec FILE (default: nvidia.yaml or .json in /etc/cdi, /var/run/cdi) still true for
    the running driver? Exit 0 yes, 1 stale (generate it again), 2 no valid spec."""
    from ponytail.engines.cdi.files import default_spec_path, read_spec, stale

    with one_line_errors():
        path = spec_file or default_spec_path()
        reasons = stale(read_spec(path), _config(config))
    if reasons:
        for reason in reasons:
            click.echo(f"stale: {reason}")
        click.echo(f"{path} is stale: run 'ponytail cdi generate --output {path}'", err=True)
        sys.exit(1)
    click.echo(f"{path}: up to date")


def _config(path: str | None) -> Config:
    from ponytail.config import config_path, load_config

    return load_config(*config_path(path))
