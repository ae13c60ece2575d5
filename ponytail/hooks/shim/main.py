"""The ``ponytail-runtime`` console script: prepare a GPU container's bundle, then exec
the real runtime with the same arguments.

It runs on every runtime call an engine makes (create, start, state, kill,
delete...), so it imports little, and it never stops a container that does not
ask for GPUs: a config it cannot read only matters to GPU containers. Errors are
one line on stderr and in the runtime's ``--log`` file (in ``--log-format``),
which is where Docker and containerd look for the reason a runtime failed.
"""

from __future__ import annotations

import os
import sys

from ponytail.config import Config
from ponytail.errors import InjectionError, PonytailError
from ponytail.hooks.shim.argv import RuntimeCall, parse_runtime_args

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def main(argv: list[str] | None = None) -> int:
    """``ponytail-runtime ARGS``: for a call that names a bundle (create, run), prepare the bundle of a
    GPU container (the hook and the device rules into its config.json: shim/bundle.py), then exec
    the real runtime with the same ARGS. Errors are one line on stderr and in the runtime's --log;
    returns only on error (the exit status)."""
    args = sys.argv[1:] if argv is None else argv
    call = RuntimeCall(None)
    try:
        call = parse_runtime_args(args, os.getcwd())
        config, config_error = _load_config()
        runtime = find_runtime(config.runtime_path, config.path)
        if args[:1] in (["--version"], ["-v"]):  # the shim on stderr: engines parse the runtime's own lines on stdout
            from ponytail import __version__

            print(f"ponytail-runtime {__version__}: ponytail's shim in front of {runtime}", file=sys.stderr, flush=True)
        if call.bundle is not None:
            from ponytail.hooks.shim.bundle import prepare_bundle

            prepare_bundle(call.bundle, call.container_id, config, config_error)
    except PonytailError as e:
        return _fail(call, e.message, e.exit_code)
    except OSError as e:  # e.g. the working directory is gone
        return _fail(call, f"{e.strerror}: {e.filename}", 1)
    except Exception as e:  # noqa: BLE001 - a bug: still one line where the engine shows it
        return _fail(call, f"internal error: {type(e).__name__}: {e}", 1)
    try:
        os.execv(runtime, [runtime, *args])  # noqa: S606 - the OCI runtime root's config names (or runc on PATH): the shim's job
    except OSError as e:
        return _fail(call, f"cannot run {runtime}: {e.strerror}", 1)
    return 0  # not reached: execv replaced this process


def _load_config() -> tuple[Config, PonytailError | None]:
    """The config, or the defaults and the error that stopped it (it matters to GPU containers only)."""
    from ponytail.config import config_path, load_config

    path, required = config_path(None)
    try:
        return load_config(os.path.abspath(path), required), None
    except PonytailError as e:
        return Config(), e


def find_runtime(name: str, config_file: str | None) -> str:
    """The real runtime's absolute path: ``name`` itself when it has a slash, else from PATH.
    Never this shim itself (that would exec forever)."""
    where = f"[runtime] path in {config_file}" if config_file else "[runtime] path in the config"
    me = os.path.realpath(sys.argv[0])
    if "/" in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d, name) for d in (os.environ.get("PATH") or DEFAULT_PATH).split(":") if d]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and os.path.realpath(candidate) != me:
            return os.path.abspath(candidate)
    raise InjectionError(f"runtime {name!r} not found or not executable (not on PATH, or it is ponytail-runtime itself): set {where}")


def _fail(call: RuntimeCall, message: str, exit_code: int) -> int:
    line = f"ponytail-runtime: {message}"
    print(line, file=sys.stderr)
    if call.log:
        from ponytail.hooks.shim.runtimelog import append_error

        append_error(call.log, call.log_format, line)
    return exit_code
