"""The architecture of docs/architecture.md holds in the code: imports point one way down the layers (LAYERS,
lowest first), and no two modules import each other. Every import counts: those made when a module loads, those
made inside a function (the lazy imports of the hot path), and those under `if TYPE_CHECKING:` (what the type
checker follows is a dependency too). Importing `a.b.c` loads the packages `a.b` and `a` first, so it counts as an
import of their `__init__` modules as well.

Off the hot path (HOT_PATH: `hooks/` and the floors below it, with the entry and its two fast parsers) imports go
at the top of a module: a function-level import there is an offender unless LOCAL_IMPORTS names it with a reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# lowest first: a module may import its own layer or a lower one
LAYERS: list[tuple[str, ...]] = [
    ("ponytail.lite", "ponytail.errors"),
    ("ponytail.fs", "ponytail.capabilities"),
    ("ponytail.config", "ponytail.logfile", "ponytail.options"),
    ("ponytail.host",),
    ("ponytail.container",),
    ("ponytail.plan",),
    ("ponytail.apply",),
    ("ponytail.hooks",),  # what an engine runs at every container start: the hot path ends here
    ("ponytail.cdi",),  # spec files: generate, read, render, stale, owners
    ("ponytail.engines",),  # what ponytail knows of each engine: its record, edit(), registered()
    ("ponytail.install", "ponytail.guard"),  # what changes the node once; the node agent
    ("ponytail.doctor", "ponytail.dra"),  # ponytail check; the DRA kubelet plugin
    ("ponytail.cli",),
    ("ponytail.__main__", "ponytail.entry"),
]
# What a container asks for does not depend on what the host has: of the host's modules, the container's
# read only the file formats (an image's ELF headers, a library's version in its file name, its linker cache),
# and the package ponytail.host, whose __init__ an import of them loads.
CONTAINER_MAY_USE_OF_HOST = ("ponytail.host", "ponytail.host.elf", "ponytail.host.driver_files", "ponytail.host.ldcache")
# The plan is plain data made from plain data: its modules read nothing, but the one that probes the
# host and reads the image for one request and plans it.
PLAN_MAY_READ = ("ponytail.plan.make",)
_READS = {"open", "listdir", "scandir", "stat", "lstat", "readlink", "read", "walk", "fdopen"}

# The hot path: what an engine runs at every container start (hooks/ and the floors below it), the entry and
# its two fast parsers without click. Its modules may import inside a function, to load only what a run needs.
HOT_PATH = ("ponytail.lite", "ponytail.errors", "ponytail.fs", "ponytail.capabilities", "ponytail.config", "ponytail.logfile",
            "ponytail.options", "ponytail.host", "ponytail.container", "ponytail.plan", "ponytail.apply", "ponytail.hooks",
            "ponytail.entry", "ponytail.__main__", "ponytail.cli.info", "ponytail.cli.cdigenerate")
# Off the hot path imports go at the top of a module. The imports inside a function that stay: (module, what it
# imports, a module or the package above several) -> why; "*" stands for all of a module's. Milliseconds are what
# the import adds to every click command line (ponytail --help): python -X importtime, after ponytail.cli.commands.
LOCAL_IMPORTS: dict[tuple[str, str], str] = {
    ("ponytail.cli.commands", "ponytail.hooks.prestart"): "the hook run from click: 5.8 ms",
    ("ponytail.cli.commands", "ponytail.container.request"): "list-paths: 2.5 ms",
    ("ponytail.cli.commands", "ponytail.plan.make"): "list-paths: 2.1 ms",
    ("ponytail.cli.commands", "ponytail.engines.hooksd"): "install-hook: 1.2 ms",
    ("ponytail.cli.commands", "ponytail.install.dockergpus"): "install-docker-gpus: 1.7 ms",
    ("ponytail.cli.commands", "ponytail.guard.devchar"): "dev-char-links: 4.3 ms",
    ("ponytail.cli.commands", "ponytail.guard.daemon"): "guard: 18.5 ms",
    ("ponytail.cli.commands", "ponytail.hooks.cdi"): "cdi-hook from click: 3.2 ms",
    ("ponytail.cli.commands", "ponytail.install.configure"): "configure: 3.8 ms",
    ("ponytail.cli.commands", "ponytail.doctor.check"): "check: 37 ms",
    ("ponytail.cli.cdi", "ponytail.cdi.owners"): "cdi check, cdi owners, a clash: 2.1 ms",
    ("ponytail.cli.habits", "ponytail.install.configure"): "runtime configure: 3.8 ms",
    ("ponytail.cli.dra", "ponytail.dra"): "the dra extra (h2, protobuf, kubernetes) may be absent: dra-plugin says so in one line",
    ("ponytail.cli.dra", "google.protobuf"): "the dra extra: imported to say what is missing",
    ("ponytail.cli.dra", "h2"): "the dra extra: imported to say what is missing",
    ("ponytail.cli.dra", "kubernetes"): "the dra extra: imported to say what is missing",
    ("ponytail.dra.kube", "kubernetes"): "220 ms, only when the plugin talks to the API server (tests give it a fake)",
    ("ponytail.dra.kube", "urllib3"): "the Kubernetes client's, with it",
    ("ponytail.guard.events", "pyudev"): "21 ms, for the kernel's uevents only; the DRA plugin goes on without them",
    ("ponytail.cdi.files", "yaml"): "PyYAML only for the YAML form: cdi generate --format json never loads it",
    ("ponytail.cdi.files", "ponytail.hooks.cdi"): "reading a spec's cdi-hook lines: cdi generate never needs the hook's modules",
    ("ponytail.cdi.generate", "ponytail.hooks.command"): "only without --hook-path: 1.7 ms on cdi generate",
    ("ponytail.cdi.owners", "ponytail.fs.inroot"): "loads ctypes: only under --root",
    ("ponytail.cdi.owners", "re"): "the JSON form of cdi generate never loads re (test_cdi_generate_fast)",
    ("ponytail.engines.registry", "ponytail.engines"): "an engine's module, with tomlkit, when it is used: 8.3 ms",
    ("ponytail.install.migrate.journal", "ponytail.fs.inroot"): "cli.migrate loads the journal; fs.inroot loads ctypes: 1.9 ms",
    ("ponytail.install.migrate.nvidia", "ponytail.fs.inroot"): "cli.migrate loads the probe; fs.inroot loads ctypes: 1.9 ms",
    ("ponytail.install.migrate.nvidia", "ponytail.cdi.owners"): "cli.migrate loads the probe: 2.2 ms",
    ("ponytail.install.migrate.run", "ponytail.cdi.owners"): "cli.migrate loads the run: 2.2 ms",
}


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(root.glob("ponytail/**/*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _loaded(target: str, known: dict[str, Path]) -> set[str]:
    """The ponytail modules that importing ``target`` loads: the module itself (or the nearest module above a name
    in it) and every package above it, whose ``__init__`` runs first."""
    while target not in known and "." in target:
        target = target.rsplit(".", 1)[0]
    if target not in known:
        return set()
    parts = target.split(".")
    return {name for name in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if name in known}


def _imported(node: ast.Import | ast.ImportFrom, package: str, known: dict[str, Path]) -> list[str]:
    """The module each name of an import statement comes from: ``import a.b`` a.b; ``from a import b`` a.b when
    b is a module of ours, else a (relative imports resolved from ``package``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parent + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the ponytail modules it imports, wherever in the module the import is: at the top, inside a
    function or under ``if TYPE_CHECKING:`` (what a type checker follows is a dependency too), with the packages
    whose ``__init__`` each import loads."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(node, _package_of(name, path), known):
                    if target.startswith("ponytail"):
                        edges |= _loaded(target, known)
        edges.discard(name)
        graph[name] = edges
    return graph


def on_hot_path(module: str) -> bool:
    return module == "ponytail" or any(module == prefix or module.startswith(prefix + ".") for prefix in HOT_PATH)


def local_imports(root: Path) -> list[tuple[str, int, str]]:
    """(module, line, imported module) of each import inside a function, in the modules off the hot path."""
    known = modules(root)
    found = []
    for name, path in known.items():
        if on_hot_path(name):
            continue
        for function in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [(name, node.lineno, target) for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))
                          for target in _imported(node, _package_of(name, path), known)]
    return sorted(set(found))


