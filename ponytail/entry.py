"""The ``ponytail`` console script.

The hook's own command line (the hot path on every container start), ``cdi-hook``'s, and a
plain ``info`` or ``cdi generate`` are parsed without importing click (ponytail.lite.argv); everything else (help, the other
subcommands, errors in the command line) goes to the click command in ponytail.cli.commands.
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
    _open_standard_descriptors()
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the descriptor was closed when the process started
                stream.flush()
        except (OSError, ValueError):  # e.g. a closed pipe: nothing left to say
            pass
    os._exit(code)


def _open_standard_descriptors() -> None:
    """An engine may start the hook with stdin, stdout or stderr closed: /dev/null takes
    the closed ones, so that no file opened later (the log, a pipe to a child) gets
    descriptor 1 or 2 and receives what is meant for the engine."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
            except OSError:  # no /dev/null (a bare chroot): leave it closed
                return
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def main(argv: list[str] | None = None) -> int:
    """Route one command line (``argv``, else sys.argv) to its front end, cheapest first: the name
    dockerd runs (nvidia-container-runtime-hook), a CDI spec's cdi-hook, a plain cdi generate,
    the hook's own options (every container start), a plain info; anything else, help and every
    error in the command line included, to the click command. The exit status."""
    args = sys.argv[1:] if argv is None else argv
    if argv is None and os.path.basename(sys.argv[0]) == "nvidia-container-runtime-hook":  # Docker's --gpus
        return _docker_gpus_hook(args)
    if argv is None and os.path.basename(sys.argv[0]) in ("nvidia-cdi-hook", "nvidia-ctk"):  # NVIDIA's CDI specs' hooks
        from ponytail.hooks.nvidia import main as nvidia_hook

        return nvidia_hook(sys.argv[0], args)
    if args[:1] == ["nvidia-hook"] and len(args) > 1:  # the script install-nvidia-hook writes: nvidia-hook PATH ARGS...
        from ponytail.hooks.nvidia import main as nvidia_hook

        return nvidia_hook(args[1], args[2:])
    if args[:1] == ["cdi-hook"]:  # a CDI spec's createContainer hook: its own fast path, no click
        from ponytail.hooks.cdi import main as cdi_hook
        from ponytail.hooks.cdi import parse_args as parse_cdi_hook_args

        hook = parse_cdi_hook_args(args[1:])
        if hook is not None:
            return cdi_hook(hook)
    if args[:2] == ["cdi", "generate"]:  # beside nvidia-ctk on every driver change: a plain command line without click
        from ponytail.cdi.generate import run_generate
        from ponytail.cli.cdigenerate import parse_generate_args

        generate = parse_generate_args(args)
        if generate is not None:
            return run_generate(**generate)
    from ponytail.options import parse_hook_args

    options = parse_hook_args(args)
    if options is not None:
        from ponytail.hooks.prestart import run_hook

        return run_hook(options)
    from ponytail.cli.info import parse_info_args

    info = parse_info_args(args)
    if info is not None:  # read-only and frequent: no click either
        from ponytail.cli.info import run_info

        return run_info(*info)
    from ponytail.cli.clickclasses import run_main
    from ponytail.cli.commands import cli

    return run_main(cli, args)


def _docker_gpus_hook(args: list[str]) -> int:
    """Run under the name dockerd looks for (ponytail.install.dockergpus): ``prestart`` is the
    hook, the other stages have nothing to do."""
    from ponytail.errors import UsageError
    from ponytail.hooks.dockergpus import hook_arguments

    try:
        hook_args = hook_arguments(args)
    except UsageError as e:
        from ponytail.hooks.run import say_error

        return say_error(e)
    return 0 if hook_args is None else main(hook_args)
