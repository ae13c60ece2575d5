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


def one_line(text: str) -> str:
    """``text`` with control characters and invalid Unicode escaped: names from an image can hold
    newlines, and an error or log entry must stay one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