def allowed_by(module: str, target: str, allowed: dict[tuple[str, str], str]) -> tuple[str, str] | None:
    """The entry of ``allowed`` that lets ``module`` import ``target`` inside a function, if any."""
    for key in ((module, "*"), *((module, target.rsplit(".", n)[0]) for n in range(target.count(".") + 1))):
        if key in allowed:
            return key
    return None


def layer(module: str) -> int:
    best, rank = -1, -1
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, successors = work[-1]
            w = next(successors, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{source} -> {target}" for source, targets in sorted(graph.items())
            for target in sorted(targets) if layer(target) > layer(source) >= 0]


def reads_files(path: Path) -> list[str]:
    """The calls of ``path`` that read the file system: open(...), os.open/listdir/stat/... ."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name) and function.id == "open":
            found.append(f"{path.name}:{node.lineno} open()")
        elif (isinstance(function, ast.Attribute) and function.attr in _READS
              and isinstance(function.value, ast.Name) and function.value.id == "os"):
            found.append(f"{path.name}:{node.lineno} os.{function.attr}()")
    return found


def test_every_module_is_in_a_layer() -> None:
    assert [m for m in modules(REPO) if m != "ponytail" and layer(m) < 0] == []


def test_imports_point_down_the_layers() -> None:
    assert upward(import_graph(REPO)) == []


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    assert find_cycles(import_graph(REPO)) == []


def test_the_container_does_not_depend_on_what_the_host_has() -> None:
    graph = import_graph(REPO)
    assert [f"{source} -> {target}" for source, targets in sorted(graph.items()) if source.startswith("ponytail.container")
            for target in sorted(targets) if target.startswith("ponytail.host") and target not in CONTAINER_MAY_USE_OF_HOST] == []


def test_the_plan_reads_nothing_but_in_the_module_that_probes_and_plans_one_request() -> None:
    graph = import_graph(REPO)
    plan = {name: path for name, path in modules(REPO).items() if name.startswith("ponytail.plan") and name not in PLAN_MAY_READ}
    assert [f"{name} -> {target}" for name in sorted(plan) for target in sorted(graph[name]) if target.startswith("ponytail.fs")] == []
    assert [call for name in sorted(plan) for call in reads_files(plan[name])] == []


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    _package(tmp_path, {
        "ponytail/__init__.py": "", "ponytail/host/__init__.py": "", "ponytail/plan/__init__.py": "",
        "ponytail/host/a.py": "def f():\n    from ponytail.plan import b\n",
        "ponytail/plan/b.py": "from ..host import a\n",
    })
    graph = import_graph(tmp_path)
    assert graph["ponytail.host.a"] == {"ponytail", "ponytail.plan", "ponytail.plan.b"}
    assert upward(graph) == ["ponytail.host.a -> ponytail.plan", "ponytail.host.a -> ponytail.plan.b"]
    assert find_cycles(graph) == [["ponytail.host.a", "ponytail.plan.b"]]


def test_the_check_sees_type_only_imports_and_package_inits(tmp_path: Path) -> None:
    """Two circles that an import graph without type-only imports and without package ``__init__``s misses."""
    _package(tmp_path, {
        "ponytail/__init__.py": "", "ponytail/host/__init__.py": "",
        # a type-only import back: probe -> nodes -> probe
        "ponytail/host/probe.py": "from ponytail.host.nodes import node\n",
        "ponytail/host/nodes.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from ponytail.host.probe import Host\n",
        # a package whose __init__ imports a module that imports a sibling: engines -> registry -> engines
        "ponytail/engines/__init__.py": "from ponytail.engines.registry import ENGINES\n",
        "ponytail/engines/registry.py": "def f():\n    from ponytail.engines.docker import edit\n",
        "ponytail/engines/docker.py": "",
    })
    graph = import_graph(tmp_path)
    assert graph["ponytail.host.nodes"] == {"ponytail", "ponytail.host", "ponytail.host.probe"}
    assert graph["ponytail.engines.registry"] == {"ponytail", "ponytail.engines", "ponytail.engines.docker"}
    assert find_cycles(graph) == [["ponytail.engines", "ponytail.engines.registry"], ["ponytail.host.nodes", "ponytail.host.probe"]]


def test_off_the_hot_path_imports_are_at_the_top() -> None:
    """A module off the hot path imports at its top, so that what it needs is plain to see and loads once;
    LOCAL_IMPORTS names the exceptions, each with its reason."""
    assert [f"{module}:{line} imports {target} inside a function" for module, line, target in local_imports(REPO)
            if allowed_by(module, target, LOCAL_IMPORTS) is None] == []


def test_every_exception_to_the_top_of_the_module_is_still_used() -> None:
    used = {allowed_by(module, target, LOCAL_IMPORTS) for module, _, target in local_imports(REPO)}
    assert sorted(set(LOCAL_IMPORTS) - used) == []
    assert all(reason for reason in LOCAL_IMPORTS.values())


def test_the_check_finds_imports_inside_functions_off_the_hot_path(tmp_path: Path) -> None:
    _package(tmp_path, {
        "ponytail/__init__.py": "", "ponytail/guard/__init__.py": "", "ponytail/hooks/__init__.py": "",
        "ponytail/guard/watch.py": "import os\nclass W:\n    def f(self):\n        import json\n        from ponytail.hooks import run\n",
        "ponytail/hooks/run.py": "def f():\n    import json\n",
    })
    found = local_imports(tmp_path)
    assert found == [("ponytail.guard.watch", 4, "json"), ("ponytail.guard.watch", 5, "ponytail.hooks.run")]
    allowed = {("ponytail.guard.watch", "ponytail.hooks"): "a reason"}
    assert [allowed_by(module, target, allowed) for module, _, target in found] == [None, ("ponytail.guard.watch", "ponytail.hooks")]
