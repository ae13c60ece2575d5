"""The documentation holds: the reference pages are what scripts/gendocs.py makes from the code
(the config schema, the click commands), every key of the schema is documented there, and every
link between the README, CONTRIBUTING.md and docs/ leads to a file and a heading that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_reference_pages_are_what_the_code_generates() -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts/gendocs.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_config_key_is_in_the_configuration_reference() -> None:
    from ponytail.config import schema

    page = (REPO / "docs/configuration.md").read_text()
    for key, _, _, meaning in schema():
        table, _, name = key.rpartition(".")
        assert f"| `[{table}]` `{name}` |" in page and meaning, key
    assert "`[request]` `accept_env_when_unprivileged`" in page


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    found = set()
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_leads_somewhere(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_front_door() -> None:
    text = (REPO / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 260, len(lines)
    first_block = text.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block  # the two commands come first
    assert not (REPO / "--help").exists()
