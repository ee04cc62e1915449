"""The house's layout (issue #25), read from the source: packages by role in one order, each
importing only those below it; no import circle between modules; nothing at noded's root but
the entry point and the config; the product never imports the simulation (the simulated node
is another distribution, sim/), except where the CLI's sim commands load it when asked."""

from __future__ import annotations

import ast
import functools
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]  # tests/unit/ up
PRODUCT = ("noded", "resctrl", "mps")

#: Lowest first. A package may import its own modules, any package in a lower layer, and the
#: libraries resctrl and mps; never a package of its own layer or one above.
LAYERS = (
    ("noded.util",),
    ("noded.stores",),
    ("noded.jobs",),
    ("noded.config",),
    ("noded.samplers", "noded.server"),
    ("noded.knobs",),  # what a controller reads and may propose, per knob: the controllers' one vocabulary
    # the controllers: each proposes on its own, none knows another
    ("noded.policy", "noded.rightsize", "noded.capping", "noded.colocation"),
    ("noded.actuators",),
    ("noded.loop",),
    ("noded.admin",),
    ("noded.integrations",),
    ("noded.commands",),
    ("noded.__main__",),
)
LIBRARIES = ("resctrl", "mps")
#: The only modules that may load the simulation, inside the functions of the sim commands.
LOADS_THE_SIMULATION = {"noded.commands.cli"}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for top in PRODUCT:
        for path in (REPO / top).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def imports(path: pathlib.Path, *, top_level_only: bool) -> frozenset[str]:
    """Every module a file imports (``from a.b import c`` counts a.b and a.b.c); blocks under
    ``if TYPE_CHECKING`` are annotations, not arrows, and are skipped."""
    found: set[str] = set()

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            inner = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.level == 0 and child.module and \
                    not (top_level_only and depth):
                found.add(child.module)
                found.update(f"{child.module}.{alias.name}" for alias in child.names)
            elif isinstance(child, ast.Import) and not (top_level_only and depth):
                found.update(alias.name for alias in child.names)
            visit(child, inner)

    visit(_tree(path), 0)
    return frozenset(found)


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "noded" and len(parts) > 1 else parts[0]


def layer_of(package: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    return None


MODULES = modules()


def arrows() -> list[tuple[str, str]]:
    return [(a, b) for a, path in MODULES.items() for b in imports(path, top_level_only=False)
            if b in MODULES and b != a]


def test_every_noded_package_has_a_layer_and_nothing_else_sits_at_the_root():
    packages = {package_of(m) for m in MODULES if m.startswith("noded.")}
    assert packages - {p for layer in LAYERS for p in layer} == set(), "a package with no place in LAYERS"
    root = sorted(p.name for p in (REPO / "noded").glob("*.py"))
    assert root == ["__init__.py", "__main__.py", "config.py"]


def test_no_arrow_runs_up_or_sideways():
    wrong = []
    for a, b in arrows():
        pa, pb = package_of(a), package_of(b)
        if pa == pb or pb in LIBRARIES or pa in LIBRARIES or pb == "noded":
            continue
        if layer_of(pb) >= layer_of(pa):
            wrong.append(f"{a} -> {b}")
    assert wrong == []


def test_the_libraries_import_no_noded():
    assert [(a, b) for a, b in arrows() if package_of(a) in LIBRARIES and b.startswith("noded")] == []


def test_no_circle_between_modules():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for path_module, path in MODULES.items():
        # a package's __init__ importing its own modules is how packages re-export: not a circle
        graph[path_module] = {b for b in imports(path, top_level_only=True) if b in MODULES and b != path_module
                              and not (MODULES[path_module].name == "__init__.py"
                                       and b.startswith(path_module + "."))}
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def strongconnect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            strongconnect(v)
    assert circles == []


def test_the_product_does_not_import_the_simulation():
    assert [(module, m) for module in sorted(MODULES)
            for m in imports(MODULES[module], top_level_only=module in LOADS_THE_SIMULATION)
            if m.split(".")[0] == "nodesim"] == []
