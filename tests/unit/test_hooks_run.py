"""The error door of the programs an engine runs at a start (ponytail.hooks.run): one line on
stderr and in the log for every error, the exit status ponytail.errors gives it."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from ponytail.errors import ConfigError, InjectionError, UsageError
from ponytail.hooks.run import open_log, run
from ponytail.logfile import RunLog


def _config(tmp_path: Path, log: Path) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"[log]\nfile = '{log}'\n")
    return str(path)


def test_a_run_that_succeeds_says_nothing_and_logs_where_the_config_says(tmp_path: Path) -> None:
    log_file, stderr = tmp_path / "run.log", io.StringIO()

    def body(log: RunLog) -> int:
        open_log(log, _config(tmp_path, log_file))
        log.write("info", "done")
        return 0

    assert run(body, stderr=stderr) == 0
    assert stderr.getvalue() == "" and log_file.read_text().endswith(" info container=- done\n")


@pytest.mark.parametrize(("error", "code"), [(UsageError("bad\nflag"), 2), (InjectionError("no room"), 1)])
def test_an_error_is_one_line_with_its_exit_status(tmp_path: Path, error: Exception, code: int) -> None:
    log_file, stderr = tmp_path / "run.log", io.StringIO()

    def body(log: RunLog) -> int:
        open_log(log, _config(tmp_path, log_file))
        raise error

    assert run(body, "cdi-hook", stderr) == code
    said = stderr.getvalue()
    assert said.count("\n") == 1 and said.startswith("ponytail: error: ")
    assert log_file.read_text().count("\n") == 1 and " error container=- " in log_file.read_text()


def test_an_error_before_the_config_is_said_and_not_logged(tmp_path: Path) -> None:
    stderr = io.StringIO()

    def body(log: RunLog) -> int:
        raise UsageError("nvidia-cdi-hook: no hook subcommand given")

    assert run(body, "nvidia-cdi-hook", stderr) == 2
    assert stderr.getvalue() == "ponytail: error: nvidia-cdi-hook: no hook subcommand given\n"


def test_a_bug_is_one_line_and_its_traceback_is_in_the_log(tmp_path: Path) -> None:
    log_file, stderr = tmp_path / "run.log", io.StringIO()

    def body(log: RunLog) -> int:
        open_log(log, _config(tmp_path, log_file))
        return {}["missing"]  # type: ignore[no-any-return]

    assert run(body, "cdi-hook", stderr) == 1
    assert stderr.getvalue() == f"ponytail: internal error: KeyError: 'missing' (traceback in {log_file})\n"
    logged = log_file.read_text()
    assert logged.count("\n") == 1 and "internal error (cdi-hook): Traceback" in logged


def test_a_config_that_cannot_be_loaded_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text("[log\n")
    stderr = io.StringIO()
    monkeypatch.setattr("ponytail.config.Config", lambda: SimpleNamespace(log_file=str(tmp_path / "default.log")))  # its defaults

    assert run(lambda log: open_log(log, str(bad)) and 0, stderr=stderr) == ConfigError.exit_code
    assert stderr.getvalue().startswith("ponytail: error: ") and not (tmp_path / "default.log").exists()
    assert run(lambda log: open_log(log, str(bad), default_log=True) and 0, stderr=io.StringIO()) == ConfigError.exit_code
    assert "error" in (tmp_path / "default.log").read_text()  # the hook's own run: the default log


def test_dockers_hook_name_with_a_stage_it_does_not_know_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    link = tmp_path / "nvidia-container-runtime-hook"
    link.symlink_to(Path(sys.executable).parent / "ponytail")
    if not os.access(link, os.X_OK):
        pytest.skip("no ponytail console script beside this interpreter")
    result = subprocess.run([str(link), "create\nRuntime"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.endswith("not create\\nRuntime\n") and result.stderr.count("\n") == 1, result.stderr
    assert subprocess.run([str(link), "poststop"], capture_output=True, timeout=60).returncode == 0
