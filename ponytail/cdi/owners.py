"""Who owns each CDI kind on this node: every spec in the engines' spec directories, with the
generator that wrote it (ponytail, NVIDIA's nvidia-ctk, or another tool), and the kinds that more
than one file defines.

The CDI runtime (the library inside podman, containerd, CRI-O and Docker) reads every ``.json`` and
``.yaml`` file of its spec directories; a device name two files of one directory define is a
conflict and unresolvable (``unresolvable CDI devices nvidia.com/gpu=0``), and a file of a later
directory (``/var/run/cdi``) silently shadows an earlier one's (``/etc/cdi``). So one generator owns
a kind on a node: ponytail never writes a second spec of a kind another file already defines.
"""

from __future__ import annotations

import os

from ponytail.cdi.files import SPEC_DIRS, read_spec
from ponytail.cdi.skim import Hook, skim_file, spec_hooks
from ponytail.errors import InjectionError, PonytailError
from ponytail.fs.hostfiles import read_head, under_root
from ponytail.lite.records import record

PONYTAIL = "ponytail"
NVIDIA_CTK = "nvidia-ctk"
OTHER = "another generator"
# what NVIDIA's specs run as their hooks: nvidia-cdi-hook (toolkit >= 1.17) or 'nvidia-ctk hook' (older)
NVIDIA_HOOK_NAMES = ("nvidia-cdi-hook", "nvidia-ctk")
SUFFIXES = (".json", ".yaml")  # what the CDI runtime reads (a .yml is ignored by it)
MIGRATE = "ponytail migrate --from nvidia"


@record(frozen=True)  # not dataclasses: cdi generate's JSON path imports no re, enum or inspect
class SpecFile:
    path: str
    kind: str
    generator: str  # PONYTAIL, NVIDIA_CTK or OTHER
    devices: tuple[str, ...]
    spec: dict | None  # the whole spec; None where it is not valid (error says why) or was skimmed (scan(whole=False))
    error: str | None = None
    hooks: tuple[Hook, ...] = ()  # its hooks' paths and args (ponytail.cdi.skim), read whole or skimmed

    @property
    def label(self) -> str:
        return f"{self.path} ({self.generator}'s)"


def scan(root: str = "/", dirs: tuple[str, ...] = SPEC_DIRS, whole: bool = True) -> list[SpecFile]:
    """Every spec file of the spec directories ``dirs`` (under ``root``), in the CDI runtime's order.
    ``whole=False``: each is skimmed for its kind and hooks (ponytail.cdi.skim), parsed whole only
    where it is written in another form; its devices and spec are then left out."""
    found = []
    for directory in dirs:
        base = directory if root == "/" else _in_root(root, directory)
        if base is None:
            continue
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            path = os.path.join(base, name)
            real: str | None = path  # what a link names, inside the root too
            if root != "/" and os.path.islink(path):
                real = _in_root(root, f"{base[len(root.rstrip('/')):]}/{name}")
            if not name.endswith(SUFFIXES) or real is None or not os.path.isfile(real):
                continue
            found.append(_read(path, real, whole))
    return _with_feature_owners(found)


def _read(path: str, real: str, whole: bool) -> SpecFile:
    skimmed = None if whole else skim_file(real)
    if skimmed is not None:
        kind, hooks = skimmed
        return SpecFile(path, kind, generator_of_hooks(hooks, path), (), None, hooks=hooks)
    try:
        spec = read_spec(real)
    except PonytailError as e:
        return SpecFile(path, _kind_of_text(real), _generator_of_text(real), (), None, e.message)
    hooks = tuple(spec_hooks(spec))
    return SpecFile(path, str(spec["kind"]), generator_of_hooks(hooks, path), tuple(d["name"] for d in spec["devices"]), spec, hooks=hooks)


def _in_root(root: str, directory: str) -> str | None:
    """``directory`` (or a file) of the tree at ``root``, its links resolved inside it (a node's /var/run
    -> /run is the node's /run, not this process's); None when it cannot be (a loop)."""
    # here, not at the top: fs.inroot loads ctypes, which cdi generate (root "/") never needs
    from ponytail.fs.inroot import host_path_in_root

    try:
        return host_path_in_root(root, directory, follow_last=True)
    except InjectionError:  # a loop, no such root
        return None


