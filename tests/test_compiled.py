"""How the package loads: compiled modules where they are current, their sources where they are
bypassed (router/compiled.py). The import tests run a fresh interpreter on a small package of
their own whose "extension" is not loadable: importing it fails unless the sources are taken."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import router
from router.compiled import INTERPRETED_ENV, choose, extensions, listed

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
REQUIRE_ENV = "LANE_ROUTER_REQUIRE_COMPILED"


def _package(root: Path, *, source_tree: bool, source_newer: bool) -> Path:
    pkg = root / "pkgx"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os\nfrom pathlib import Path\nfrom router.compiled import apply\n"
        "BUILD = apply(__name__, Path(__file__).parent, os.environ)\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    for module in (pkg / "mod", pkg / "sub" / "deep"):
        module.with_suffix(".py").write_text("WHERE = __file__\n")
        module.with_name(module.name + SUFFIX).write_bytes(b"not an extension")
        older, newer = (module.with_name(module.name + SUFFIX), module.with_suffix(".py"))
        if not source_newer:
            older, newer = newer, older
        os.utime(older, (1_000_000, 1_000_000))
        os.utime(newer, (2_000_000, 2_000_000))
    if source_tree:
        (root / "pyproject.toml").write_text("[project]\nname = 'pkgx'\n")
    return pkg


def _import(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "import pkgx, pkgx.mod, pkgx.sub.deep; print(pkgx.BUILD.mode, pkgx.mod.WHERE, pkgx.sub.deep.WHERE)"
    environ = {k: v for k, v in os.environ.items() if k != INTERPRETED_ENV}
    environ |= {"PYTHONPATH": f"{root}{os.pathsep}{ROOT}", **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=60
    )


def test_current_extensions_are_what_loads(tmp_path: Path) -> None:
    _package(tmp_path, source_tree=True, source_newer=False)
    done = _import(tmp_path, {})
    # The finder stayed out of the way: Python took the (unloadable) extension.
    assert done.returncode != 0
    assert "pkgx/mod" in done.stderr and "ImportError" in done.stderr


def test_the_operator_can_choose_the_sources(tmp_path: Path) -> None:
    pkg = _package(tmp_path, source_tree=True, source_newer=False)
    done = _import(tmp_path, {INTERPRETED_ENV: "1"})
    assert done.returncode == 0, done.stderr
    mode, mod, deep = done.stdout.split()
    assert (mode, mod, deep) == ("sources", str(pkg / "mod.py"), str(pkg / "sub" / "deep.py"))


def test_sources_edited_after_compiling_are_what_loads(tmp_path: Path) -> None:
    pkg = _package(tmp_path, source_tree=True, source_newer=True)
    done = _import(tmp_path, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sources", str(pkg / "mod.py"), str(pkg / "sub" / "deep.py")]


def test_an_installed_package_is_not_judged_by_its_file_times(tmp_path: Path) -> None:
    pkg = _package(tmp_path, source_tree=False, source_newer=True)
    assert choose(pkg, {}).mode == "compiled"


def test_the_reason_names_the_changed_sources_and_the_remedy(tmp_path: Path) -> None:
    pkg = _package(tmp_path, source_tree=True, source_newer=True)
    build = choose(pkg, {})
    assert build.extensions == 2
    assert "pkgx/mod.py" in build.reason and "pkgx/sub/deep.py" in build.reason
    assert "scripts/compile.sh" in build.describe()


def test_a_tree_without_extensions_is_interpreted(tmp_path: Path) -> None:
    (tmp_path / "pkgx").mkdir()
    (tmp_path / "pkgx" / "mod.py").write_text("")
    assert choose(tmp_path / "pkgx", {INTERPRETED_ENV: "1"}).describe() == "interpreted"


def test_an_extension_without_its_source_is_not_a_compiled_module(tmp_path: Path) -> None:
    (tmp_path / f"shared__mypyc{SUFFIX}").write_bytes(b"")
    assert extensions(tmp_path) == {}


def test_the_request_path_runs_as_it_was_built() -> None:
    """Every module listed in pyproject.toml loads as the package's build says: as an extension
    when compiled, else from its source. CI compiles the tree (scripts/compile.sh) and sets
    LANE_ROUTER_REQUIRE_COMPILED=1: the build must then be compiled, or, in the run with
    LANE_ROUTER_INTERPRETED=1, its extensions bypassed."""
    names = [path.removesuffix(".py").replace("/", ".") for path in listed(ROOT)]
    build = router.BUILD
    if os.environ.get(REQUIRE_ENV) == "1":
        bypassed = os.environ.get(INTERPRETED_ENV, "") not in ("", "0")
        assert build.mode == ("sources" if bypassed else "compiled"), build.describe()
        assert build.extensions == len(names)
    suffix = SUFFIX if build.mode == "compiled" else ".py"
    assert [name for name in names if not _loaded(name).endswith(suffix)] == []


def _loaded(name: str) -> str:
    module = __import__(name, fromlist=["_"])
    return str(module.__file__)


def _plain_constant(node: ast.stmt) -> str | None:
    """The name `node` binds at module level when it is a constant not marked `Final`."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        name = node.targets[0].id
        type_variable = isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "TypeVar"
        return name if name.lstrip("_").isupper() and not type_variable else None
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id if "Final" not in ast.unparse(node.annotation) else None
    return None


