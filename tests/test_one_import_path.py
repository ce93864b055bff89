"""One import path per name: a name is imported from the module that defines it.

Read with ``ast`` (nothing is imported): every module of the package that is not a
package ``__init__`` may list in ``__all__`` only names it defines, and every
``from multimodal.<module> import name`` in the package, the tests and the benchmarks
must name the defining module (or a package ``__init__``, which gathers public names on
purpose). So ``grep`` for a name lands on its definition.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "multimodal"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _top_level_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names a module defines, names it imports from the package), at module level
    (inside ``if`` / ``try`` too)."""
    defined: set[str] = set()
    imported: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(n.id for t in targets for n in ast.walk(t)
                               if isinstance(n, ast.Name))
            elif isinstance(node, ast.ImportFrom):
                own = (node.module or "").startswith("multimodal") or node.level > 0
                for alias in node.names:
                    (imported if own else defined).add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                walk(node.body)
                walk(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(tree.body)
    return defined, imported


def _all_names(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple))
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


DEFINED = {m: _top_level_names(ast.parse(p.read_text()))[0] for m, p in MODULES.items()}


def test_all_lists_only_names_the_module_defines() -> None:
    wrong = []
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        foreign = [n for n in _all_names(tree) if n not in DEFINED[module]]
        if foreign:
            wrong.append(f"{path.relative_to(REPO)}: __all__ lists {foreign}, defined elsewhere")
    assert wrong == [], "\n".join(wrong)


def _import_problems(source: str, where: str) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                and node.module.startswith("multimodal.")):
            continue
        target = MODULES.get(node.module)
        if target is None or target.name == "__init__.py":
            continue  # not a module (a typo fails at import time) or a package gathering names
        for alias in node.names:
            submodule = f"{node.module}.{alias.name}" in MODULES
            if alias.name not in DEFINED[node.module] and not submodule:
                problems.append(f"{where}:{node.lineno} imports {alias.name} "
                                f"from {node.module}, which does not define it")
    return problems


def test_every_import_names_the_defining_module() -> None:
    files = [*sorted(PACKAGE.rglob("*.py")), *sorted((REPO / "tests").rglob("*.py")),
             *sorted((REPO / "benchmarks").rglob("*.py"))]
    problems = [p for f in files for p in _import_problems(f.read_text(), str(f.relative_to(REPO)))]
    assert problems == [], "\n".join(problems)


def test_the_check_sees_a_re_export() -> None:
    """The check itself: a package name that a module imports, imported from that module
    again, is reported; the same name from its defining module, and a name from a package
    ``__init__``, are not."""
    problems = _import_problems(
        "from multimodal.data.audio import AudioClassificationDataModule\n"
        "from multimodal.data.audio import AudioFrameTokenizer\n"
        "from multimodal.tokenizers.audio import AudioFrameTokenizer\n"
        "from multimodal.nn import Block\n", "probe.py")
    assert problems == ["probe.py:2 imports AudioFrameTokenizer from multimodal.data.audio, "
                        "which does not define it"]
