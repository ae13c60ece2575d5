"""The ``ponytail`` console script.

The hook's own command line (the hot path on every container start) is parsed
without importing click; everything else (help, ``info``, errors in the
command line) goes to the click command in ponytail.cli.
"""

from __future__ import annotations

import os
import sys


def run() -> None:
    """The console script and ``python -m ponytail``: main(), then the process ends.

    A hook's process lives for one run: the cyclic garbage collector never has
    anything worth collecting, and tearing the interpreter down (freeing every
    module and object) only delays the container start (bench/hookbench.py). So the
    collector is off and, once the output is flushed, the process exits at once.
    """
    import gc

    gc.disable()
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # e.g. a closed pipe: nothing left to say
        pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from ponytail.options import parse_hook_args

    options = parse_hook_args(args)
    if options is not None:
        from ponytail.hook import run_hook

        return run_hook(options)
    from ponytail.cli import cli

    return cli.main(args=args, prog_name="ponytail", standalone_mode=True)
