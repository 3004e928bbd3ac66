"""The package map in docs/design.md is true: every import follows it, shipped code never imports
the test harness, no module reaches for another's private names (imported, or as attributes of
the module), no modules of the stream layer,
the bookie or the protocol codec import each other in a circle, each package says its role."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("bookkeeper", "dlog", "dlog_spark", "dlog_tools", "pyspark_dlog")
PROJECT = (*SHIPPED, "tests")
# packages none of whose modules import each other in a circle
CIRCLE_FREE = ("dlog", "bookkeeper.bookie", "bookkeeper.protocol")


def package_map() -> dict[str, set[str]]:
    """package -> the packages it may import, read from the table in docs/design.md."""
    text = (ROOT / "docs/design.md").read_text()
    section = text.split("## The package map", 1)[1].split("\n## ", 1)[0]
    rules: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        package = cells[0].strip("`")
        allowed = set(re.findall(r"`([a-z_.]+)`", cells[2]))
        rules[package] = {"*"} if cells[2].startswith("everything") else allowed
    return rules


def module_files() -> Iterator[tuple[str, Path]]:
    for top in (*SHIPPED, "tests/harness"):
        path = ROOT / top
        files = [path.with_suffix(".py")] if not path.is_dir() else sorted(path.rglob("*.py"))
        for file in files:
            parts = list(file.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), file


def imports_of(file: Path, module: str) -> Iterator[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import, also inside functions and
    TYPE_CHECKING blocks; relative imports resolved against `module`."""
    is_package = file.name == "__init__.py"
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            yield imported_from(node, module, is_package), [alias.name for alias in node.names], node.lineno


def imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` names, a relative one resolved against `module`."""
    target = node.module or ""
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([target] if target else []))
    return target


def owner(module: str, packages: set[str]) -> str | None:
    """The longest package of the map that contains `module`."""
    parts = module.split(".")
    for length in range(len(parts), 0, -1):
        candidate = ".".join(parts[:length])
        if candidate in packages:
            return candidate
    return None


def import_graph(top: str) -> dict[str, set[str]]:
    """module -> the modules under `top` it imports (also inside functions and TYPE_CHECKING
    blocks); `from package import name` counts as importing the module `name` when there is one."""
    modules = {module: file for module, file in module_files() if module == top or module.startswith(top + ".")}
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, file in modules.items():
        for target, names, _ in imports_of(file, module):
            for imported in [f"{target}.{name}" if f"{target}.{name}" in modules else target for name in names or [""]]:
                if imported in modules and imported != module:
                    graph[module].add(imported)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (they all import each other, directly
    or not), sorted."""
    found: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def circle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """One circle inside a strongly connected group: from its first module back to it."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target in sorted(graph[module] & group):
            if target == start:
                return paths[module] + [start]
            if target not in paths:
                paths[target] = paths[module] + [target]
                queue.append(target)
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def test_the_map_names_every_package_with_code():
    rules = package_map()
    assert {"bookkeeper", "bookkeeper.protocol", "dlog", "dlog_spark", "dlog_tools", "tests.harness"} <= set(rules)
    for module, _ in module_files():
        assert owner(module, set(rules)) is not None, f"{module} is in no package of the map"


def test_every_import_follows_the_map():
    rules = package_map()
    packages = set(rules)
    broken = []
    for module, file in module_files():
        source = owner(module, packages)
        for target, _, line in imports_of(file, module):
            if target.split(".")[0] not in PROJECT:
                continue
            destination = owner(target, packages)
            allowed = rules[source]  # type: ignore[index]
            if destination == source or "*" in allowed:
                continue
            if destination is None or destination not in allowed:
                broken.append(f"{file.relative_to(ROOT)}:{line}: {source} imports {target} "
                              f"({destination or 'not in the map'}); the map allows {sorted(allowed)}")
    assert not broken, "imports across the package map:\n" + "\n".join(broken)


def test_shipped_code_never_imports_the_tests():
    offenders = [f"{file.relative_to(ROOT)}:{line}: {target}"
                 for module, file in module_files() if not module.startswith("tests")
                 for target, _, line in imports_of(file, module) if target.split(".")[0] == "tests"]
    assert not offenders, offenders


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for module, file in module_files():
        for target, names, line in imports_of(file, module):
            if target.split(".")[0] not in PROJECT or target == module:
                continue
            private = [name for name in names if name.startswith("_") and not name.startswith("__")]
            if private:
                offenders.append(f"{file.relative_to(ROOT)}:{line}: {private} from {target}")
    assert not offenders, "private names used across modules:\n" + "\n".join(offenders)


def module_bindings(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> dict[str, str]:
    """Local name -> the module of ours it stands for, from every import in the file: `import a.b`
    binds `a`, `import a.b as m` binds `m`, and `from a import b` binds `b` when `a.b` is a module."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            target = imported_from(node, module, is_package)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
    return bound


def private_attribute_uses(source: str, module: str, modules: set[str],
                           is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, `module._name`) for each private name of another module of ours reached as an
    attribute of that module (`import a.b as m; m._x`, `a.b._x`, `from a import b; b._x`)."""
    tree = ast.parse(source)
    bound = module_bindings(tree, module, is_package, modules)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in bound or len(chain) < 1:
            continue
        owner_module = bound[base.id]
        for index, name in enumerate(chain):
            if f"{owner_module}.{name}" in modules:
                owner_module = f"{owner_module}.{name}"
                continue
            if index == len(chain) - 1 and name.startswith("_") and not name.startswith("__") \
                    and owner_module != module:
                yield node.lineno, f"{owner_module}.{name}"
            break


def test_no_module_reaches_for_another_modules_private_names_as_attributes():
    modules = {module for module, _ in module_files()}
    offenders = [f"{file.relative_to(ROOT)}:{line}: {used}"
                 for module, file in module_files()
                 for line, used in private_attribute_uses(file.read_text(), module, modules,
                                                          file.name == "__init__.py")]
    assert not offenders, "private names used across modules:\n" + "\n".join(sorted(set(offenders)))


def test_the_private_attribute_check_finds_each_way_of_reaching_in():
    modules = {"dlog", "dlog.core", "dlog.core.reader", "bookkeeper", "bookkeeper.errors"}
    source = """
import bookkeeper.errors
import dlog.core.reader as reader_module
from dlog.core import reader
from bookkeeper.errors import DlogError

bookkeeper.errors._BY_STATUS[1]
reader_module._position(1)
reader._helper
reader.public_name
reader.__name__
DlogError._not_a_module
"""
    found = [used for _, used in private_attribute_uses(source, "dlog.writer", modules)]
    assert sorted(found) == ["bookkeeper.errors._BY_STATUS", "dlog.core.reader._helper",
                             "dlog.core.reader._position"]
    # a module may use its own private names however it reaches them
    assert list(private_attribute_uses("import dlog.core.reader as me\nme._own\n", "dlog.core.reader",
                                       modules)) == []


@pytest.mark.parametrize("package", ["bookkeeper", "bookkeeper/protocol", "bookkeeper/meta",
                                     "bookkeeper/client", "bookkeeper/bookie", "bookkeeper/autorecovery", "dlog", "dlog/segments", "dlog/core", "dlog/serve", "dlog/serve/kafka",
                                     "dlog_spark", "dlog_tools", "dlog_tools/cli", "dlog_tools/bench", "tests/harness",
                                     "tests/harness/sim", "tests/harness/faults"])
def test_every_package_says_its_role(package):
    init = ROOT / package / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text()))
    assert docstring and len(docstring) > 40, f"{init.relative_to(ROOT)} needs a docstring saying its role"


@pytest.mark.parametrize("top", CIRCLE_FREE)
def test_no_modules_import_each_other_in_a_circle(top):
    graph = import_graph(top)
    found = [f"{', '.join(group)} (as in {' -> '.join(circle_through(graph, set(group)))})"
             for group in circles(graph)]
    assert not found, f"modules of {top} import each other in a circle:\n" + "\n".join(found)


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set()}
    assert circles(graph) == [["a", "b", "c"]] and circle_through(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_map_catches_an_import_against_it(tmp_path):
    """The checker itself can fail: an import from bookkeeper.protocol up into dlog breaks the map."""
    rules = package_map()
    bad = tmp_path / "bad.py"
    bad.write_text("from dlog.namespace import Namespace\n")
    (target, _, _), = imports_of(bad, "bookkeeper.protocol.bad")
    destination = owner(target, set(rules))
    assert destination == "dlog" and destination not in rules["bookkeeper.protocol"]
    # and the sans-IO stream core may not reach up into its own drivers
    assert owner("dlog.writer", set(rules)) not in rules["dlog.core"]


def test_test_modules_have_unique_basenames():
    """pytest's rootdir-relative import mode maps a test file to a module by its basename in
    directories without an __init__.py; two files with one basename stop collection."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert clashes == []
