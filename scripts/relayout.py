#!/usr/bin/env python3
"""Move ponytail's flat modules into folders that name the architecture, and rewrite every reference.

    python3 scripts/relayout.py --table     # the layout decision: old module -> new module
    python3 scripts/relayout.py --dry-run   # what it would move and rewrite; changes nothing
    python3 scripts/relayout.py --check     # only the report of step 8 (any tree, before or after)
    python3 scripts/relayout.py             # do it (refuses a dirty tree); then: make setup,
                                            # the suite, make binary, review `git status`, commit

Run from anywhere inside the repository, once, on a clean tree (it is written to run on main after
the other branches are merged). What it does, in order:

1. relative imports in ponytail/ (if any) become absolute, against each file's old place;
2. ``git mv`` of every module and package in LAYOUT (a module that becomes a package's file, like
   plan.py -> plan/operations.py, goes into the new folder; the old name is then the package's);
3. every reference in the tracked text files is rewritten, in one left-to-right pass, longest
   match first (``ponytail.hooksd`` is never read as ``ponytail.hook``): ``from ponytail.X import``,
   ``from ponytail import X``, ``import ponytail.X``, dotted names in strings and prose (mock
   targets, ``-m`` calls, lists of module names, entry points in pyproject.toml) and source
   paths (``ponytail/plan.py``, ``ponytail/shim/``), and ("module", "attribute") string pairs
   (bench/phaselib.py's list of functions to time);
4. the new folders get an ``__init__.py`` with a one-line docstring; the packages whose contents
   changed get a new docstring (only when theirs is still the one this script knows);
5. ``make_plan`` and the helpers only it uses move from hook.py to plan/make.py (hook.py imports
   it where it calls it, as it imports the rest of the plan: a run for a container without GPUs
   imports none of it);
6. the architecture section of docs/architecture.md (once README.md's: "## How it works", its text up
   to the next heading: subsections stay) is replaced by scripts/relayout-readme.md;
7. import order is fixed with ruff when pyproject.toml selects ruff's isort rules ("I");
8. a report: imports that point up the layers, import cycles, modules left at the top level.

Modules that are not in LAYOUT (added by other branches meanwhile) stay where they are; their
references to moved modules are rewritten like any other. A second run changes nothing; a run after
adding rows to LAYOUT moves only the new rows. Standard library only.

Not handled: module names built at run time (f"ponytail.{name}", import_module), paths split over
strings ("ponytail", "plan.py") or absolute (/src/ponytail/plan.py), files outside the repository
(/work/shared/DESIGN.md) or untracked. Comments inside a parenthesized import that has to be split
are dropped. Code merged after the run that still says ``from ponytail import plan`` or
``import ponytail.cli`` gets the new package, not the old module (run the script again: every other
old name is rewritten then too).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# -- the layout decision ------------------------------------------------------------------------------
# old dotted name -> new dotted name. A row is a module (a .py file), a package (a folder, moved with
# everything in it, new files included) or, for a row under a package, one file taken out of it.
LAYOUT: list[tuple[str, str]] = [
    # cli/: the front ends (click and the read-only commands). entry.py (the console script: the hook's
    # own command line, else click) stays beside __main__.py: a folder costs every hook run its import
    ("ponytail.cli", "ponytail.cli.commands"),  # the click commands
    ("ponytail.infocmd", "ponytail.cli.info"),  # `ponytail info` without click
    ("ponytail.doctor", "ponytail.cli.check"),  # `ponytail check`
    ("ponytail.loaderview", "ponytail.cli.loaderview"),  # part of `check` (imports its Finding)
    ("ponytail.cdi.commands", "ponytail.cli.cdi"),  # `ponytail cdi`: click commands
    ("ponytail.cdi.generatecmd", "ponytail.cli.cdigenerate"),  # `ponytail cdi generate` without click (branch issue-12)
    # engines/: how container engines run ponytail (configure/ is there already)
    ("ponytail.hooksd", "ponytail.engines.hooksd"),  # podman and CRI-O: the hooks.d file
    ("ponytail.shim", "ponytail.engines.shim"),  # package: ponytail-runtime, for Docker
    ("ponytail.cdi", "ponytail.engines.cdi"),  # package: CDI spec files and the createContainer hook
    # plan/: the plan as data, how it is made, its renderings
    ("ponytail.plan", "ponytail.plan.operations"),  # the operations and build_plan
    ("ponytail.render", "ponytail.plan.render"),  # -debug and info text
    ("ponytail.cdi.spec", "ponytail.plan.cdi"),  # the plan as a CDI spec
    ("ponytail.devicefilter", "ponytail.plan.devicefilter"),  # the plan's device rules as a cgroup v2 program
    ("ponytail.compat", "ponytail.plan.compat"),  # CUDA forward compatibility: a change to the plan
    ("ponytail.hook.make_plan", "ponytail.plan.make.make_plan"),  # a function (step 5), not a file
    # container/: what the container asks for
    ("ponytail.oci", "ponytail.container.oci"),  # OCI state and the bundle's config.json
    ("ponytail.request", "ponytail.container.request"),  # NVIDIA_* -> Request
    ("ponytail.require", "ponytail.container.require"),  # NVIDIA_REQUIRE_*
    ("ponytail.trigger", "ponytail.container.trigger"),  # when a container asks for GPUs
    ("ponytail.deviceplugin", "ponytail.container.deviceplugin"),  # Kubernetes' device plugin's list
    ("ponytail.umd", "ponytail.container.umd"),  # the driver tree a container names
    # fs/: low-level file system helpers
    ("ponytail.inroot", "ponytail.fs.inroot"),  # paths inside the rootfs (openat2)
    ("ponytail.kernelfs", "ponytail.fs.kernelfs"),  # proc, sysfs, cgroup: never written
]
# Stay where they are: __main__ and entry (how ponytail starts), hook (the hook run), config, logfile,
# options, capabilities, errors (read by every layer), host/, apply/, lite/, engines/configure/.

# the new folders' __init__.py, and new docstrings for packages whose contents change (only replaced
# when the package's docstring is still the old one given here)
NEW_PACKAGES = {
    "ponytail/cli": "The front ends: the click commands, `info`, `check` and `cdi` (ponytail/entry.py sends the hook's own command line past them).",
    "ponytail/container": "What the container asks for: OCI state and bundle, NVIDIA_* variables, requirements, the device plugin's list, a driver tree.",
    "ponytail/plan": "The plan as plain data (each operation with its reason), how it is made, and its renderings (-debug text, a CDI spec, a device program).",
    "ponytail/fs": "Low-level file system helpers: paths inside the rootfs (openat2), kernel file systems (never written).",
}
NEW_DOCSTRINGS = {
    "ponytail/engines/__init__.py": (
        '"""How container engines are told about ponytail: engine configuration (``configure``)."""\n',
        '"""How container engines run ponytail: the hooks.d file (``hooksd``), the runtime shim for Docker (``shim``),\n'
        'CDI spec files and their hook (``cdi``), and engine configuration (``configure``)."""\n',
    ),
    "ponytail/engines/cdi/__init__.py": (
        '"""Container Device Interface: the Plan rendered as a CDI spec (``spec``), written, listed and\n'
        'checked (``files``), and the one createContainer hook the spec names (``hook``)."""\n',
        '"""Container Device Interface for engines: spec files written, listed and checked (``files``), and the\n'
        'one createContainer hook a spec names (``hook``); the spec itself is the plan rendered as data (plan/cdi.py)."""\n',
    ),
}
MAKE_PLAN_DOC = '''"""make_plan: the host probed for one request, and the plan for it.

The one way a plan is made: by the hook run, by ``ponytail list`` and by ponytail-runtime (for the
device rules it writes). The driver tree a container names, the image's CUDA compat directory and
the container's NVIDIA_REQUIRE_* are decided here too. A plan with problems is an error, except in
a dry run, which shows them.
"""
'''
README_SECTION = "## How it works"
ARCHITECTURE_DOC = "docs/architecture.md"  # where the section is (it was README.md's when this script ran)
README_SECTION_SHA256 = "df0e77d03be601ce"  # first 16 hex digits of the section this script was written against
README_TEXT = "scripts/relayout-readme.md"

