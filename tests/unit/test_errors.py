"""A refusal by the kernel is one error in every command: exit 2, "run as root" when not root."""

from __future__ import annotations

import errno
import os

import pytest

from ponytail.errors import EXIT_BAD_INPUT, InjectionError, PermissionDenied, os_failure


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
@pytest.mark.parametrize("uid", [0, 1000])
def test_a_refusal_is_permission_denied_and_says_run_as_root_when_not_root(monkeypatch: pytest.MonkeyPatch, code: int, uid: int) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    error = os_failure("cannot write /etc/cdi/nvidia.yaml", OSError(code, os.strerror(code)), InjectionError)
    assert isinstance(error, PermissionDenied) and error.exit_code == EXIT_BAD_INPUT
    assert error.message.startswith(f"cannot write /etc/cdi/nvidia.yaml: {os.strerror(code)}")
    assert error.message.endswith("; run as root") == (uid != 0), error.message


def test_any_other_failure_keeps_its_kind() -> None:
    error = os_failure("cannot write /x", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), InjectionError)
    assert type(error) is InjectionError and error.message == f"cannot write /x: {os.strerror(errno.ENOSPC)}"