def test_every_constant_of_a_compiled_module_is_final() -> None:
    # A module-level name that is not `Final` is a dictionary lookup at every use in compiled
    # code (docs/compiled.md, "What compiled code still pays for").
    plain = [
        f"{relative}:{node.lineno} {name}"
        for relative in listed(ROOT)
        for node in ast.parse((ROOT / relative).read_text()).body
        if (name := _plain_constant(node)) is not None
    ]
    assert plain == []


def _own_nodes(statements: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes `statements` run themselves (not those of functions and classes they define)."""
    todo: list[ast.AST] = list(statements)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _awaits(statements: list[ast.stmt]) -> list[int]:
    """Lines of the awaits `statements` run themselves."""
    waits = (ast.Await, ast.AsyncFor, ast.AsyncWith)
    return [n.lineno for n in _own_nodes(statements) if isinstance(n, waits)]


def test_no_compiled_coroutine_awaits_in_a_finally_block() -> None:
    # Compiled, a coroutine whose `finally` awaits raises, when the block ends, the exception its
    # caller is handling, though its own `try` ended normally (docs/compiled.md, "What a compiled
    # module must not do"). Clean-up that waits goes in `except BaseException` and after the `try`.
    awaiting = [
        f"{relative}:{line}"
        for relative in listed(ROOT)
        for node in ast.walk(ast.parse((ROOT / relative).read_text()))
        if isinstance(node, ast.Try) and node.finalbody
        for line in _awaits(node.finalbody)
    ]
    assert awaiting == []


def _bare_raises(statements: list[ast.stmt]) -> bool:
    """Whether `statements` themselves re-raise with a bare `raise`."""
    return any(isinstance(n, ast.Raise) and n.exc is None for n in _own_nodes(statements))


def test_no_compiled_handler_awaits_and_then_re_raises_bare() -> None:
    # Compiled, when the exception reached the coroutine through the future it awaited (a task's
    # cancellation, a failed future), what a bare `raise` after the handler's await re-raises is
    # no longer a live object: the process crashes (docs/compiled.md, "What a compiled module
    # must not do"). The handler names the exception and raises it by name.
    bare = [
        f"{relative}:{handler.lineno}"
        for relative in listed(ROOT)
        for node in ast.walk(ast.parse((ROOT / relative).read_text()))
        if isinstance(node, ast.Try)
        for handler in node.handlers
        if _awaits(handler.body) and _bare_raises(handler.body)
    ]
    assert bare == []


def _router_sources() -> Iterator[tuple[str, ast.AST]]:
    for path in sorted((ROOT / "router").rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text())


def test_no_value_is_built_through_the_tuple_constructor() -> None:
    # `tuple.__new__(Cls, (...))` builds a named tuple positionally: mypy accepts a field of the
    # wrong type or a missing one there. Values are classes built with keywords (docs/compiled.md).
    untyped = [
        f"{relative}:{node.lineno}"
        for relative, tree in _router_sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "__new__"
        and isinstance(node.value, ast.Name)
        and node.value.id == "tuple"
    ]
    assert untyped == []


def _class_name(call: ast.Call) -> str | None:
    """The name a call builds an instance by: a capitalised name, or `cls` in a class method."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name if name == "cls" or name.lstrip("_")[:1].isupper() else None


def test_constructors_of_more_than_four_fields_take_keywords() -> None:
    # Five positional arguments or more are a swap mypy cannot see when two fields share a type;
    # keywords cost nothing compiled (mypyc places them at compile time).
    positional = [
        f"{relative}:{node.lineno} {name}"
        for relative, tree in _router_sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and len(node.args) > 4 and (name := _class_name(node)) is not None
    ]
    assert positional == []