# lowest first: an import may point to its own layer or a lower one (reported, not enforced)
LAYERS: list[tuple[str, ...]] = [
    ("ponytail.lite", "ponytail.errors"),
    ("ponytail.fs", "ponytail.capabilities"),
    ("ponytail.config", "ponytail.logfile", "ponytail.options"),
    ("ponytail.host",),
    ("ponytail.container",),
    ("ponytail.plan",),
    ("ponytail.apply",),
    ("ponytail.hook",),
    ("ponytail.engines",),
    ("ponytail.cli",),
    ("ponytail.__main__", "ponytail.entry"),
]
SELF = ("scripts/relayout.py", README_TEXT)  # never rewritten: they hold the old names on purpose


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    parser.add_argument("--table", action="store_true", help="print the mapping table and exit")
    parser.add_argument("--check", action="store_true", help="only the report: imports that point up the layers, cycles")
    args = parser.parse_args()
    if args.table:
        print_table()
        return 0
    root = Path(git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel").strip())
    os.chdir(root)
    if args.check:
        Relayout(root, dry_run=True).report()
        return 0
    if not args.dry_run:
        dirty = git(root, "status", "--porcelain")
        if dirty.strip():
            print("relayout: the tree has uncommitted changes; commit or stash them first:\n" + dirty, file=sys.stderr)
            return 1
    return Relayout(root, args.dry_run).run()


def print_table() -> None:
    width = max(len(old) for old, _ in LAYOUT)
    for old, new in LAYOUT:
        print(f"{old:<{width}}  ->  {new}")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


# -- one row of LAYOUT, as found in the tree ------------------------------------------------------------
class Row:
    def __init__(self, root: Path, old: str, new: str) -> None:
        self.old, self.new = old, new
        self.old_path, self.new_path = _path(old), _path(new)
        if (root / (self.old_path + ".py")).is_file():
            self.kind, self.pending = "module", True
        elif (root / self.old_path).is_dir() and not self.new_path.startswith(self.old_path + "/"):
            self.kind, self.pending = "package", True
        elif (root / (self.new_path + ".py")).is_file():
            self.kind, self.pending = "module", False
        elif (root / self.new_path).is_dir():
            self.kind, self.pending = "package", False
        else:
            self.kind, self.pending = "function", False
        # a module whose name becomes a package's (plan.py -> plan/): after the move, ponytail.plan.X
        # is the package's module X if there is one
        self.collides = any(n.startswith(old + ".") for _, n in LAYOUT)


def _path(dotted: str) -> str:
    return dotted.replace(".", "/")


# -- rewriting references ---------------------------------------------------------------------------
FROM_IMPORT = (
    r"(?P<from>\bfrom[ \t]+(?P<mod>ponytail(?:\.\w+)*)[ \t]+import[ \t]+"
    r"(?P<names>\([^()]*\)|\w+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*\w+(?:[ \t]+as[ \t]+\w+)?)*))"
)
SOURCE_PATH = r"(?P<path>(?:(?<![\w.\-/])|(?<=(?<![\w.])\./))ponytail/(?P<dirs>(?:\w+/)*)(?:(?P<file>\w+)\.py\b|(?P<last>\w+)(?![\w/\-]|\.\w))?)"
DOTTED = r"(?P<dotted>(?<![\w.\-/])ponytail(?:\.[A-Za-z_]\w*)+)"
PAIR = r"(?P<pair>(?P<q1>[\"'])(?P<pmod>ponytail(?:\.\w+)*)(?P=q1)(?P<sep>[ \t]*,[ \t]*)(?P<q2>[\"'])(?P<pattr>\w+)(?P=q2))"
TOKEN = re.compile("|".join((PAIR, FROM_IMPORT, SOURCE_PATH, DOTTED)))


class Rewriter:
    def __init__(self, root: Path, rows: list[Row]) -> None:
        self.root = root
        self.rows = {r.old: r for r in rows}

    def _match(self, parts: list[str]) -> tuple[Row, int] | None:
        """The longest row whose old name is a prefix of ``parts`` (whole components), unless the
        name is a new one already."""
        for n in range(len(parts), 1, -1):
            row = self.rows.get(".".join(parts[:n]))
            if row is None:
                continue
            if self._is_new(row, parts, n):
                return None
            return row, n
        return None

    def _is_new(self, row: Row, parts: list[str], n: int) -> bool:
        """After the move, ponytail.plan alone is the package, ponytail.plan.render its module."""
        return row.collides and not row.pending and (n == len(parts) or self._is_new_module(row.old, parts[n]))

    def _is_new_module(self, package: str, name: str) -> bool:
        base = self.root / _path(package) / name
        return base.with_suffix(".py").is_file() or base.is_dir()

    def dotted(self, name: str) -> str:
        parts = name.split(".")
        found = self._match(parts)
        if found is None:
            return name
        row, n = found
        return ".".join([row.new, *parts[n:]])

    def from_import(self, module: str, names_text: str) -> str | None:
        """``from module import names`` rewritten (None: unchanged). A name that is itself a moved
        module or function is imported from its new parent; the rest from the module's new name."""
        parenthesized = names_text.startswith("(")
        body = names_text[1:-1] if parenthesized else names_text
        body = "\n".join(line.split("#", 1)[0] for line in body.split("\n"))
        names: list[tuple[str, str | None]] = []
        for item in body.replace("\n", " ").split(","):
            words = item.split()
            if len(words) == 1:
                names.append((words[0], None))
            elif len(words) == 3 and words[1] == "as":
                names.append((words[0], words[2]))
        groups: dict[str, list[str]] = {}
        renamed = False
        for name, alias in names:
            parts = f"{module}.{name}".split(".")
            row = self.rows.get(module)
            if row is not None and self._is_new(row, parts, len(parts) - 1):  # from ponytail.plan import render
                groups.setdefault(module, []).append(name if alias is None else f"{name} as {alias}")
                continue
            found = self._match(parts)
            if found is not None and found[1] == len(parts):  # the name itself moved
                new = found[0].new
                target, imported = new.rsplit(".", 1)
                bound = alias or name
                groups.setdefault(target, []).append(imported if imported == bound else f"{imported} as {bound}")
                renamed = True
            else:  # the module it is in moved (or nothing did)
                target = module if found is None else ".".join([found[0].new, *parts[found[1] : -1]])
                groups.setdefault(target, []).append(name if alias is None else f"{name} as {alias}")
        if not renamed and len(groups) == 1:
            target = next(iter(groups))
            return None if target == module else target  # only the module's name changes: keep the layout
        return "\n".join(f"from {target} import {', '.join(items)}" for target, items in groups.items())

    def path(self, match: re.Match[str]) -> str:
        dirs = [d for d in match["dirs"].split("/") if d]
        is_file = match["file"] is not None
        parts = dirs + [match["file"] or match["last"]] if (is_file or match["last"]) else dirs
        for n in range(len(parts), 0, -1):
            row = self.rows.get(".".join(["ponytail", *parts[:n]]))
            if row is None:
                continue
            names_file = is_file and n == len(parts)
            if (row.kind == "module") != names_file or row.kind == "function":
                continue  # ponytail/plan/ is the new folder, not the old plan.py
            new = _path(row.new).split("/")[1:] + parts[n:]
            text = "/".join(["ponytail", *new])
            if is_file:
                return text + ".py"
            return text if match["last"] else text + "/"
        return match[0]

    def text(self, text: str) -> tuple[str, int]:
        count = 0

        def replace(match: re.Match[str]) -> str:
            nonlocal count
            if match["pair"] is not None:  # ("ponytail.hook", "make_plan"): a module and one of its names
                module, attribute = match["pmod"], match["pattr"]
                found = self._match(f"{module}.{attribute}".split("."))
                if found is not None and found[0].kind == "function" and found[1] == len(module.split(".")) + 1:
                    module = found[0].new.rsplit(".", 1)[0]
                else:
                    module = self.dotted(module)
                q1, q2 = match["q1"], match["q2"]
                out = f"{q1}{module}{q1}{match['sep']}{q2}{attribute}{q2}"
            elif match["from"] is not None:
                new = self.from_import(match["mod"], match["names"])
                if new is None:
                    return match[0]
                if "\n" in new:  # split into one statement per module
                    line_start = text.rfind("\n", 0, match.start()) + 1
                    prefix = text[line_start : match.start()]
                    joiner = "\n" + prefix if not prefix.strip() else "; "
                    new = new.replace("\n", joiner)
                    out = new
                else:
                    out = match[0].replace(match["mod"], new, 1) if not new.startswith("from ") else new
            elif match["path"] is not None:
                out = self.path(match)
            else:
                out = self.dotted(match["dotted"])
            if out != match[0]:
                count += 1
            return out

        return TOKEN.sub(replace, text), count


# -- the run -------------------------------------------------------------------------------------------
class Relayout:
    def __init__(self, root: Path, dry_run: bool) -> None:
        self.root, self.dry_run = root, dry_run
        self.rows = [Row(root, old, new) for old, new in LAYOUT]
        self.warnings: list[str] = []
        self.changed_py: set[str] = set()

    def say(self, line: str) -> None:
        print(("would " if self.dry_run and line[:1].islower() else "") + line)

    def run(self) -> int:
        pending = [r for r in self.rows if r.pending and r.kind != "function"]
        missing = [r for r in self.rows if r.kind == "function" and r.old != "ponytail.hook.make_plan"]
        if not self._make_plan_in_hook() and not (self.root / "ponytail/plan/make.py").is_file():
            missing += [r for r in self.rows if r.old == "ponytail.hook.make_plan"]
        for row in missing:
            self.warnings.append(f"{row.old}: not found (renamed or removed?); left alone, and so are its references")
        self.rows = [r for r in self.rows if r not in missing]
        for folder in sorted({_path(r.new).split("/")[1] for r in self.rows}):  # a new module of that name meanwhile?
            clash = self.root / "ponytail" / f"{folder}.py"
            if clash.is_file() and not any(r.pending and r.old == f"ponytail.{folder}" for r in self.rows):
                print(f"relayout: ponytail/{folder}.py is in the way of the folder ponytail/{folder}/: rename it or add a row for it", file=sys.stderr)
                return 1
        print(f"relayout: {len(pending)} module(s) and package(s) to move, in {self.root}")
        self.readme_before = readme_section(self.root / ARCHITECTURE_DOC)
        self.absolute_imports()
        self.move(pending)
        self.rewrite()
        self.packages()
        self.extract_make_plan()
        self.readme()
        self.remove_leftovers()
        if not self.dry_run:
            self.sort_imports()
            self.report()
        for warning in self.warnings:
            print(f"relayout: warning: {warning}", file=sys.stderr)
        if not self.dry_run:
            print("relayout: done. Next: make setup (entry points changed), the suite, make binary; review `git status`, commit.")
        return 0

    # 1. relative imports become absolute, against the file's old place
    def absolute_imports(self) -> None:
        pattern = re.compile(r"(?m)^([ \t]*)from[ \t]+(\.+)([\w.]*)[ \t]+import\b")
        for path in sorted(self.root.glob("ponytail/**/*.py")):
            rel = path.relative_to(self.root)
            module = list(rel.with_suffix("").parts)
            package = module[:-1] if rel.name != "__init__.py" else module[:-1]
            text = path.read_text()

            def absolute(match: re.Match[str], package: list[str] = package) -> str:
                up = len(match[2]) - 1
                base = package[: len(package) - up] if up else package
                return f"{match[1]}from {'.'.join(base + ([match[3]] if match[3] else []))} import"

            new = pattern.sub(absolute, text)
            if new != text:
                self.say(f"make the relative imports of {rel} absolute")
                if not self.dry_run:
                    path.write_text(new)

    # 2. git mv
    def move(self, pending: list[Row]) -> None:
        # files taken out of a package first, then packages, then modules (plan.py -> plan/operations.py
        # after nothing else needs the plan/ folder empty)
        def order(row: Row) -> int:
            if row.kind == "module" and any(o.kind == "package" and row.old.startswith(o.old + ".") for o in pending):
                return 0
            return 1 if row.kind == "package" else 2

        for row in sorted(pending, key=order):
            source = row.old_path + (".py" if row.kind == "module" else "")
            target = row.new_path + (".py" if row.kind == "module" else "")
            if (self.root / target).exists():
                raise SystemExit(f"relayout: {target} exists already; {source} cannot move there")
            self.say(f"git mv {source} {target}")
            if not self.dry_run:
                (self.root / target).parent.mkdir(parents=True, exist_ok=True)
                git(self.root, "mv", source, target)

    # 3. every reference
    def rewrite(self) -> None:
        rewriter = Rewriter(self.root, self.rows)
        files = git(self.root, "ls-files", "-z").split("\0")  # in a dry run, where they are now
        total = 0
        for name in files:
            path = self.root / name
            if not name or name in SELF or path.is_symlink() or not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, ValueError):
                continue
            if "\0" in text:
                continue
            new, count = rewriter.text(text)
            if count:
                total += count
                self.say(f"rewrite {count} reference(s) in {name}")
                if name.endswith(".py"):
                    self.changed_py.add(name)
                if not self.dry_run:
                    path.write_text(new, encoding="utf-8")
        print(f"relayout: {total} reference(s) {'to rewrite' if self.dry_run else 'rewritten'}")

    # 4. __init__.py files
    def packages(self) -> None:
        for folder, doc in NEW_PACKAGES.items():
            init = self.root / folder / "__init__.py"
            if init.exists():
                continue
            self.say(f"create {folder}/__init__.py")
            if not self.dry_run:
                init.parent.mkdir(parents=True, exist_ok=True)
                init.write_text(f'"""{doc}"""\n')
                git(self.root, "add", str(init.relative_to(self.root)))
        for name, (old, new) in NEW_DOCSTRINGS.items():
            path = self.root / name
            if self.dry_run or not path.is_file():
                continue
            text = path.read_text()
            if text == new:
                continue
            if text != old:
                self.warnings.append(f"{name}: its docstring changed since this script was written; left as it is:\n{text}")
                continue
            self.say(f"new docstring for {name}")
            path.write_text(new)

    # 5. make_plan beside the plan
    def _make_plan_in_hook(self) -> bool:
        hook = self.root / "ponytail/hook.py"
        if not hook.is_file():
            return False
        tree = ast.parse(hook.read_text())
        return any(isinstance(n, ast.FunctionDef) and n.name == "make_plan" for n in tree.body)

    def extract_make_plan(self) -> None:
        hook, make = self.root / "ponytail/hook.py", self.root / "ponytail/plan/make.py"
        if not self._make_plan_in_hook():
            return
        if make.exists():
            self.warnings.append("hook.py defines make_plan and plan/make.py exists: make_plan left in hook.py")
            return
        new_hook, new_make, moved = split_make_plan(hook.read_text(), "ponytail.plan.make", MAKE_PLAN_DOC)
        self.say(f"move {', '.join(moved)} from ponytail/hook.py to ponytail/plan/make.py")
        if not self.dry_run:
            hook.write_text(new_hook)
            make.write_text(new_make)
            git(self.root, "add", "ponytail/plan/make.py")
            self.changed_py |= {"ponytail/hook.py", "ponytail/plan/make.py"}

    # 6. README
    def readme(self) -> None:
        readme, section = self.root / ARCHITECTURE_DOC, self.root / README_TEXT
        if not readme.is_file() or not section.is_file():
            self.warnings.append(f"{ARCHITECTURE_DOC} or {README_TEXT} missing: architecture section not replaced")
            return
        new = section.read_text()
        found = readme_section(readme)
        if found is None:
            self.warnings.append(f"{ARCHITECTURE_DOC} has no '{README_SECTION}' line: put {README_TEXT} in by hand")
            return
        lines, start, end = found
        if "\n".join(lines[start:end]).rstrip("\n") == new.rstrip("\n"):
            return
        self.say(f"replace {ARCHITECTURE_DOC}'s '{README_SECTION}' section ({end - start} lines) with {README_TEXT}")
        if self.readme_before is not None and not self.dry_run:
            before, first, last = self.readme_before
            old = "\n".join(before[first:last]) + "\n"
            if hashlib.sha256(old.encode()).hexdigest()[:16] != README_SECTION_SHA256:
                self.warnings.append(f"{ARCHITECTURE_DOC}'s '{README_SECTION}' had changed since this script was written; it said:\n{old}")
        if not self.dry_run:
            body = new if new.endswith("\n\n") or end == len(lines) else new.rstrip("\n") + "\n\n"
            readme.write_text("\n".join(lines[:start]) + "\n" + body + "\n".join(lines[end:]))

    def remove_leftovers(self) -> None:
        """Old package folders left holding nothing but __pycache__ (git mv moves tracked files)."""
        for row in self.rows:
            folder = self.root / row.old_path
            if row.kind != "package" or not folder.is_dir() or self.dry_run:
                continue
            if all(p.name == "__pycache__" or "__pycache__" in p.parts for p in folder.rglob("*")):
                shutil.rmtree(folder)
                self.say(f"remove the leftover folder {row.old_path}/ (only __pycache__)")

    # 7. import order
    def sort_imports(self) -> None:
        pyproject = self.root / "pyproject.toml"
        selected = pyproject.is_file() and re.search(r'(?m)^(extend-)?select\s*=\s*\[[^\]]*"(I|I001|ALL)"', pyproject.read_text())
        files = sorted(f for f in self.changed_py if (self.root / f).is_file())
        if not selected or not files:
            return
        for ruff in ([str(self.root / ".venv/bin/ruff")], [shutil.which("ruff") or "ruff"], [sys.executable, "-m", "ruff"]):
            try:
                subprocess.run([*ruff, "--version"], check=True, capture_output=True)
            except (OSError, subprocess.CalledProcessError):
                continue
            done = subprocess.run([*ruff, "check", "--select", "I", "--fix", "--quiet", *files], cwd=self.root, capture_output=True, text=True)
            print(f"relayout: import order fixed with ruff in {len(files)} file(s)" + (f": {done.stdout}{done.stderr}" if done.returncode else ""))
            return
        self.warnings.append("pyproject.toml selects ruff's isort rules but ruff was not found: run `ruff check --select I --fix ponytail tests bench scripts`")

    # 8. report
    def report(self) -> None:
        graph = import_graph(self.root)
        up = []
        for source, targets in sorted(graph.items()):
            for target, lazy in sorted(targets.items()):
                if layer(target) > layer(source) >= 0:
                    up.append(f"{source} -> {target}" + (" (inside a function)" if lazy else ""))
        top = [m for m in graph if m.count(".") == 1 and layer(m) < 0 and m != "ponytail"]
        print("relayout: imports that point up the layers: " + ("none" if not up else "\n  " + "\n  ".join(up)))
        for title, eager_only in (("at import time", True), ("counting imports inside functions", False)):
            cycles = find_cycles({m: {t for t, lazy in ts.items() if not (eager_only and lazy)} for m, ts in graph.items()})
            print(f"relayout: import cycles {title}: " + ("none" if not cycles else "; ".join(" <-> ".join(c) for c in cycles)))
        if top:
            print("relayout: top-level modules and packages in no layer (add a row to LAYOUT and run again?): " + ", ".join(sorted(top)))


