"""The package's layering (docs/architecture.md, "Layers"): each folder under src/historygraph imports
only the layers below it, and ``history/`` is the ground floor. Checked on the source with ``ast``
(every import statement, at module level or inside a function), so an import that would only run
on some path is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import historygraph

PACKAGE = Path(historygraph.__file__).parent

HISTORY_MAY_IMPORT = {"history", "store"}
"""What ``history/`` may import of the package: itself, and ``store/``, the persistence of its
graphs (the session router appends to a store; the stores build graphs), which imports nothing
else of the package either (checked below)."""


def imported(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every import in the module at ``path`` (its text, or
    ``source``; relative imports resolved; ``from a import b`` gives ``a.b``, which names the
    submodule when ``b`` is one)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if package.endswith(".__init__"):
        package = package[: -len(".__init__")]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8") if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out.extend((node.lineno, f"{base}.{alias.name}" if base else alias.name) for alias in node.names)
    return out


def violations(path: Path, allowed: set[str], source: str | None = None) -> list[str]:
    """Each import of ``historygraph.<X>`` with ``X`` not in ``allowed`` in the module at ``path``
    (:func:`imported`), as ``path:line: module``; ``import historygraph`` itself (the package
    imports every layer) counts."""
    bad = []
    for line, name in imported(path, source):
        parts = name.split(".")
        if parts[0] == "historygraph" and (len(parts) < 2 or parts[1] not in allowed):
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name}")
    return bad


def layer_violations(folder: str, allowed: set[str]) -> list[str]:
    """:func:`violations` of every module under ``src/historygraph/<folder>/``."""
    return [v for path in sorted((PACKAGE / folder).rglob("*.py")) for v in violations(path, allowed)]


def test_the_history_layer_imports_nothing_above_it():
    assert list((PACKAGE / "history").glob("*.py")), "no modules found under history/"
    assert layer_violations("history", HISTORY_MAY_IMPORT) == []


def test_the_store_imports_only_the_history_layer():
    assert layer_violations("store", HISTORY_MAY_IMPORT) == []


def test_the_check_sees_imports_of_every_form():
    module = PACKAGE / "history" / "graph.py"
    source = ("import historygraph.signals.tokens\nfrom historygraph.providers import jsonio\n"
              "from ..render import layout\nfrom . import events\nimport historygraph\n"
              "def f():\n    from historygraph.server.convert import TurnCache\n")
    assert [name for _, name in imported(module, source)] == [
        "historygraph.signals.tokens", "historygraph.providers.jsonio", "historygraph.render.layout",
        "historygraph.history.events", "historygraph", "historygraph.server.convert.TurnCache"]
    assert len(violations(module, HISTORY_MAY_IMPORT, source)) == 5  # all but history.events
