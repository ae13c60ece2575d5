"""The one error door of the programs an engine runs at a container start.

The hook (ponytail.hooks.prestart), ``cdi-hook`` (ponytail.hooks.cdi) and NVIDIA's hook names
(ponytail.hooks.nvidia) each run a body through run(). The body loads the config and opens the
log it names (open_log) when it is ready to: the later of NVIDIA's hooks exit before that. What
the body raises is turned into one line on stderr, the same in the log:

- a PonytailError: ``ponytail: error: WHAT`` (what, where, what to do), exit with its status
  (ponytail.errors: 1 injection failed, 2 bad usage, config or input, or not root);
- anything else is a bug: ``ponytail: internal error: TYPE: WHAT``, its traceback in the log,
  exit 1.

The hook's own run logs a config that cannot be loaded in the default log (open_log's
``default_log``): the config could not say where.
"""

from __future__ import annotations

import sys

from ponytail.errors import EXIT_INJECTION_FAILED, ConfigError, PonytailError, one_line
from ponytail.logfile import RunLog

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from collections.abc import Callable
    from typing import TextIO

    from ponytail.config import Config


def run(body: Callable[[RunLog], int], name: str = "", stderr: TextIO | None = None) -> int:
    """``body(log)``'s exit status; any error it raises as one line on ``stderr`` (default
    sys.stderr) and in the log. Never raises. ``name``: the program, in the log's line of an
    internal error ('' for the hook itself)."""
    log = RunLog("")
    try:
        return body(log)
    except PonytailError as e:
        log.write("error", e.message)
        return say_error(e, stderr)
    except Exception as e:  # noqa: BLE001 - a bug: still one line for the user, the details in the log
        import traceback

        log.write("error", f"internal error{f' ({name})' if name else ''}: " + traceback.format_exc().replace("\n", " | "))
        where = f" (traceback in {log.path})" if log.path else ""
        _say(f"ponytail: internal error: {type(e).__name__}: {one_line(str(e))}{where}", stderr)
        return EXIT_INJECTION_FAILED
    finally:
        log.close()


def open_log(log: RunLog, config_file: str | None = None, default_log: bool = False) -> Config:
    """The config (``config_file``, else $PONYTAIL_CONFIG or the default path), with ``log``
    opened where it says; with ``default_log``, a config that cannot be loaded has its error
    logged in the default log."""
    from ponytail.config import Config, config_path, load_config

    try:
        config = load_config(*config_path(config_file))
    except ConfigError:
        if default_log:
            log.path = Config().log_file
        raise
    log.path = config.log_file
    log.open()
    return config


def say_error(error: PonytailError, stderr: TextIO | None = None) -> int:
    """``error`` as its one line on ``stderr``; its exit status. Also for what fails before a run
    begins (Docker's hook name with a stage it does not know: ponytail.entry)."""
    _say(f"ponytail: error: {one_line(error.message)}", stderr)
    return error.exit_code


def _say(line: str, stderr: TextIO | None) -> None:
    """``line`` on ``stderr``, else sys.stderr, else nowhere (an engine may close it)."""
    stream = stderr or sys.stderr
    if stream is not None:
        print(line, file=stream)