# -- moving make_plan -----------------------------------------------------------------------------
def split_make_plan(source: str, target: str, docstring: str) -> tuple[str, str, list[str]]:
    """hook.py's text without make_plan and what only it needs, and the new module's text."""
    tree = ast.parse(source)
    lines = source.split("\n")
    defs: dict[str, ast.stmt] = {}
    imports: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
    type_checking_blocks: list[ast.If] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id != "TYPE_CHECKING":
                    defs[t.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            imports.append((node, False))
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            type_checking_blocks.append(node)
            imports += [(n, True) for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    moved = ["make_plan"]
    for name in moved:  # the closure: every module-level definition the moved code uses
        for used in sorted(used_names(defs[name])):
            if used in defs and used not in moved:
                moved.append(used)
    moved_nodes = sorted({id(defs[n]): defs[n] for n in moved}.values(), key=lambda n: n.lineno)
    moved_use = set().union(*(used_names(n) for n in moved_nodes))
    kept_nodes = [n for n in tree.body if all(n is not m for m in moved_nodes)]
    kept_use = set().union(*(used_names(n) for n in kept_nodes if not isinstance(n, (ast.Import, ast.ImportFrom, ast.If)) or (isinstance(n, ast.If) and n not in type_checking_blocks)))
    from_kept = sorted(n for n in moved if n in kept_use)

    def bound(alias: ast.alias) -> str:
        return alias.asname or alias.name.split(".")[0]

    # the new module: the imports the moved code uses, then the code
    eager: list[str] = []
    lazy: list[str] = []
    for node, type_only in imports:
        aliases = [a for a in node.names if bound(a) in moved_use]
        if aliases:
            (lazy if type_only else eager).append(import_text(node, aliases))
    eager.sort(key=lambda s: (s.startswith("from ponytail"), s.startswith("from "), s))
    lazy.sort()
    chunks = [docstring, "from __future__ import annotations\n"]
    if eager:
        stdlib = [s for s in eager if not s.startswith("from ponytail")]
        own = [s for s in eager if s.startswith("from ponytail")]
        chunks.append("\n".join(stdlib + ([""] if stdlib and own else []) + own) + "\n")
    if lazy:
        chunks.append("TYPE_CHECKING = False\nif TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only\n"
                      + "".join(f"    {s}\n" for s in lazy))
    code = ["\n".join(lines[start_line(n, lines) - 1 : n.end_lineno]) for n in moved_nodes]
    make = "\n".join(chunks) + "\n\n" + "\n\n\n".join(code) + "\n"

    # hook.py: the moved code out, the imports only it used out, make_plan (and the like) imported
    edits: list[tuple[int, int, str | None]] = []  # (first line, last line, replacement; None deletes)
    for node in moved_nodes:
        edits.append((start_line(node, lines), node.end_lineno, None))  # type: ignore[arg-type]
    emptied_blocks = []
    for node, _ in imports:
        keep = [a for a in node.names if not (bound(a) in moved_use and bound(a) not in kept_use)]
        if len(keep) == len(node.names):
            continue
        indent = " " * node.col_offset
        edits.append((node.lineno, node.end_lineno, indent + import_text(node, keep) if keep else None))  # type: ignore[arg-type]
    for block in type_checking_blocks:
        if all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in block.body) and all(
            all(bound(a) in moved_use and bound(a) not in kept_use for a in n.names) for n in block.body if isinstance(n, (ast.Import, ast.ImportFrom))
        ):
            emptied_blocks.append(block)
    if emptied_blocks:
        edits = [e for e in edits if not any(b.lineno <= e[0] <= b.end_lineno for b in emptied_blocks)]  # type: ignore[operator]
        for block in emptied_blocks:
            edits.append((block.lineno, block.end_lineno, None))  # type: ignore[arg-type]
        flag = next((n for n in tree.body if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" for t in n.targets)), None)
        if flag is not None and len(emptied_blocks) == len(type_checking_blocks):
            edits.append((flag.lineno, flag.end_lineno, None))  # type: ignore[arg-type]
    last_import = max((n for n, type_only in imports if not type_only), key=lambda n: n.end_lineno or 0)
    new_lines: list[str | None] = list(lines)
    for first, last, replacement in edits:
        new_lines[first - 1 : last] = [replacement] + [None] * (last - first)
    at = last_import.end_lineno - 1  # type: ignore[operator]
    while new_lines[at] is None:
        at -= 1
    # where kept code calls moved code: imported there, just before the first statement that uses it
    # (a run that never gets there imports nothing of the plan), or at the top if used at import time
    at_top = set()
    for node in kept_nodes:
        wanted = sorted(used_names(node) & set(from_kept))
        if not wanted or isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            at_top |= set(wanted)
            continue
        user = next(n for n in node.body if used_names(n) & set(wanted))
        indent = " " * user.col_offset
        line = user.lineno - 1
        new_lines[line] = f"{indent}from {target} import {', '.join(wanted)}\n\n{new_lines[line]}"
    if at_top:
        new_lines[at] = f"{new_lines[at]}\nfrom {target} import {', '.join(sorted(at_top))}"
    hook = re.sub(r"\n{4,}", "\n\n\n", "\n".join(line for line in new_lines if line is not None)).rstrip("\n") + "\n"
    return hook, make, moved


def readme_section(readme: Path) -> tuple[list[str], int, int] | None:
    """The architecture page's lines, and where the architecture section's own text starts and ends: at the next
    heading, so that subsections other branches added under it (### ...) stay."""
    if not readme.is_file():
        return None
    lines = readme.read_text().split("\n")
    if README_SECTION not in lines:
        return None
    start = lines.index(README_SECTION)
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"#{2,6} ", lines[i])), len(lines))
    return lines, start, end


