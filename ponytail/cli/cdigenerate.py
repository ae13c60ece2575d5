"""``ponytail cdi generate``, without click.

Run at install time and on every driver change (a systemd unit, a driver's install step,
a node's boot), where it stands beside ``nvidia-ctk cdi generate``: importing click is
about a fifth of its run. Its plain command line (the options below, each once, in either
spelling, ``--name value`` or ``--name=value``) is parsed by ponytail.lite.argv, as ``info``'s is
(ponytail.cli.info); help and anything out of the ordinary (an unknown option, a value
that is not one of the choices, an option twice) go to the click command in
ponytail.cli.cdi, which explains it and then ends here too: one implementation, two
ways in.
"""

from __future__ import annotations

from ponytail.cdi.files import STRATEGIES

FORMATS = ("yaml", "json")
# each option's arity (all take one value) and run_generate's parameter for it
OPTIONS = {"output": 1, "format": 1, "device-name-strategy": 1, "spec-version": 1, "capabilities": 1, "hook-path": 1, "config": 1}
_PARAMETERS = {"format": "form", "device_name_strategy": "strategy", "spec_version": "version"}


def parse_generate_args(args: list[str]) -> dict[str, str] | None:
    """The parameters of run_generate for a plain ``cdi generate`` command line, else None."""
    from ponytail.lite.argv import parse_command

    values = parse_command(args, ("cdi", "generate"), OPTIONS, choices={"format": FORMATS, "device-name-strategy": STRATEGIES})
    if values is None:
        return None
    return {_PARAMETERS.get(name, name): value for name, value in values.items() if isinstance(value, str)}
