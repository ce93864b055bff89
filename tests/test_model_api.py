"""The one model API (docs/models.md, multimodal/models/api.py), run over every registered
model class and every preset: a new model or preset is checked here without a new test."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal.hub import create_model, list_presets
from multimodal.models.api import MODALITIES, Model
from multimodal.weights import MODEL_CLASSES


def _shallow(config: Any) -> Any:
    """``config`` with one layer in every backbone (composite configs: in each part)."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "backbone":
            changes["depth"] = 1
        elif dataclasses.is_dataclass(value):
            changes[f.name] = _shallow(value)
    return dataclasses.replace(config, **changes)


def _class_model(name: str) -> nn.Module:
    cls = MODEL_CLASSES[name]
    return cls(_shallow(cls.config_class())).eval()


def _preset_model(name: str) -> nn.Module:
    try:  # presets built from one config take its fields: one layer keeps the large ones small
        model = create_model(name, depth=1)
    except TypeError:  # composite presets (captioners) take whole sub-configs; they are small
        model = create_model(name)
    return model.eval()


CASES = [pytest.param(_class_model, n, id=f"class-{n}") for n in sorted(MODEL_CLASSES)] + [
    pytest.param(_preset_model, n, id=f"preset-{n}") for n in list_presets()]

# how each decoding model is asked to decode a little, from its example inputs
GENERATE = {
    "TextDecoder": lambda m, x: m.generate(x[0], max_new_tokens=2),
    "ImageGPT": lambda m, x: m.generate(num_images=1,  # a class-conditional one: class 0
                                        class_label=0 if m.config.num_classes else None),
    "Captioner": lambda m, x: m.generate(x[0], max_new_tokens=2),
    "Seq2Seq": lambda m, x: m.generate(x[0], max_new_tokens=2),
    "RNNSeq2Seq": lambda m, x: m.generate(x[0], max_new_tokens=2),
    "Whisper": lambda m, x: m.generate(x[0], max_new_tokens=2),
}


def _unique_param_count(model: nn.Module) -> int:
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = p.numel()
    return sum(seen.values())


def test_every_model_class_is_covered() -> None:
    assert set(MODEL_CLASSES) >= {"ViT", "TextEncoder", "TextDecoder", "ImageGPT", "Captioner",
                                  "Seq2Seq", "AudioClassifier"}
    assert len(list_presets()) >= 10


@pytest.mark.parametrize(("build", "name"), CASES)
def test_contract(build: Any, name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build(name)
    assert isinstance(model, Model), f"{type(model).__name__} lacks a verb of the model API"
    assert model.modality in MODALITIES
    assert isinstance(model.config, type(model).config_class)
    assert model.num_params() == _unique_param_count(model) > 0

    inputs = model.example_inputs(2)
    with torch.no_grad():
        features = model.forward_features(*inputs)
        out = model(*inputs)
        head = model.forward_head(features)
        pooled = model.pool(features)
        pre_logits = model.forward_head(features, pre_logits=True)
    assert features.dim() == 3 and features.shape[0] == 2
    assert features.shape[-1] == model.num_features
    assert pooled.shape == (2, model.num_features)
    torch.testing.assert_close(pre_logits, pooled)
    if isinstance(model, mm.TextEncoder):  # its call returns hidden states, as BertModel's
        torch.testing.assert_close(out, features)
    else:
        torch.testing.assert_close(out, head)
    assert torch.isfinite(head).all()

    folder = model.save_pretrained(tmp_path / "m")
    for loaded in (mm.from_pretrained(folder), type(model).from_pretrained(folder)):
        assert type(loaded) is type(model) and loaded.config == model.config
        with torch.no_grad():
            torch.testing.assert_close(loaded(*inputs), out)

    kind = type(model).__name__
    assert hasattr(model, "generate") == (kind in GENERATE)
    if kind in GENERATE:
        ids = GENERATE[kind](model, inputs)
        assert ids.dtype == torch.long and ids.shape[0] >= 1


def test_pool_follows_the_mask() -> None:
    """Decoders pool the last real token; masks are keywords of ``pool`` and
    ``forward_head``."""
    lm = _class_model("TextDecoder")
    (ids,) = lm.example_inputs(2)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        feats = lm.forward_features(ids, mask)
    pooled = lm.forward_head(feats, pre_logits=True, attention_mask=mask)
    assert torch.equal(pooled[0], feats[0, -1]) and torch.equal(pooled[1], feats[1, 4])


def test_text_encoder_head_is_the_classifier_or_the_mlm_head() -> None:
    cfg = mm.TextEncoderConfig(vocab_size=30, max_len=8, dim=16, depth=1, heads=2)
    mlm = mm.TextEncoder(cfg).eval()
    both = mm.TextEncoder(dataclasses.replace(cfg, num_classes=3, pooler=True)).eval()
    ids = torch.randint(0, 30, (2, 6))
    with torch.no_grad():
        assert torch.equal(mlm.forward_head(mlm(ids)), mlm.mlm_logits(mlm(ids)))
        hidden = both(ids)
        assert torch.equal(both.forward_head(hidden), both.classify(hidden))
        # pre-logits: [CLS] through BERT's pooler, tanh(W h + b)
        want = torch.tanh(hidden[:, 0] @ both.pooler[0].weight.T + both.pooler[0].bias)
        torch.testing.assert_close(both.pool(hidden), want)


def _switches(config: Any) -> tuple:
    """The config's non-numeric fields (norm, activation, pooling, flags...), recursively:
    two configs with the same switches differ only in sizes, so compile the same graph."""
    out = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.append((f.name, _switches(value)))
        elif isinstance(value, (str, bool)) or value is None:
            out.append((f.name, value))
    return tuple(out)


@pytest.mark.slow
@pytest.mark.parametrize(("build", "name"), CASES)
def test_compile_smoke(build: Any, name: str) -> None:
    """``torch.compile`` of every model class and of every preset with switches of its own
    (one layer deep) gives the eager outputs."""
    torch.manual_seed(0)
    model = build(name)
    kind = type(model).__name__
    if build is _preset_model and _switches(model.config) == _switches(
            MODEL_CLASSES[kind].config_class()):
        pytest.skip(f"{name} only resizes {kind}: the same graph as class-{kind}")
    inputs = model.example_inputs(2)
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model)(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