def generator_of(spec: dict, path: str) -> str:
    """Which tool wrote ``spec``: its hooks say (ponytail's cdi-hook, NVIDIA's nvidia-cdi-hook or
    'nvidia-ctk hook'); a spec without hooks is told by its name (ponytail's opt-in features are
    written beside its GPU spec as NAME-FEATURE.yaml and are recognised by scan())."""
    return generator_of_hooks(spec_hooks(spec), path)


def generator_of_hooks(hooks: tuple[Hook, ...] | list[Hook], path: str) -> str:
    """generator_of, told by the spec's hooks (their paths and args) alone."""
    for program_path, args in hooks:
        program = os.path.basename(program_path)
        if args[1:2] == ("cdi-hook",) or program.startswith(PONYTAIL):
            return PONYTAIL
        if args[:1] and os.path.basename(args[0]) in NVIDIA_HOOK_NAMES or program in NVIDIA_HOOK_NAMES:
            return NVIDIA_CTK
    return PONYTAIL if os.path.basename(path).startswith(PONYTAIL) else OTHER


def clashes(files: list[SpecFile]) -> dict[str, list[SpecFile]]:
    """kind -> its files, for each kind more than one file defines."""
    by_kind: dict[str, list[SpecFile]] = {}
    for f in files:
        if f.kind:
            by_kind.setdefault(f.kind, []).append(f)
    return {kind: group for kind, group in by_kind.items() if len(group) > 1}


def others_of_kind(kind: str, output: str, root: str = "/", scanned: Scans | None = None) -> list[SpecFile]:
    """The spec files other than ``output`` that define ``kind``: in the engines' spec directories,
    and another generator's in ``output``'s own directory (an engine may be set to read it; ponytail's
    own specs of a scratch directory are left alone). ``scanned``: the directories read so far."""
    scanned = Scans() if scanned is None else scanned
    target = _same_file_key(output)
    spec_dirs = {_same_file_key(under_root(root, d)) for d in SPEC_DIRS}
    found = [f for f in scanned.of(root, SPEC_DIRS) if f.kind == kind and _same_file_key(f.path) != target]
    directory = os.path.dirname(os.path.abspath(output))
    if _same_file_key(directory) not in spec_dirs:
        found += [f for f in scanned.of("/", (directory,)) if f.kind == kind and f.generator != PONYTAIL and _same_file_key(f.path) != target]
    return found


