"""No circle of imports in the product (devplugin/) or its test doubles (devplugin_sim/), and none between the
shim's .c files.

Python: every import counts, at module level, inside a function or under `if TYPE_CHECKING:`: an import that a
function runs late still closes a loop a reader has to follow. The shim: a .c file depends on the .c file that
defines a function it uses from a header it includes (directly or through another header, and through the header's
inline functions and macros)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("devplugin", "devplugin_sim")
SHIM = REPO / "shim"

Graph = Mapping[str, Iterable[str]]


def python_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement in `module` may load (the named module and each `from` name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `modules` it imports anywhere in its file (a package's own __init__ included)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(name, is_package, node):
                parts = target.split(".")
                for end in range(1, len(parts) + 1):  # loading a.b.c runs a/__init__ and a/b/__init__ first
                    loaded = ".".join(parts[:end])
                    if loaded in modules and loaded != name and not name.startswith(loaded + "."):
                        graph[name].add(loaded)
    return graph


_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.DOTALL)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_CALLED = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_PARAMETERS = r"\((?:[^;{}()]|\([^;{}()]*\))*\)"  # one level of parentheses inside: function pointers
_NOT_A_NAME = r"(?!(?:if|for|while|switch|return|sizeof)\b)"
_PROTOTYPE = re.compile(rf"^(?!\s*(?:typedef|#))[^;{{}}()#=]*?\b{_NOT_A_NAME}([A-Za-z_]\w*)\s*{_PARAMETERS}\s*;",
                        re.MULTILINE)
_DEFINITION = re.compile(rf"^(?!\s*#)[^;{{}}()#=]*?\b{_NOT_A_NAME}([A-Za-z_]\w*)\s*{_PARAMETERS}\s*\{{", re.MULTILINE)
_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
_EXTERN = re.compile(r"^\s*extern\b[^;(]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*;", re.MULTILINE)
_GLOBAL = re.compile(r"^(?!\s*(?:static|extern|typedef|#)\b)[^;(#]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?:=[^;]*)?;",
                     re.MULTILINE)
_MACRO = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)((?:[^\n]*\\\n)*[^\n]*)", re.MULTILINE)


def _code(path: Path) -> str:
    """The file without comments, string literals and attributes."""
    return _ATTRIBUTE.sub(" ", _COMMENT.sub(lambda m: " " if m.group(0).startswith("/") else '""', path.read_text()))


def _bodies(code: str) -> dict[str, str]:
    """Name -> text of each function body (and each macro's replacement) the code defines."""
    bodies = {m.group(1): m.group(2) for m in _MACRO.finditer(code)}
    for match in _DEFINITION.finditer(code):
        depth, end = 1, match.end()
        while depth and end < len(code):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            end += 1
        bodies[match.group(1)] = code[match.end() : end]
    return bodies


def _defined_variables(code: str) -> set[str]:
    """The variables a .c file defines at file scope for others to use (not static, not extern)."""
    top, depth = [], 0
    for char in code:  # the text outside every brace
        depth += {"{": 1, "}": -1}.get(char, 0)
        top.append(char if depth == 0 and char != "}" else " ")
    return {m.group(1) for m in _GLOBAL.finditer("".join(top))}


def shim_graph(shim: Path) -> dict[str, set[str]]:
    """.c file -> the .c files that define a function it uses through a header it includes."""
    paths = sorted([*shim.glob("*.c"), *shim.glob("*.h")])
    code = {path.name: _code(path) for path in paths}
    includes = {path.name: {h for h in _INCLUDE.findall(path.read_text()) if h in code} for path in paths}
    declared = {name: {*_PROTOTYPE.findall(text), *_EXTERN.findall(text)}
                for name, text in code.items() if name.endswith(".h")}
    header_bodies = {name: _bodies(text) for name, text in code.items() if name.endswith(".h")}
    definer: dict[str, str] = {}
    for name, text in code.items():
        if name.endswith(".c"):
            for function in _bodies(text):
                definer.setdefault(function, name)
            for variable in _defined_variables(text):
                definer.setdefault(variable, name)

    def reached(name: str) -> set[str]:
        seen: set[str] = set()
        todo = list(includes[name])
        while todo:
            header = todo.pop()
            if header not in seen:
                seen.add(header)
                todo.extend(includes[header])
        return seen

    graph: dict[str, set[str]] = {}
    for name, text in code.items():
        if not name.endswith(".c"):
            continue
        headers = reached(name)
        visible = {f for h in headers for f in declared[h]}
        inline = {f: body for h in headers for f, body in header_bodies[h].items()}
        used: set[str] = set()
        todo = set(_IDENT.findall(text))
        while todo:  # a header's inline function or macro uses what its body names
            ident = todo.pop()
            if ident not in used:
                used.add(ident)
                todo.update(_IDENT.findall(inline.get(ident, "")))
        graph[name] = {definer[f] for f in used & visible if f in definer and definer[f] != name}
    return graph


def knots(graph: Graph) -> list[set[str]]:
    """The groups of two or more nodes that all reach each other (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(groups, key=min)


def shortest_circle(graph: Graph, group: set[str]) -> list[str]:
    """A shortest circle inside `group` through its first node (in name order), starting and ending there."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return [*paths[node], start]
                if nxt in group and nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise ValueError(f"{sorted(group)} is not a knot of the graph")


def cycles(graph: Graph) -> list[list[str]]:
    """One shortest circle through each knot of the graph; empty when the graph has none."""
    return [shortest_circle(graph, group) for group in knots(graph)]


def _say(graph: Graph) -> str:
    """Each knot of the graph: a circle through it, and every member when the knot holds more."""
    lines = []
    for group in knots(graph):
        circle = shortest_circle(graph, group)
        more = f"  (all of {', '.join(sorted(group))} reach each other)" if len(group) > len(circle) - 1 else ""
        lines.append(" -> ".join(circle) + more)
    return "\n".join(lines)


def test_the_python_packages_import_in_no_circle() -> None:
    graph = import_graph(python_modules(REPO, PACKAGES))
    assert not knots(graph), "import circles:\n" + _say(graph)


def test_the_shim_s_c_files_call_each_other_in_no_circle() -> None:
    graph = shim_graph(SHIM)
    assert not knots(graph), ".c files that use each other:\n" + _say(graph)


def test_a_function_level_import_closes_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def later() -> None:\n    from . import a\n")
    (package / "c.py").write_text("import pkg.a\nfrom pkg.sub import d\n")
    (package / "sub").mkdir()
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "d.py").write_text("")
    graph = import_graph(python_modules(tmp_path, ["pkg"]))
    assert graph["pkg.c"] == {"pkg.a", "pkg.sub", "pkg.sub.d"}  # a package's __init__ runs before its modules
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_a_call_through_a_header_s_inline_function_closes_a_circle(tmp_path: Path) -> None:
    (tmp_path / "a.h").write_text('#include "b.h"\nint a_get(void);\n')
    (tmp_path / "a.c").write_text('#include "a.h"\nint a_get(void)\n{\n    return b_ready();\n}\n')
    (tmp_path / "b.h").write_text("int b_setup(void);\nstatic inline int b_ready(void)\n{\n    return b_setup();\n}\n")
    (tmp_path / "b.c").write_text('#include "b.h"\n#include "a.h"\nint b_setup(void)\n{\n    return a_get();\n}\n')
    (tmp_path / "c.c").write_text('#include "a.h"\nint main(void)\n{\n    return a_get();\n}\n')
    graph = shim_graph(tmp_path)
    assert graph == {"a.c": {"b.c"}, "b.c": {"a.c"}, "c.c": {"a.c"}}
    assert cycles(graph) == [["a.c", "b.c", "a.c"]]


