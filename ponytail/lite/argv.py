"""The hook's plain command line, parsed without importing click.

The hook runs on every container start, and importing click is most of what a click
command costs before it does anything (bench/importcost.py). Its command line is always
one of a few options, so this reads exactly that: each option once, as ``-name``,
``--name``, ``-name VALUE``, ``--name VALUE`` or ``--name=VALUE``; a flag takes no value.
Anything else (help, a subcommand, an unknown, repeated or malformed option) gives None,
and the click command (ponytail.cli.commands), built from the same table, parses it and words
the error. tests/test_lite_argv.py holds it to click.
"""

from __future__ import annotations


def parse_options(args: list[str], takes_value: dict[str, bool]) -> dict[str, str | bool] | None:
    """``{name: value}`` (True for a flag) for a plain command line, else None."""
    values: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("---"):
            return None
        name, eq, inline = arg.lstrip("-").partition("=")
        if name not in takes_value or name in values:
            return None
        if not takes_value[name]:
            if eq:
                return None
            values[name] = True
        elif eq:
            values[name] = inline
        elif i + 1 < len(args):
            i += 1
            values[name] = args[i]
        else:
            return None
        i += 1
    return values