class Scans:
    """What scan() found, per root and directories, for one decision: a spec file is read once,
    however often the checks ask, and skimmed for its kind and hooks (ponytail.cdi.skim): parsed
    whole, an 18-GPU YAML spec takes tens of milliseconds, skimmed well under one."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, tuple[str, ...]], list[SpecFile]] = {}

    def of(self, root: str, dirs: tuple[str, ...]) -> list[SpecFile]:
        key = (root, dirs)
        if key not in self._found:
            self._found[key] = scan(root, dirs, whole=False)
        return self._found[key]


def write_refusal(kind: str, output: str, root: str = "/", scanned: Scans | None = None) -> str | None:
    """Why ponytail must not write its spec of ``kind`` to ``output`` (None: it may): ``output`` is
    another generator's file, or another file already defines ``kind``. ``scanned``: share one
    Scans between the files one command writes (a GPU spec and its features' specs)."""
    scanned = Scans() if scanned is None else scanned
    output = os.path.abspath(output)
    here = [f for f in scanned.of(root, (os.path.dirname(output),)) if _same_file_key(f.path) == _same_file_key(output)]
    if here and here[0].generator != PONYTAIL:
        return (f"{here[0].label} is not ponytail's, and ponytail does not write over another generator's spec: "
                f"{_before_writing(here)}")
    others = others_of_kind(kind, output, root, scanned)
    if not others:
        return None
    mine = _ours(output, kind)
    return (f"not writing {output}: {' and '.join(f.label for f in others)} already define{'s' if len(others) == 1 else ''} {kind}, "
            f"and {_effect(kind, [*others, mine])}; one generator per kind: {_before_writing(others)}")


def _before_writing(others: list[SpecFile]) -> str:
    if any(f.generator == NVIDIA_CTK for f in others):
        return f"move NVIDIA's toolkit aside first with '{MIGRATE}' (undone by '{MIGRATE} --undo'), or keep NVIDIA's spec and not ponytail's"
    if all(f.generator == PONYTAIL for f in others):
        return "write to that file instead (--output), or remove it first"
    return "move or remove that file first (a file the engines read ends in .json or .yaml), or keep it and not ponytail's"


def _ours(path: str, kind: str) -> SpecFile:
    return SpecFile(path, kind, PONYTAIL, (), None)


def clash_message(kind: str, files: list[SpecFile]) -> str:
    """One line: the files that define ``kind``, what the engines do with them, and the way out."""
    named = " and ".join(f.label for f in files)
    return f"{named} both define {kind}: {_effect(kind, files)}; keep one generator per kind: {way_out(files)}"


def _effect(kind: str, files: list[SpecFile]) -> str:
    if len({os.path.dirname(f.path) for f in files}) < len(files):
        return f"the engines refuse every {kind} device two files of one directory define ('unresolvable CDI devices')"
    return f"the engines take the devices of {kind} from the spec in the later directory ({', '.join(SPEC_DIRS)}) and ignore the other's"


def way_out(files: list[SpecFile]) -> str:
    generators = {f.generator for f in files}
    if NVIDIA_CTK in generators and PONYTAIL in generators:
        return f"'{MIGRATE}' moves NVIDIA's aside (undo: '{MIGRATE} --undo'), or remove ponytail's to stay with NVIDIA's"
    if NVIDIA_CTK in generators:
        return f"'{MIGRATE}' moves NVIDIA's specs aside for ponytail's, or remove all but one"
    if generators == {PONYTAIL}:
        return "remove all but one of them and generate that one (ponytail cdi generate --output FILE)"
    return "remove or move all but one (a file the engines read ends in .json or .yaml)"


def regenerate_advice(f: SpecFile) -> str:
    """How to bring ``f`` up to date, by the tool that wrote it: ponytail never writes over another's file."""
    if f.generator == PONYTAIL:
        return f"regenerate it: ponytail cdi generate --output {f.path}"
    if f.generator == NVIDIA_CTK:
        return f"regenerate it with NVIDIA's tool (nvidia-ctk cdi generate --output {f.path}), or move to ponytail's: {MIGRATE}"
    return f"regenerate it with the tool that wrote it (if ponytail did: ponytail cdi generate --output {f.path})"


def _with_feature_owners(files: list[SpecFile]) -> list[SpecFile]:
    """ponytail writes each opt-in feature's spec (no hooks) beside its GPU spec as NAME-FEATURE.ext."""
    ours = {os.path.splitext(f.path)[0] for f in files if f.generator == PONYTAIL}
    out = []
    for f in files:
        stem = os.path.splitext(f.path)[0]
        if f.generator == OTHER and f.kind.startswith("nvidia.com/") and stem.rpartition("-")[0] in ours:
            f = SpecFile(f.path, f.kind, PONYTAIL, f.devices, f.spec, f.error, f.hooks)
        out.append(f)
    return out


def _same_file_key(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _kind_of_text(path: str) -> str:
    """The kind an unreadable spec names, found in its text ('' when none is)."""
    import re  # here, not at the top: cdi generate's JSON path imports no re (tests/integration/test_cdi_generate_fast.py)

    found = re.search(r"""["']?\bkind["']?\s*:\s*["']?([A-Za-z0-9._/-]+)""", read_head(path, default=""))
    return found.group(1) if found else ""


def _generator_of_text(path: str) -> str:
    text = read_head(path, default="")
    if "cdi-hook" in text and PONYTAIL in text:
        return PONYTAIL
    if any(name in text for name in NVIDIA_HOOK_NAMES):
        return NVIDIA_CTK
    return PONYTAIL if os.path.basename(path).startswith(PONYTAIL) else OTHER
