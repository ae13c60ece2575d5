"""The hook's command-line options, defined once.

Both the fast parser (the hook's hot path, no click import) and the click
command (help, subcommands, error messages) are built from this table.
Each option takes both spellings: ``-root DIR`` and ``--root DIR`` (or ``--root=DIR``).
"""

from __future__ import annotations

from ponytail.lite.records import record


@record(frozen=True)
class OptionSpec:
    name: str
    metavar: str | None  # None: a flag
    help: str


HOOK_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "config",
        "FILE",
        "Config file. Default: $PONYTAIL_CONFIG, else /etc/ponytail/config.toml; "
        "a missing default file means built-in defaults.",
    ),
    OptionSpec(
        "root",
        "DIR",
        "Manual mode: inject into the rootfs DIR in the current mount namespace, "
        "instead of reading the OCI state from stdin (hook mode).",
    ),
    OptionSpec(
        "device",
        "SEL",
        "GPUs to inject: 'all' (default), 'none', an index (PCI bus order, as nvidia-smi counts), "
        "a GPU- UUID, a PCI bus id, or a comma list. Overrides the container's NVIDIA_VISIBLE_DEVICES.",
    ),
    OptionSpec(
        "capabilities",
        "LIST",
        "Driver capabilities: compute, compat32, graphics, utility, video, display, ngx, or 'all' "
        "(default: the container's NVIDIA_DRIVER_CAPABILITIES, else utility,compute).",
    ),
    OptionSpec(
        "libs",
        "GLOB[,GLOB...]",
        "Exactly these libraries for this run: globs under the driver root (its ld.so.cache is searched "
        "for the same names), instead of the capabilities' libraries and [library] paths.",
    ),
    OptionSpec(
        "debug",
        None,
        "Dry run: print every planned operation (nodes, libraries, links, linker cache) "
        "and why, change nothing, exit with the status a real run would (0, 1 a start that would fail, "
        "2 bad usage, config, or not root). Works with or without OCI state on stdin.",
    ),
)


@record(frozen=True)
class HookOptions:
    """The hook's own options (HOOK_OPTIONS), parsed from its command line without click
    (parse_hook_args) or by the click command: the data run_hook takes. None: not given."""

    config: str | None = None
    root: str | None = None
    device: str | None = None
    capabilities: str | None = None
    libs: str | None = None
    debug: bool = False


def parse_hook_args(args: list[str]) -> HookOptions | None:
    """Parse a plain hook command line; None if it is anything else (help, a subcommand,
    an unknown or malformed option), which the click command then handles and explains."""
    from ponytail.lite.argv import parse_options

    values = parse_options(args, {spec.name: 0 if spec.metavar is None else 1 for spec in HOOK_OPTIONS})
    return None if values is None else HookOptions(**values)  # type: ignore[arg-type]  # parse_options gives str for options of arity 1, bool for flags
