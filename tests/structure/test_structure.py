"""The shape of the source tree: packages meet only at public seams, no import circles,
files and functions of a readable size, no imports hidden in function bodies.

Each rule is checked on the real tree (``packages/*/src``) and, with a small tree written
for the purpose, shown to catch what it forbids.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 90
MAX_MODULE_LINES = 600


# --------------------------------------------------------------------------- reading the tree


def modules(packages: Path) -> dict[str, tuple[Path, str]]:
    """Every module under ``packages/*/src`` by dotted name, with its file and distribution."""
    found = {}
    for dist in sorted(p for p in packages.iterdir() if (p / "src").is_dir()):
        src = dist / "src"
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = (path, dist.name)
    return found


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run, so no edge)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def imports(name: str, path: Path, known: dict) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``path`` (module ``name``), those in
    function bodies included; ``from package import submodule`` counts as the submodule."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_blocks(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in known else base, node.lineno))
    return [(target, line) for target, line in found if target in known and target != name]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_problems(packages: Path) -> list[str]:
    """Import circles within a package and imports of another distribution's private module."""
    known = modules(packages)
    graph: dict[str, set[str]] = {}
    problems = []
    for name, (path, dist) in known.items():
        for target, line in imports(name, path, known):
            graph.setdefault(name, set()).add(target)
            private = any(part.startswith("_") and part != "__init__" for part in target.split(".")[2:])
            if known[target][1] != dist and private:
                problems.append(
                    f"{path.relative_to(packages)}:{line} imports {target}, private to {known[target][1]}"
                )
    problems += [f"import circle: {' <-> '.join(c)}" for c in cycles(graph)]
    return problems


def size_problems(packages: Path) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines, functions over :data:`MAX_FUNCTION_LINES`."""
    problems = []
    for path, _ in modules(packages).values():
        text = path.read_text()
        where = path.relative_to(packages)
        if text.count("\n") > MAX_MODULE_LINES:
            problems.append(f"{where}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    return problems


def hidden_imports(packages: Path) -> list[str]:
    """Imports inside function bodies without a comment saying which optional dependency
    they wait for (``# optional: ...`` on the line or the line above)."""
    problems = []
    for path, _ in modules(packages).values():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    near = " ".join(lines[max(inner.lineno - 2, 0) : inner.end_lineno])
                    if "optional" not in near:
                        problems.append(f"{path.relative_to(packages)}:{inner.lineno} in {node.name}()")
    return sorted(set(problems))


# --------------------------------------------------------------------------- the real tree


def test_no_import_circle_and_no_private_import_across_distributions():
    assert import_problems(ROOT / "packages") == []


def test_modules_and_functions_of_readable_size():
    assert size_problems(ROOT / "packages") == []


def test_no_import_hidden_in_a_function_body():
    assert hidden_imports(ROOT / "packages") == []


# --------------------------------------------------------------------------- the rules catch what they forbid


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


@pytest.fixture
def bad_tree(tmp_path: Path) -> Path:
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    return _tree(
        tmp_path,
        {
            "iris-a/src/iris/a/__init__.py": "from . import one\n",
            "iris-a/src/iris/a/one.py": "from . import two\n",
            # a circle held apart by an import inside a function
            "iris-a/src/iris/a/two.py": "def f():\n    from .one import g\n    return g\n",
            "iris-a/src/iris/a/_private.py": "import typing\nif typing.TYPE_CHECKING:\n    from . import one\n",  # noqa: E501
            "iris-b/src/iris/b/__init__.py": "from iris.a import _private\n",
            "iris-b/src/iris/b/long.py": f"def long():\n{body}\n" + "\n" * MAX_MODULE_LINES,
            "iris-b/src/iris/b/fine.py": "def f():\n    import numpy  # optional: numpy\n",
        },
    )


def test_the_rules_catch_circles_private_imports_long_code_and_hidden_imports(bad_tree):
    problems = import_problems(bad_tree)
    assert "import circle: iris.a.one <-> iris.a.two" in problems
    assert any("imports iris.a._private, private to iris-a" in p for p in problems)
    assert len(problems) == 2  # the TYPE_CHECKING import is no edge
    sizes = size_problems(bad_tree)
    assert any("long.py:1 long" in p for p in sizes) and any(
        p.startswith("iris-b/src/iris/b/long.py: ") for p in sizes
    )
    assert hidden_imports(bad_tree) == ["iris-a/src/iris/a/two.py:2 in f()"]
