"""The architecture's import rules as import-linter contracts (pyproject.toml [tool.importlinter]).

The runtime tests (test_ui_pilot.py, test_ui_chat.py, test_plan.py, test_telemetry.py) drive a process
and look at sys.modules; the contracts read every import statement of the package. Here: the
contracts hold, import-linter really sees an import inside a function (the reason no AST checker of
our own is needed), and every import a contract ignores is one inside a function, so an ignore can
never hide a module-level import of torch."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")

pytestmark = pytest.mark.skipif(not Path(LINT_IMPORTS).exists(), reason="import-linter not installed (dev extra)")


def lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LINT_IMPORTS, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(cwd)})


def test_the_contracts_hold():
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def test_import_linter_sees_an_import_inside_a_function(tmp_path):
    pkg = tmp_path / "app"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("X = 1\n")
    (pkg / "helper.py").write_text("def load():\n    from app import heavy\n    return heavy.X\n")
    (pkg / "ui.py").write_text("from app import helper\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = app\n\n"
        "[importlinter:contract:ui]\nname = ui never imports heavy\ntype = forbidden\n"
        "source_modules =\n    app.ui\nforbidden_modules =\n    app.heavy\n")
    res = lint_imports(tmp_path)
    # the lazy import, reached through another module, breaks the contract, with its line
    assert res.returncode == 1, res.stdout + res.stderr
    assert "app.helper -> app.heavy (l.2)" in res.stdout, res.stdout
    (pkg / "helper.py").write_text("def load():\n    return 1\n")
    assert lint_imports(tmp_path).returncode == 0


def _module_file(module: str) -> Path:
    base = ROOT / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _imports_of(tree: ast.Module, target: str) -> list[tuple[int, bool]]:
    """(line, inside a function) for every import of ``target`` (or a submodule of it) in ``tree``."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
            if any(n == target or n.startswith(target + ".") for n in names):
                found.append((child.lineno, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def test_every_ignored_import_is_one_inside_a_function():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    ignores = {rule for c in contracts for rule in c.get("ignore_imports", [])}
    assert ignores, "the contracts ignore nothing: drop this test's premise"
    for rule in sorted(ignores):
        importer, imported = (part.strip() for part in rule.split("->"))
        assert "*" not in importer + imported, f"{rule}: name the modules (a wildcard could hide a new import)"
        sites = _imports_of(ast.parse(_module_file(importer).read_text()), imported)
        assert sites, f"{rule}: {importer} does not import {imported} any more; drop the ignore"
        top_level = [line for line, in_function in sites if not in_function]
        assert not top_level, f"{rule}: {importer} imports {imported} at module level (line {top_level}), for every process"


# two-way package dependencies (issue 32: none), counted with the imports inside functions; the
# layers contract in pyproject.toml says the same through import-linter, this reads the files itself
KNOWN_TWO_WAY: set[tuple[str, str]] = set()


def package_imports() -> dict[str, set[str]]:
    """cockpit package -> the cockpit packages its modules import (lazy imports included)."""
    deps: dict[str, set[str]] = {}
    for path in (ROOT / "cockpit").rglob("*.py"):
        pkg = path.relative_to(ROOT / "cockpit").parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if parts[0] == "cockpit" and len(parts) > 1 and parts[1] != pkg:
                    deps.setdefault(pkg, set()).add(parts[1])
    return deps


def test_no_new_two_way_package_dependencies():
    deps = package_imports()
    two_way = {tuple(sorted((a, b))) for a, targets in deps.items() for b in targets if a in deps.get(b, set())}
    assert two_way == KNOWN_TWO_WAY, f"new: {sorted(two_way - KNOWN_TWO_WAY)}, gone (drop them): {sorted(KNOWN_TWO_WAY - two_way)}"
    assert not deps.get("store"), deps.get("store")  # the run-dir contract is the lowest layer


def test_the_layers_contract_places_every_package_once():
    """The layers contract is exhaustive (import-linter refuses a package it does not list); here the
    list itself: each cockpit package or top-level module in exactly one layer, the store at the bottom."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    assert layers["exhaustive"] is True and layers["containers"] == ["cockpit"]
    placed = [name.strip() for layer in layers["layers"] for name in layer.split("|")]
    present = {p.name.removesuffix(".py") for p in (ROOT / "cockpit").iterdir()
               if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert sorted(placed) == sorted(present)
    assert "store" in layers["layers"][-1]
