"""The layout keeps the architecture: data flows one way between stages, no import cycles
(lazy imports count, only `TYPE_CHECKING` ones do not), production code never imports the
test oracles, and no module is too long to read in one sitting."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

from test_packaging import STAGES as STAGE_FOLDERS
from test_packaging import source_files

ROOT = Path(__file__).resolve().parents[1]
#: modules below every stage: importable from anywhere, importing no stage
BASE = ("polytile.errors", "polytile.names", "polytile.version", "polytile.zoo")
#: stages in the order data flows; a module imports only its own stage or earlier ones
STAGES = ("polytile.frontend", "polytile.poly", "polytile.codegen", "polytile.search")
#: inside poly, the same rule between its subpackages
POLY = ("ir", ("ast", "lower"), ("analysis", "transform"), "default", "dsl", "oracle")
MAX_LINES = 700


def _type_checking_only(tree: ast.Module) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skip


def import_graph() -> nx.DiGraph:
    """Module → the modules it imports anywhere in its body. `from pkg import mod` is an
    edge to `pkg.mod` only: the package's `__init__` is only traversed."""
    mods = source_files()
    graph = nx.DiGraph()
    for name, path in mods.items():
        graph.add_node(name)
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package[: len(package) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in mods else base)
            graph.add_edges_from((name, t) for t in targets if t in mods and t != name)
    return graph


def rank(module: str) -> tuple[int, int]:
    if module.startswith(BASE):
        return (0, 0)
    for i, stage in enumerate(STAGES, start=1):
        if module == stage or module.startswith(stage + "."):
            if stage != "polytile.poly" or module == stage:
                return (i, 0)
            sub = module.split(".")[2]
            inner = [j for j, s in enumerate(POLY) if sub == s or sub in s]
            assert inner, f"{module}: poly subpackage missing from POLY in this test"
            return (i, inner[0])
    return (len(STAGES) + 1, 0)  # the public layer


def test_the_walk_finds_the_stages() -> None:
    graph = import_graph()
    assert ("polytile.compiler", "polytile.frontend.importer") in graph.edges
    assert ("polytile.poly.ir.kernel", "polytile.poly.ir.expr") in graph.edges
    assert len(graph) > 100


def test_no_import_cycles() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, f"import cycles (lazy imports count): {cycles}"


def test_no_stage_imports_a_later_stage() -> None:
    upward = [(a, b) for a, b in import_graph().edges if rank(b) > rank(a)]
    assert not upward, f"imports against the data flow: {upward}"


def test_production_code_never_imports_the_oracles() -> None:
    oracle = "polytile.poly.oracle"
    bad = [
        (a, b)
        for a, b in import_graph().edges
        if b.startswith(oracle) and not a.startswith(oracle)
    ]
    assert not bad, f"the test oracles imported by production code: {bad}"


@pytest.mark.parametrize("folder", [*STAGE_FOLDERS, "tests", "benchmarks"])
def test_no_module_over_the_limit(folder: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


#: CPU model names (LLVM's, and the families they belong to): package code keys nothing
#: to them, comments included; machine choices follow the target's parameters instead
CPU_NAMES = re.compile(
    r"znver|\bzen\b|rocketlake|rocket lake|skylake|icelake|ice lake|sapphirerapids|"
    r"emeraldrapids|graniterapids|cascadelake|cooperlake|haswell|broadwell|alderlake|"
    r"raptorlake|tigerlake|cannonlake|neoverse|cortex-a",
    re.I,
)


def test_no_cpu_model_name_in_package_code() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in source_files().values()
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if CPU_NAMES.search(line)
    ]
    assert not found, "CPU model names in package code:\n" + "\n".join(found)
