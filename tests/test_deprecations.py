"""Every old name still answers until 0.2, and none answers silently: each one enumerated
here warns (a ``DeprecationWarning`` / ``FutureWarning`` in Python, a ``note:`` line on stderr
for a command-line spelling) and names what to use instead.

The enumerations are read from the code (the shims' ``MOVED`` tables, every ``add_alias``
call under ``multimodal/cli``), so an alias added later is checked without editing this file.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import multimodal as mm
from multimodal.cli.errors import UsageError
from multimodal.cli.flags import parse
from multimodal.moved import REMOVED_IN

CLI = Path(__file__).resolve().parents[1] / "multimodal" / "cli"
SHIMS = ("hub", "asr", "synthesis", "inference", "chat")


def _import_fresh(module: str) -> tuple[object, list[str]]:
    """``module`` imported again (its warning is raised on import), the package attribute it
    shadows (``mm.chat`` the function) put back afterwards."""
    short = module.rpartition(".")[2]
    before = mm.__dict__.get(short)
    sys.modules.pop(module, None)
    try:
        with pytest.warns(DeprecationWarning) as caught:
            mod = importlib.import_module(module)
    finally:
        sys.modules.pop(module, None)
        if before is None:
            mm.__dict__.pop(short, None)
        else:
            mm.__dict__[short] = before
    return mod, [str(w.message) for w in caught if w.category is DeprecationWarning]


@pytest.mark.parametrize("shim", SHIMS)
def test_every_moved_name_comes_through_a_warning(shim: str) -> None:
    """The moved names (46 of them) are reached only through a module that warns on import
    with the release that removes it; each resolves to the object of its new home."""
    module = f"multimodal.{shim}"
    old, messages = _import_fresh(module)
    assert any(module in m and f"removed in {REMOVED_IN}" in m for m in messages), messages
    for name, home in old.MOVED.items():
        assert getattr(old, name) is getattr(importlib.import_module(home), name), name


def test_the_moved_names_are_all_counted() -> None:
    names = sum(len(_import_fresh(f"multimodal.{s}")[0].MOVED) for s in SHIMS)
    # the 41 names that had moved before, less the two private ones of synthesis (_budget,
    # _chunks), plus the 7 the five modules still defined (hub 4, asr 1, synthesis 2)
    assert names == 46


def test_load_checkpoint_warns_and_still_loads(tmp_path: Path) -> None:
    """``mm.load_checkpoint`` (and ``multimodal.checkpoints.load_checkpoint``) is
    ``mm.from_pretrained`` of a file: the same model, with a warning naming that."""
    import dataclasses

    from multimodal.checkpoints import load_checkpoint

    model = mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1, num_classes=2,
                                dim=16, depth=1, heads=2, mlp_dim=32)).eval()
    path = tmp_path / "run.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "multimodal_model": {"model_type": "ViT",
                                     "model_config": dataclasses.asdict(model.config)}}, path)
    x = torch.randn(1, 1, 8, 8)
    for fn in (mm.load_checkpoint, load_checkpoint):
        with pytest.warns(DeprecationWarning, match=r"from_pretrained.*|removed in 0\.2"):
            again = fn(path)
        torch.testing.assert_close(again(x), model(x))
    assert "load_checkpoint" not in dir(mm)


def test_mm_hub_warns() -> None:
    sys.modules.pop("multimodal.hub", None)
    mm.__dict__.pop("hub", None)  # an earlier ``import multimodal.hub`` set the attribute
    try:
        with pytest.warns(DeprecationWarning, match="multimodal.hub is deprecated"):
            hub = mm.hub
        assert hub.create_model is mm.create_model
    finally:
        sys.modules.pop("multimodal.hub", None)
        mm.__dict__.pop("hub", None)
    assert "hub" not in dir(mm)


def test_text_encoder_pooled_warns_and_equals_pool() -> None:
    enc = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=30, max_len=8, dim=16, depth=1,
                                              heads=2, pooler=True))
    features = torch.randn(2, 5, 16)
    with pytest.warns(DeprecationWarning, match="TextEncoder.pool"):
        old = enc.pooled(features)
    torch.testing.assert_close(old, enc.pool(features))


def test_data_module_old_names_warn() -> None:
    from multimodal.data.splits import held_out_sizes
    from multimodal.data.vision import ImageClassificationDataModule

    with pytest.warns(FutureWarning, match="use --data.init_args.predict"):
        dm = ImageClassificationDataModule("digits", predict_dir="somewhere")
    assert dm.predict == "somewhere"
    with pytest.warns(DeprecationWarning, match="use predict"):
        assert dm.predict_dir == "somewhere"
    with pytest.warns(DeprecationWarning, match="use predict"):
        dm.predict_dir = "elsewhere"
    assert dm.predict == "elsewhere"
    for old, new in (("val_fraction", "val_size"), ("test_fraction", "test_size")):
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new}"):
            held_out_sizes(0.1, 0.1, **{old: 0.2})


def test_monitoring_the_old_accuracy_name_warns() -> None:
    """``val/acc`` is logged beside ``val/acc_macro`` until 0.2; ranking by it warns."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from multimodal.tasks.classification import ClassificationTask

    task = ClassificationTask(mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1,
                                                  num_classes=2, dim=16, depth=1, heads=2,
                                                  mlp_dim=32)))
    task._trainer = SimpleNamespace(callbacks=[ModelCheckpoint(monitor="val/acc")])
    with pytest.warns(FutureWarning, match="monitor val/acc_macro"):
        task._note_old_metric_names()
    task._trainer = SimpleNamespace(callbacks=[ModelCheckpoint(monitor="val/acc_macro")])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task._note_old_metric_names()


