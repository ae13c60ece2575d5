"""The ``ponytail`` console script.

The hook's own command line (the hot path on every container start) is parsed
without importing click; everything else (help, ``info``, errors in the
command line) goes to the click command in ponytail.cli.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from ponytail.options import parse_hook_args

    options = parse_hook_args(args)
    if options is not None:
        from ponytail.hook import run_hook

        return run_hook(options)
    from ponytail.cli import cli

    return cli.main(args=args, prog_name="ponytail", standalone_mode=True)
