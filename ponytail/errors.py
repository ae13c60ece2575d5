"""The errors ponytail reports: one line each, with the exit status that goes with it."""

from __future__ import annotations

EXIT_INJECTION_FAILED = 1
EXIT_BAD_INPUT = 2


class PonytailError(Exception):
    """An error with a one-line message meant for the user (what, where, what to do)."""

    exit_code = EXIT_INJECTION_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(PonytailError):
    """Bad command line."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(PonytailError):
    """A config.toml that cannot be used (syntax, unknown key, wrong type)."""

    exit_code = EXIT_BAD_INPUT


class InputError(PonytailError):
    """Bad OCI state, bundle, or a request naming something that does not exist."""

    exit_code = EXIT_BAD_INPUT


class ProbeError(PonytailError):
    """The host does not have what injection needs (no driver, missing nodes)."""

    exit_code = EXIT_INJECTION_FAILED


class InjectionError(PonytailError):
    """Applying the plan failed."""

    exit_code = EXIT_INJECTION_FAILED


class PermissionDenied(PonytailError):
    """The kernel refused a change (EACCES, EPERM): usually a run that is not root. Exit 2 in
    every command, as for bad usage: the same command as root is the fix."""

    exit_code = EXIT_BAD_INPUT


NOT_ROOT_HINT = "run as root"


def os_failure(what: str, error: OSError, otherwise: type[PonytailError]) -> PonytailError:
    """The error for ``what`` (``cannot write /etc/x``) failing with ``error``: a refusal is a
    PermissionDenied, which says to run as root when this process is not; anything else is
    ``otherwise``."""
    import errno

    if error.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"{what}: {error.strerror}{not_root_hint()}")
    return otherwise(f"{what}: {error.strerror}")


def not_root_hint() -> str:
    """``; run as root`` when this process is not root, else nothing."""
    import os

    return f"; {NOT_ROOT_HINT}" if os.geteuid() != 0 else ""


MAX_LINE = 4096  # characters of one error or log line


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """``text`` with control characters and invalid Unicode escaped: names from an image can hold
    newlines, and an error or log entry must stay one line; and at most about ``limit``
    characters of it (bad input can be a megabyte)."""
    text = excerpt(text, limit)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def excerpt(text: str, limit: int = 120) -> str:
    """``text`` if it has at most ``limit`` characters, else its beginning and its end
    with the number of characters left out between them."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}[...{len(text) - head - tail} characters...]{text[-tail:]}"


def quoted(text: str, limit: int = 120) -> str:
    """``repr(text)`` of a bounded excerpt, for quoting input in an error."""
    return repr(excerpt(text, limit))
