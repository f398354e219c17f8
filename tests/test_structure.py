"""The structure the code keeps: one implementation of each idea.

Read from the source itself (ast), so a second copy of a shared idea, a kernels module that drags
the pipeline in, or a family hash that misses a module its kernels use fails here.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pandas as pd
import pytest

import tuner_kernels as kernels
from tuner_kernels import get_family
from tuner import budget, shapetable

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tuner", "tuner_kernels")


def modules() -> dict[str, Path]:
    """{dotted module name: path} of every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def top_level_imports(path: Path) -> set[str]:
    """Modules a file imports at module level (not inside functions), as absolute names."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def top_level_definitions() -> dict[str, list[str]]:
    """{name: [module, ...]} of every top-level function and class of the packages."""
    out: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                out.setdefault(node.name, []).append(name)
    return out


@pytest.mark.parametrize("family", kernels.family_names())
def test_a_family_hash_covers_every_kernels_module_it_uses(family):
    """A change in any kernels module a family imports must change its kernel hash, or the
    runtime loader accepts a stale export (attention imported helpers from gemm.py while its hash
    covered attention.py alone)."""
    fam = get_family(family)
    path = Path(kernels.FAMILY_MODULES[family].replace(".", "/") + ".py")
    used = {name for name in top_level_imports(ROOT / path)
            if name == "tuner_kernels" or name.startswith("tuner_kernels.")}
    files = {Path(p).resolve() for p in fam.source_files}
    known = modules()
    for name in used:
        module_file = known.get(name)
        if module_file is None:  # "tuner_kernels.common.DTYPES": a name, not a module
            continue
        assert module_file.resolve() in files, f"{family} uses {name} but its hash misses it"
    assert (ROOT / path).resolve() in files


def test_a_change_in_a_shared_kernel_module_changes_every_family_hash(monkeypatch):
    """A statement added to a module every family uses changes every family's hash; a comment
    changes none (the hash is of the code: tuner_kernels.code_digest)."""
    before = {name: get_family(name).source_hash() for name in kernels.family_names()}
    common = (ROOT / "tuner_kernels" / "common.py").resolve()
    read = Path.read_bytes
    tail = {}

    def edited(self):
        data = read(self)
        return data + tail["text"] if Path(self).resolve() == common else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    tail["text"] = b"\n# edited\n"
    assert {name: get_family(name).source_hash() for name in kernels.family_names()} == before
    tail["text"] = b"\nEDITED = 1\n"
    after = {name: get_family(name).source_hash() for name in kernels.family_names()}
    assert all(before[name] != after[name] for name in before)


def test_kernels_never_import_the_pipeline_at_module_level():
    """Serving code imports kernels: importing them must not import tuner (no kernels <-> tuner
    cycle); the entry points import tuner.runtime when first called."""
    for name, path in modules().items():
        if name.split(".")[0] != "tuner_kernels":
            continue
        assert not any(i == "tuner" or i.startswith("tuner.") for i in top_level_imports(path)), name


def test_no_import_cycle_between_bench_and_parity():
    assert not any(i.startswith("tuner.bench") for i in
                   top_level_imports(ROOT / "tuner" / "parity.py"))


# ------------------------------------------------------------------------- the import graph
def imports_of(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """{module of the packages: the first line importing it} for every import statement anywhere
    in module `name`'s file (module level, inside functions and methods, under `if
    TYPE_CHECKING:` or `try:`), resolved to the module it names: `from . import x` is
    `package.x` when that is a module, else the package's `__init__`; `from a.b import c` is
    `a.b` (or `a.b.c`, a module); `import a.b` is `a.b`. The parent packages Python initialises
    first (`tuner/__init__`, `tuner/search/__init__`) are not edges of their own: a package that
    re-exports its submodules would otherwise close a circle with each of them, and naming a
    package's `__init__` explicitly (`from tuner import search`) does count."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found[target] = min(line, found.get(target, line))

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """{module: {module it imports: line}} over every module of tuner/ and tuner_kernels/."""
    known = modules()
    return {name: imports_of(name, path, set(known)) for name, path in known.items()}


def import_circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest circle [a, b, ..., a] through each strongly connected group of modules
    (Tarjan's algorithm, then a breadth-first walk from the group's first module back to it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = {stack.pop()}
            while v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    circles = []
    for group in groups:
        start = min(group)
        parent: dict[str, str] = {}  # w: the module v of the edge v -> w that reached it first
        frontier = [start]
        while start not in parent:
            reached = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in group and w not in parent:
                        parent[w] = v
                        reached.append(w)
            frontier = reached
        back = [start, parent[start]]
        while back[-1] != start:
            back.append(parent[back[-1]])
        circles.append(back[::-1])
    return sorted(circles)


def test_no_import_circle_among_the_modules_of_tuner_and_kernels():
    """No module of tuner/ or tuner_kernels/ reaches itself through its imports: the graph is computed
    from the source (every `import` and `from ... import` statement, `imports_of`), not from a
    list kept by hand, and a circle is named with the line of each import in it.

    Counted: imports at module level AND inside functions, methods and `if TYPE_CHECKING:`. A
    function-level import still makes the module need the other one, so a circle through it
    still ties the two: neither can be read, tested or changed alone, and the circle only waits
    for the first call (a half-initialised module, an import error in the middle of a run).
    Moving an import into a function hides a circle; it does not remove it.
    Not counted: `importlib.import_module` / `__import__` of a computed name (the kernel
    registry loading `kernels.<family>`; tuner.search.stage.check_gpu_stack): a name built at
    run time is data, not a dependency the source states."""
    graph = import_graph()
    circles = import_circles(graph)
    named = [f"\n  {c[0]} " + ", which ".join(f"imports {b} (line {graph[a][b]})"
                                            for a, b in zip(c, c[1:])) for c in circles]
    assert not circles, "import circles:" + "".join(named)


def test_the_circle_finder_names_a_circle_through_a_function_level_import():
    graph = {"a": {"b": 3}, "b": {"c": 9}, "c": {"a": 40}, "d": {"a": 1}}
    assert import_circles(graph) == [["a", "b", "c", "a"]]
    assert import_circles({"a": {"b": 1}, "b": {}}) == []
    source = ROOT / "tuner" / "search" / "stage.py"
    found = imports_of("tuner.search.stage", source, set(modules()))
    assert {"tuner.search.supervisor", "tuner.device", "tuner.shapetable"} <= set(found)


# The measuring core, floor by floor from the ground (docs/interfaces.md "The measuring core,
# floor by floor"). A module may import the floors below its own; the ground floor imports
# nothing of the project outside itself (its modules import one another: errors <- units,
# errors <- hardware <- timing).
CORE_FLOORS = (
    ("tuner.errors", "tuner.units", "tuner.hardware", "tuner.timing"),  # ground: what this is
    ("tuner.readers",),  # the read-only kernels
    ("tuner.ceilings",),  # the read curve
    ("tuner.device",),  # the device profile and its measurement
    ("tuner.parity",),  # what a candidate computes the same as
    ("tuner.bench",),  # the timing protocol: input sets, pairing, sweeps, `tuner bench`
)


def test_the_measuring_core_imports_only_down_its_floors():
    graph = import_graph()
    floor_of = {name: i for i, floor in enumerate(CORE_FLOORS) for name in floor}
    assert set(floor_of) <= set(graph), set(floor_of) - set(graph)
    wrong = []
    for name, floor in floor_of.items():
        for target, line in graph[name].items():
            if floor == 0 and floor_of.get(target) != 0:
                wrong.append(f"{name} (ground floor) imports {target} (line {line})")
            elif floor and floor_of.get(target, -1) >= floor:
                wrong.append(f"{name} (floor {floor}) imports {target} (floor "
                             f"{floor_of[target]}, line {line})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", [
    "parse_duration", "parse_threshold", "Threshold", "parse_share", "parse_positive",
    "choose_profile", "spec_key_for", "time_events", "GraphTimer", "median", "compile_call",
    "compile_configs", "CompileReport", "CandidateFailure", "KernelCall", "launch_options",
    "fix_interpreter", "gemm_cost", "attention_cost", "dtype_bytes", "run_without_interpreter",
])
def test_each_shared_idea_is_defined_once(name):
    where = top_level_definitions().get(name, [])
    assert len(where) == 1, f"{name} is defined in {where}"


def test_every_family_has_the_same_default_config_signature():
    import inspect

    signatures = {name: list(inspect.signature(get_family(name).default_config).parameters)
                  for name in kernels.family_names()}
    assert all(params == ["shape", "backend", "sm_count"] for params in signatures.values()), signatures


# ------------------------------------------------------ budget and the families cost alike
ROWS = [
    dict(op="aten::mm", family="gemm", m=4, n=4864, k=896, batch=1, dtype="bfloat16", layout="NT"),
    dict(op="aten::addmm", family="gemm", m=4, n=1152, k=896, batch=1, dtype="bfloat16",
         layout="NT"),
    dict(op="aten::mm", family="gemm", m=512, n=896, k=4864, batch=1, dtype="bfloat16",
         layout="NT"),
    dict(op="aten::scaled_dot_product_attention", family="attention", m=1, n=0, k=64, batch=4,
         dtype="bfloat16", layout="", heads=14, kv_heads=2, q_len=1, kv_len=300, head_dim=64),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['op']}-m{r['m']}")
def test_budget_costs_a_row_as_its_kernel_family_does(row):
    full = {c: 0 for c in shapetable.COLUMNS} | {"calls": 1, "steps": 1, "calls_per_step": 1.0,
                                                  "us_per_call": 1.0, "step_us": 1.0,
                                                  "step_gpu_us": 1.0, "share": 0.0,
                                                  "kernels": "", "source": "", "device": "",
                                                  "phase": "decode"} | row
    series = shapetable.normalize(pd.DataFrame([full])).iloc[0]
    nbytes, nflops, why = budget.bytes_and_flops(series)
    assert why == ""
    served = [(name, get_family(name).shape_from_row(series)) for name in kernels.family_names()]
    served = [(name, shape) for name, shape in served if shape is not None]
    assert len(served) == 1, served
    name, shape = served[0]
    fam = get_family(name)
    assert (nbytes, nflops) == (fam.bytes_moved(shape), fam.flops(shape))


def test_structure_test_reads_real_files():
    """The checks above read the project's own files (not an empty tree)."""
    assert len(modules()) > 15
    digest = hashlib.sha256((ROOT / "tuner_kernels" / "common.py").read_bytes()).hexdigest()
    assert len(digest) == 64


def test_no_pipeline_module_is_over_700_lines_and_each_lists_its_public_names():
    for name, path in modules().items():
        if name.split(".")[0] != "tuner" or path.name == "__main__.py":
            continue
        text = path.read_text()
        assert text.count("\n") <= 700, f"{name}: {text.count(chr(10))} lines"
        if path.name != "__init__.py" or name.count(".") >= 1:
            assert "__all__" in text, f"{name} lists no __all__"


# ---------------------------------------------------------------- names of the product, not of its making
import fnmatch  # noqa: E402  (the naming rule's imports, kept with it)
import re  # noqa: E402
import subprocess  # noqa: E402

# A period of work, a run on the GPU machine or a tracker entry named by its number (or "#" and a
# number; a decimal time after the word for a call passes) says when or why a thing was made;
# the tracked files outside benchmarks/logs/ say what it is. A token that names a file or folder
# under benchmarks/logs/ is an address and passes.
# (the three words are spelled apart, as the numbers in the test below: this file names none)
PERIOD, RUN, ENTRY = "sess" "ion", "ca" "ll", "iss" "ue"
WHEN_MADE = re.compile(
    rf"\b{PERIOD}s?[ _-]?\d+"
    rf"|\b{RUN}s? \d+\b(?!\.\d)"
    rf"|\b{ENTRY}s?[ -]#?\d+"
    r"|(?<![\w&#/])#\d+\b",
    re.IGNORECASE)
LOGS = "benchmarks/logs/"
PATH_CHARS = re.compile(r"[\w./*-]")


def _tracked_files() -> list[str]:
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    return [name for name in proc.stdout.split("\0") if name]


def _names_under_logs(files: list[str]) -> set[str]:
    """Every file and folder name under benchmarks/logs/ (the addresses a path may carry)."""
    names = set()
    for name in files:
        if name.startswith(LOGS):
            names.update(name[len(LOGS):].split("/"))
    return names


def _token_around(line: str, start: int, end: int) -> str:
    while start > 0 and PATH_CHARS.match(line[start - 1]):
        start -= 1
    while end < len(line) and PATH_CHARS.match(line[end]):
        end += 1
    return line[start:end]


def _is_log_address(token: str, log_names: set[str]) -> bool:
    if not any(mark in token for mark in "/.*"):  # a bare word is no address
        return False
    for part in token.strip(".,;:").split("/"):
        part = part.strip(".,;:")
        if part in log_names or ("*" in part and any(fnmatch.fnmatch(n, part) for n in log_names)):
            return True
    return False


def _is_colour(match: re.Match, line: str) -> bool:
    """Three or six digits after the hash on a line that sets a color, background, fill or stroke."""
    digits = match.group(0)[1:]
    return len(digits) in (3, 6) and any(w in line for w in ("color", "background", "fill", "stroke"))


def when_made_names(files: list[str]) -> list[str]:
    """'path:line: match | line' for every numbered name of when a thing was made, outside the
    logs."""
    log_names = _names_under_logs(files)
    found = []
    for name in files:
        if name.startswith(LOGS):
            continue
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or deleted in this working tree
        for number, line in enumerate(text.splitlines(), 1):
            for match in WHEN_MADE.finditer(line):
                if match.group(0).startswith("#") and _is_colour(match, line):
                    continue
                if _is_log_address(_token_around(line, match.start(), match.end()), log_names):
                    continue
                found.append(f"{name}:{number}: {match.group(0)!r} | {line.strip()[:120]}")
    return found


def test_no_tracked_file_outside_the_logs_says_when_a_thing_was_made():
    """README, BENCHMARKS, docs, code, tests and scripts say what a thing is, not when it was made:
    no numbered period of work, GPU run or tracker entry outside benchmarks/logs/ (whose files are
    the dated record). Rewrite a flagged sentence to say what the thing is or does."""
    files = _tracked_files()
    assert len(files) > 100, files  # the checkout itself, not an empty listing
    found = when_made_names(files)
    assert not found, (f"{len(found)} numbered names of when a thing was made outside {LOGS}:\n"
                       + "\n".join(found))


def test_the_naming_rule_sees_what_it_should():
    """The pattern itself, on sentences of each kind (so a loosened regex fails here)."""
    def flagged(line: str) -> bool:
        return any(not (m.group(0).startswith("#") and _is_colour(m, line))
                   for m in WHEN_MADE.finditer(line))
    number = "1" + "7"  # spelled apart so this file names none itself
    for line in (f"measured in {PERIOD} {number}", f"see {PERIOD}{number}.sh",
                 f"({RUN} {number[1]})", f"{RUN}s {number[0]}-2", f"{ENTRY} {number}",
                 f"fixes #{number}", f"{ENTRY.title()}-{number}"):
        assert flagged(line), line
    for line in (f"a saving per {RUN} 4.80 us", f"48 {RUN}s per step", 'color="#333"',
                 "ProfilerStep#3", f"a pytest {PERIOD}'s fixture", f"{RUN} the baseline"):
        assert not flagged(line), line
    assert _is_log_address("benchmarks/logs/2026-12-01/run7/ab.md", {"run7"})
    assert _is_log_address("run7_*", {"run7_ab.md"})
    assert not _is_log_address(f"{PERIOD}{number}", {f"{PERIOD}{number}"})
