"""The package's layers: every import points down the layer order (docs/layout.md, "Layers"), and no import cycle
joins verispec's modules; imports deferred into functions count, those under TYPE_CHECKING do not.

A static check: every module's `import` statements are read from its syntax tree, so an upward import or a cycle
shows even when the order the tests happen to import things in would hide it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import verispec

ROOT = Path(verispec.__file__).parent


def module_names(root: Path = ROOT, package: str = "verispec") -> dict[str, Path]:
    """Return every module of the package under `root` by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _in_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """Return (imported module, deferred into a function) for each import of the package's modules by `name`.

    `from a.b import c` imports the module a.b.c when there is one, else a.b. Importing a.b.c also runs the
    packages a and a.b first, unless the importer lies inside them (they are then already being imported).
    """
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from the importer's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        if _type_checking_only(node, parents):
            continue
        deferred = _in_function(node, parents)
        for target in targets:
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                run = ".".join(parts[:depth])
                inside = name == run or name.startswith(run + ".")
                if run in modules and not inside:
                    found.append((run, deferred))
    return found


def import_graph(include_deferred: bool, modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Return module -> the package modules it imports (at import time; also inside functions if asked)."""
    modules = modules if modules is not None else module_names()
    return {
        name: {target for target, deferred in imports_of(name, path, modules) if include_deferred or not deferred}
        for name, path in modules.items()
    }


# The layers, lowest first (docs/layout.md, "Layers"): a module imports its own layer and those below, never one
# above. A module's layer is that of the longest name listed that it is or lies inside ("" is the package's own
# `__init__`, its public face); a command-line module (`cli`, `*_cli`, `__main__`) is the top layer wherever it lives.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # leaf modules: errors, the cache folder, sampling and the logit processors, closed forms, prompt sets, traces
    ("foundation", ("errors", "cache", "provenance", "inputs", "limits", "sampling", "processors", "logprobs", "stats",
                    "theory", "costmodel", "prompt_sets", "trace")),
    ("rules", ("verify", "methods", "variants")),  # the pure verification rules and the method registry over them
    ("native", ("native",)),  # C++ kernels and their build; the law kernel registers into verify.kernels
    # the model protocol and backends; llama.cpp's build sits with its backend (it requantises the embedded pair)
    ("models", ("models", "native.llamacpp_build")),
    ("drafting", ("drafting", "drafters", "config", "diagnostics")),
    ("engine", ("engine", "scoring")),  # the decode loop and its passes over the models
    ("learned", ("learned",)),  # SPRINTER's verifier: collected and evaluated through the engine
    ("api", ("api",)),
    ("apps", ("options", "profile", "bench", "serve", "vllm")),
    ("cli", ("cli", "__main__", "")),
]


def layer_of(name: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS, package: str = "verispec") -> int:
    """Return the index in `layers` of module `name`'s layer; raise KeyError for a module in none."""
    last = name.rsplit(".", 1)[-1]
    if name != package and (last in ("cli", "__main__") or last.endswith("_cli")):
        return len(layers) - 1
    relative = name.removeprefix(package).removeprefix(".")
    best: tuple[int, int] | None = None  # (length of the name matched, layer)
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            inside = relative == prefix or (prefix != "" and relative.startswith(prefix + "."))
            if inside and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise KeyError(f"{name} lies in no layer: add it to LAYERS (and to docs/layout.md)")
    return best[1]


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]] = LAYERS,
                   package: str = "verispec") -> list[str]:
    """Return "importer (layer) -> imported (layer)" for every import of a module in a higher layer."""
    found = []
    for name in sorted(graph):
        own = layer_of(name, layers, package)
        for target in sorted(graph[name]):
            if (theirs := layer_of(target, layers, package)) > own:
                found.append(f"{name} ({layers[own][0]}) -> {target} ({layers[theirs][0]})")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one import cycle as [a, b, ..., a], or None when the graph has none (depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.parametrize("include_deferred", [False, True], ids=["module-level", "with-deferred"])
def test_the_package_has_no_import_cycle(include_deferred):
    graph = import_graph(include_deferred)
    assert len(graph) > 40 and "verispec.engine" in graph["verispec.api"]  # the walk really read the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_sees_a_cycle_through_a_deferred_import_and_a_package(tmp_path):
    """A planted cycle through a deferred import and a package: `api` defers an import of
    `learned.verifier` (which runs `learned/__init__`), and `learned.collect` defers one of `api`."""
    root = tmp_path / "pkg"
    (root / "learned").mkdir(parents=True)
    (root / "__init__.py").write_text("from pkg.api import Decoder\n")
    (root / "api.py").write_text("class Decoder:\n    def v(self):\n        from pkg.learned.verifier import V\n")
    (root / "learned" / "__init__.py").write_text("from pkg.learned.collect import collect\n")
    (root / "learned" / "verifier.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                  "    from pkg.api import Decoder\nclass V: ...\n")
    (root / "learned" / "collect.py").write_text("def collect():\n    from pkg import api\n")
    modules = module_names(root, "pkg")
    assert find_cycle(import_graph(False, modules)) is None  # the deferred edges only
    assert find_cycle(import_graph(True, modules)) == ["pkg.api", "pkg.learned", "pkg.learned.collect", "pkg.api"]
    (root / "learned" / "collect.py").write_text("from .. import api\n")  # relative, and at import time
    assert find_cycle(import_graph(False, modules)) is None  # api's edge is still deferred
    assert find_cycle(import_graph(True, modules))[0] == "pkg.api"


def test_every_import_points_down_the_layers():
    graph = import_graph(include_deferred=True)
    assert len(graph) > 40 and "verispec.native.laws" in graph["verispec.engine"]  # the walk really read the package
    upward = upward_imports(graph)
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_pure_rules_reach_no_native_code():
    """The verification rules keep their torch reference; the C++ law kernel is registered into them from above."""
    graph = import_graph(include_deferred=True)
    rules = {name: targets for name, targets in graph.items() if name.startswith("verispec.verify")}
    assert "verispec.verify.kernels" in rules["verispec.verify.block"]
    assert not {t for targets in rules.values() for t in targets if t.startswith("verispec.native")}


def test_the_check_sees_an_upward_import_deferred_into_a_function(tmp_path):
    """A planted upward edge: a rule defers an import of the native kernel into a function; an import of it under
    TYPE_CHECKING, and the kernel's own import of the rules, are not upward."""
    layers = [("low", ("errors",)), ("rules", ("verify",)), ("native", ("native",)), ("cli", ("cli", ""))]
    root = tmp_path / "pkg"
    (root / "verify").mkdir(parents=True)
    (root / "native").mkdir()
    (root / "__init__.py").write_text("from pkg import cli\n")
    (root / "errors.py").write_text("class E(Exception): ...\n")
    (root / "cli.py").write_text("from pkg.native import laws\n")
    (root / "verify" / "__init__.py").write_text("")
    (root / "native" / "__init__.py").write_text("")
    (root / "native" / "laws.py").write_text("from pkg.verify.block import law\n")
    (root / "verify" / "block.py").write_text("from typing import TYPE_CHECKING\nfrom pkg.errors import E\n"
                                              "if TYPE_CHECKING:\n    from pkg.native import laws\n"
                                              "def law():\n    return 1\n")
    modules = module_names(root, "pkg")
    assert upward_imports(import_graph(True, modules), layers, "pkg") == []
    (root / "verify" / "block.py").write_text("def law():\n    from pkg.native.laws import kernel\n")
    assert upward_imports(import_graph(False, modules), layers, "pkg") == []  # the planted edge is deferred
    assert upward_imports(import_graph(True, modules), layers, "pkg") == [
        "pkg.verify.block (rules) -> pkg.native (native)", "pkg.verify.block (rules) -> pkg.native.laws (native)"]
    (root / "extra.py").write_text("")
    with pytest.raises(KeyError, match="pkg.extra lies in no layer"):
        upward_imports(import_graph(True, module_names(root, "pkg")), layers, "pkg")


def test_the_engine_reaches_theory_only_through_the_diagnostics_observer():
    """The decode loop holds no closed-form theory: SPRINTER's leak bookkeeping is an observer
    (`verispec.diagnostics`), so the engine's own imports do not name `verispec.theory`."""
    modules = module_names()
    engine = {target for target, _ in imports_of("verispec.engine", modules["verispec.engine"], modules)}
    diagnostics = {target for target, _ in imports_of("verispec.diagnostics", modules["verispec.diagnostics"], modules)}
    assert "verispec.diagnostics" in engine and "verispec.theory" in diagnostics  # the walk read both
    assert "verispec.theory" not in engine