def start_line(node: ast.stmt, lines: list[str]) -> int:
    """The node's first line, with its decorators and the comment lines right above it."""
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    first = min([node.lineno] + [d.lineno for d in decorators])
    while first > 1 and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return first


def import_text(node: ast.Import | ast.ImportFrom, aliases: list[ast.alias]) -> str:
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    if isinstance(node, ast.Import):
        return f"import {names}"
    return f"from {'.' * node.level}{node.module or ''} import {names}"


def used_names(node: ast.AST) -> set[str]:
    """Names a piece of code reads, annotations written as strings included."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        annotations = []
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            every = sub.args.posonlyargs + sub.args.args + sub.args.kwonlyargs + [a for a in (sub.args.vararg, sub.args.kwarg) if a]
            annotations = [a.annotation for a in every if a.annotation] + ([sub.returns] if sub.returns else [])
        elif isinstance(sub, ast.AnnAssign):
            annotations = [sub.annotation]
        for annotation in annotations:
            for part in ast.walk(annotation):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    try:
                        names |= {n.id for n in ast.walk(ast.parse(part.value, mode="eval")) if isinstance(n, ast.Name)}
                    except SyntaxError:
                        pass
    return names


# -- the import graph -----------------------------------------------------------------------------
def import_graph(root: Path) -> dict[str, dict[str, bool]]:
    """module -> {imported ponytail module: only inside functions (or for type checkers)}."""
    modules = {}
    for path in sorted(root.glob("ponytail/**/*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, dict[str, bool]] = {}
    for name, path in modules.items():
        edges: dict[str, bool] = {}
        _imports(ast.parse(path.read_text()), False, name, modules, edges)
        graph[name] = edges
    return graph


def _imports(node: ast.AST, lazy: bool, name: str, modules: dict[str, Path], edges: dict[str, bool]) -> None:
    for child in ast.iter_child_nodes(node):
        inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
            isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING"
        )
        targets: list[str] = []
        if isinstance(child, ast.Import):
            targets = [a.name for a in child.names]
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            targets = [f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in modules else child.module for a in child.names]
        for target in targets:
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name and target.startswith("ponytail"):
                edges[target] = edges.get(target, True) and lazy
        _imports(child, inner, name, modules, edges)


def layer(module: str) -> int:
    best, rank = -1, -1
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


if __name__ == "__main__":
    sys.exit(main())