def _aliases() -> list[tuple[str, str, str, str]]:
    """``(module, function, old, new)`` for every ``add_alias`` call in cli/: the function
    that makes the call, or, for a helper that adds options to a parser it is given, the
    first verb function (``*main``) of the module that calls the helper."""
    found = []
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        functions = [fn for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)]

        def calls(fn: ast.FunctionDef, name: str) -> bool:
            return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == name
                       for n in ast.walk(fn))

        for fn in functions:
            name = fn.name
            if not calls(fn, "add_alias"):
                continue
            if not name.endswith(("main", "_parser")):
                name = next(f.name for f in functions
                            if f.name.endswith("main") and calls(f, fn.name))
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "add_alias":
                    old, new = (a.value for a in node.args[1:3])
                    found.append((f"multimodal.cli.{path.stem}", name, old, new))
    return found


ALIASES = _aliases()


def test_the_flag_spellings_are_all_found() -> None:
    assert len(ALIASES) == 13, ALIASES


@pytest.mark.parametrize("module,function,old,new", ALIASES,
                         ids=[f"{f}:{o}" for _, f, o, _ in ALIASES])
def test_every_old_flag_spelling_prints_a_note(module: str, function: str, old: str,
                                               new: str, capsys) -> None:
    """The verb itself parses the old spelling (then ``--help`` ends it): one ``note:`` line
    on stderr names the spelling to use and the release that drops the old one."""
    fn = getattr(importlib.import_module(module), function)

    def run(args: list[str]) -> None:
        if function.endswith("_parser"):  # builds the verb's parser
            parse(fn(), args)
        else:
            fn(args)

    with pytest.raises(SystemExit) as done:
        try:
            run([old, "--help"])  # a switch
        except UsageError:
            run([old, "1", "--help"])  # an option with a value
    assert done.value.code == 0
    err = capsys.readouterr().err.splitlines()
    assert f"note: {old} is an old spelling of {new} (removed in {REMOVED_IN}): use {new}" \
        in err, err


@pytest.mark.parametrize("flag", ["--resample", "--mix"])
def test_transcribe_switches_that_do_nothing_say_so(flag: str, tmp_path: Path, capsys) -> None:
    from multimodal.cli.inference import transcribe_main

    with pytest.raises(UsageError):  # no such model: after the note
        transcribe_main(["--model", str(tmp_path / "absent"), "--inputs", "x.wav", flag])
    assert f"note: {flag} is no longer needed (removed in {REMOVED_IN})" in \
        capsys.readouterr().err


