"""The documentation reads in short sentences, and the pages that map the code name files that exist.

Sentence length: over a page's prose (fenced and indented code, tables and headings left out), the
words per sentence average at most 25 on every page, so over all pages too. Inline `code` is one
word; a sentence ends at `.`, `!` or `?` before a space or a line end, and at the end of a paragraph
or a list item. Abbreviations such as "e.g.", numbers such as 1.6.2 and an ellipsis before a
lower-case word end nothing.

Paths: every `ponytail/...` path, and every `folder/module.py`, that docs/architecture.md and
CONTRIBUTING.md name is in the tree, so the pages follow the layout."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
MAX_WORDS = 25

ABBREVIATIONS = ("e.g.", "i.e.", "cf.", "vs.")
_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_END = re.compile(r"(?<=[.!?])[)\]\"'*_]*(?=\s)")


def prose_blocks(text: str) -> list[str]:
    """The page's paragraphs and list items as plain text: no code, tables or headings."""
    blocks: list[list[str]] = []
    current: list[str] = []
    fenced = in_list = False
    previous_blank = True

    def close() -> None:
        nonlocal current
        if current:
            blocks.append(current)
        current = []

    for line in text.splitlines():
        if _FENCE.match(line):
            close()
            fenced = not fenced
            continue
        blank = not line.strip()
        indented = line.startswith(("    ", "\t"))
        if fenced or blank or line.lstrip().startswith(("|", "#", "<!--")) or line.startswith(">"):
            close()
            if blank and not fenced:
                previous_blank = True
            continue
        if indented and not in_list and (previous_blank or not current):
            close()  # an indented code block
            continue
        if _LIST_ITEM.match(line):
            close()
            in_list = True
            line = _LIST_ITEM.sub("", line, count=1)
        elif previous_blank and not indented:
            in_list = False
        previous_blank = False
        current.append(line.strip())
    close()
    return ["\n".join(block) for block in blocks]


def sentences(text: str) -> list[str]:
    """The page's sentences of at least three words (a lone path or name in a list is no sentence)."""
    found = []
    for block in prose_blocks(text):
        block = _CODE.sub("CODE", block)
        block = _LINK.sub(r"\1", block)
        for abbreviation in ABBREVIATIONS:
            block = re.sub(rf"(?<![\w.]){re.escape(abbreviation)}", abbreviation.replace(".", ""), block, flags=re.I)
        block = re.sub(r"(?<=\d)\.(?=\d)", "", block)  # 1.6.2
        block = re.sub(r"\.\.\.(?=\s+[a-z])", "…", block)  # "cannot mount ... libcuda"
        for sentence in _END.split(block):
            if len(sentence.split()) >= 3:
                found.append(sentence.strip())
    return found


def words_per_sentence(text: str) -> float:
    found = sentences(text)
    return sum(len(sentence.split()) for sentence in found) / max(1, len(found))


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO)) for page in PAGES])
def test_sentences_are_short(page: Path) -> None:
    average = words_per_sentence(page.read_text())
    longest = max(sentences(page.read_text()), key=lambda sentence: len(sentence.split()), default="")
    assert average <= MAX_WORDS, f"{average:.1f} words a sentence; the longest: {longest!r}"


def test_the_measure_catches_long_sentences() -> None:
    short = "The hook reads the spec. It plans the mounts, e.g. `libcuda.so.1` from containerd 1.6.2 and up... and more."
    long = " ".join(["word"] * 30) + ". " + " ".join(["word"] * 24) + "."
    assert sentences(short) == ["The hook reads the spec.", "It plans the mounts, eg CODE from containerd 162 and up… and more."]
    assert words_per_sentence(short) <= MAX_WORDS
    assert words_per_sentence(long) == 27
    page = f"# {' '.join(['heading'] * 40)}\n\n- {' '.join(['item'] * 30)}\n- short item here\n\n```\n{long}\n```\n"
    assert [len(sentence.split()) for sentence in sentences(page)] == [30, 3]
    assert sentences("| a | table with many words |\n\n    indented code, many words\n\nLast words here") == ["Last words here"]


def _tree() -> set[str]:
    """The checkout's files and folders, relative to it (hidden folders and build outputs aside)."""
    found = set()
    for folder, folders, files in os.walk(REPO):
        folders[:] = [name for name in folders if not name.startswith(".") and name not in ("build", "dist")]
        relative = Path(folder).relative_to(REPO)
        found |= {str(relative / name) for name in folders + files}
    return found


def named_paths(text: str) -> set[str]:
    """Every `ponytail/...` path and every `folder/name.py` a page names (links and URLs aside)."""
    text = re.sub(r"https?://\S+", "", text)
    paths = set(re.findall(r"(?<![\w./-])(ponytail/[\w./-]*[\w/])", text))
    paths |= set(re.findall(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py)\b", text))
    return {path for path in paths if "*" not in path and "{" not in path}


def _exists(path: str, tree: set[str]) -> bool:
    path = path.rstrip("/")
    if path.startswith("ponytail/"):
        return path in tree
    wanted = "/" + path
    return path in tree or any(("/" + file).endswith(wanted) for file in tree)


@pytest.mark.parametrize("page", ["docs/architecture.md", "CONTRIBUTING.md"])
def test_the_layout_pages_name_files_that_exist(page: str) -> None:
    tree = _tree()
    missing = sorted(path for path in named_paths((REPO / page).read_text()) if not _exists(path, tree))
    assert not missing, f"{page} names paths that are not in the tree: {missing}"


def test_the_path_check_catches_moved_modules() -> None:
    text = "`ponytail/hook.py`, `engines/cdi/hook.py`, `hooks/cdi.py`, `containerd/dropin.py`, https://x.org/a/b.py"
    tree = _tree()
    assert {path: _exists(path, tree) for path in named_paths(text)} == {
        "ponytail/hook.py": False,
        "engines/cdi/hook.py": False,
        "hooks/cdi.py": True,
        "containerd/dropin.py": True,
    }
