"""Rules of ponytail/'s source that ruff does not check: no top-level name that nothing uses (dead code
hides what a module really offers), and no ``assert`` (python -O strips them: a check that matters
raises its own error, a type narrowing uses a typed alternative)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ponytail"
# where a name of ponytail/ may be used: the package, its tests, its tools, the binary's spec, the entry points
USERS = ("ponytail", "tests", "scripts", "bench", "packaging")


def _modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _defined(tree: ast.Module) -> list[str]:
    """The module's top-level functions, classes and constants; a decorated function is registered by its
    decorator (a click command) and counts as used."""
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.decorator_list:
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if not name.startswith("__")]


def _used() -> tuple[set[str], str]:
    """Every name read, attribute and import in the users' Python files, and all their text (for a name
    given as a string: a getattr, an entry point, a PyInstaller hidden import)."""
    names: set[str] = set()
    texts = [(REPO / "pyproject.toml").read_text()]
    for folder in USERS:
        for path in (REPO / folder).rglob("*"):
            if not path.is_file() or path.suffix not in (".py", ".spec", ""):
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            texts.append(text)
            try:
                tree = ast.parse(text)
            except SyntaxError:  # a shell script, a C file's neighbour without an extension
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, ast.alias):
                    names.add(node.name)
    return names, "\n".join(texts)


def test_every_top_level_name_of_the_package_is_used() -> None:
    names, text = _used()
    unused = [
        f"{path.relative_to(REPO)}: {name}"
        for path, tree in _modules().items()
        for name in _defined(tree)
        if name not in names and not re.search(rf"[\"':.]{re.escape(name)}\b", text)
    ]
    assert unused == []


def test_no_assert_in_the_package() -> None:
    found = [f"{path.relative_to(REPO)}:{node.lineno}" for path, tree in _modules().items()
             for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert found == []