# The old public loaders (removed in 0.2): module, name, what the warning points to. Each is
# answered by its module's ``__getattr__``; the package uses multimodal/pipelines/_loaders.py.
OLD_LOADERS = [
    ("multimodal.pipelines.transcribe", "load_transcriber", "multimodal.transcribe"),
    ("multimodal.pipelines.speak", "load_tts", "multimodal.synthesize"),
    ("multimodal.pipelines.caption", "load_captioner", "multimodal.caption"),
    ("multimodal.pipelines.embed", "load_model_encoder", "multimodal.embed"),
    ("multimodal.serve.models", "load_classifier", "multimodal.load"),
    ("multimodal.serve.models", "load_served", "multimodal.load"),
    ("multimodal.serve", "load_served", "multimodal.load"),
    ("multimodal.tasks.pretrained", "load_pretrained", "multimodal.load"),
]
PACKAGE = Path(__file__).resolve().parents[1] / "multimodal"


@pytest.mark.parametrize("module,name,use", OLD_LOADERS,
                         ids=[f"{m.rpartition('.')[2]}.{n}" for m, n, _ in OLD_LOADERS])
def test_every_old_loader_name_warns_naming_load_and_the_verb(module: str, name: str,
                                                             use: str) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning) as caught:
        old = getattr(mod, name)
    message = str(caught[0].message)
    assert f"{name} is deprecated and will be removed in {REMOVED_IN}" in message, message
    assert "multimodal.load(" in message and use in message, message
    assert callable(old)
    assert name not in dir(mod) and name not in getattr(mod, "__all__", [])


def test_the_old_loader_names_are_all_counted() -> None:
    """Every module-level ``__getattr__`` in the package that answers a ``load_*`` name is
    in :data:`OLD_LOADERS` (read with ``ast``: an old loader added later is checked)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in tree.body:  # def __getattr__, or __getattr__ = old_names(...)
            if (isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__") or (
                    isinstance(fn, ast.Assign)
                    and any(getattr(t, "id", None) == "__getattr__" for t in fn.targets)):
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                found |= {(module, n.value) for n in ast.walk(fn)
                          if isinstance(n, ast.Constant) and isinstance(n.value, str)
                          and n.value.startswith("load_")}
    assert found == {(m, n) for m, n, _ in OLD_LOADERS}


def test_no_module_of_the_package_uses_an_old_loader_name() -> None:
    """The package itself calls the pickers of ``multimodal.pipelines._loaders``: no name,
    attribute or import of the package is an old loader name (the shims' ``MOVED`` tables
    and the ``__getattr__`` answers are strings)."""
    old = {n for _, n, _ in OLD_LOADERS}
    used = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.id] if isinstance(node, ast.Name) else [node.attr] \
                if isinstance(node, ast.Attribute) else [a.name for a in node.names] \
                if isinstance(node, (ast.Import, ast.ImportFrom)) else [node.name] \
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []
            used += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {n}"
                     for n in names if n in old]
    assert used == []


def test_the_old_loaders_still_load(tmp_path: Path) -> None:
    """Until 0.2 the old names give what they gave: ``load_pretrained`` the model of
    ``mm.load`` in train mode, ``load_served`` a ``Served`` of the path's kind, the others
    the internal picker they became."""
    from multimodal.pipelines import _loaders
    from multimodal.serve.models import Served

    vit = mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1, num_classes=2,
                              dim=16, depth=1, heads=2, mlp_dim=32)).eval()
    vit.save_pretrained(tmp_path / "vit")
    x = torch.randn(2, 1, 8, 8)
    pretrained = importlib.import_module("multimodal.tasks.pretrained")
    models = importlib.import_module("multimodal.serve.models")
    with pytest.warns(DeprecationWarning):
        source = pretrained.load_pretrained(tmp_path / "vit")
    assert source.model.training and source.kind == "save_pretrained"
    torch.testing.assert_close(source.model.eval()(x), vit(x))
    with pytest.warns(DeprecationWarning):
        served = models.load_served(tmp_path / "vit")
    assert isinstance(served, Served) and served.kind == "embed"
    torch.testing.assert_close(served.model.backbone.forward_features(x),
                               vit.forward_features(x))
    with pytest.warns(DeprecationWarning):
        assert importlib.import_module("multimodal.pipelines.embed").load_model_encoder \
            is _loaders.model_encoder
    with pytest.warns(DeprecationWarning):
        assert models.load_classifier is _loaders.classifier
    with pytest.raises(AttributeError, match="no attribute 'load_nothing'"):
        models.load_nothing
