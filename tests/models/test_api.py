"""The one model API (docs/models.md, multimodal/models/api.py), run over every registered
model class and every preset: a new model or preset is checked here without a new test."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal.generation import generate as generation_loop
from multimodal.models import create_model, list_presets
from multimodal.models.api import GENERATE_DEFAULTS, MODALITIES, AttentionMaps, Model
from multimodal.models.codec_lm import CodecAR
from multimodal.registry import MODEL_CLASSES


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
    "ImageGPT": lambda m, x: m.generate(num_images=1, max_new_tokens=2,  # class 0 if conditional
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

    _check_head_signatures(model)
    _check_attention_maps(model, inputs, features)

    kind = type(model).__name__
    assert hasattr(model, "generate") == (kind in GENERATE)
    if kind in GENERATE:
        ids = GENERATE[kind](model, inputs)
        assert ids.dtype == torch.long and ids.shape[0] >= 1


def _check_head_signatures(model: nn.Module) -> None:
    """``pool(features, *, attention_mask=None)`` and ``forward_head(features,
    pre_logits=False, *, attention_mask=None)``: the same parameters, kinds and defaults
    for every model."""
    kw_only, positional = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    pool = list(inspect.signature(model.pool).parameters.values())
    head = list(inspect.signature(model.forward_head).parameters.values())
    assert [(p.name, p.kind, p.default) for p in pool] == [
        ("features", positional, inspect.Parameter.empty), ("attention_mask", kw_only, None)]
    assert [(p.name, p.kind, p.default) for p in head] == [
        ("features", positional, inspect.Parameter.empty), ("pre_logits", positional, False),
        ("attention_mask", kw_only, None)]


def _check_attention_maps(model: nn.Module, inputs: tuple, features: torch.Tensor) -> None:
    """Where a model returns attention (``return_attention=True`` of ``forward_features``
    and of ``forward``), it is ``(output, AttentionMaps)``: lists of per-layer
    (B, heads, queries, keys) probability maps, one query row per feature row."""
    calls = [("forward_features", model.forward_features, features)]
    if "return_attention" in inspect.signature(model.forward).parameters:
        with torch.no_grad():
            calls.append(("forward", model, model(*inputs)))
    for name, fn, plain in calls:
        if name == "forward_features" and \
                "return_attention" not in inspect.signature(fn).parameters:
            continue
        with torch.no_grad():
            out, maps = fn(*inputs, return_attention=True)
        torch.testing.assert_close(out, plain)
        assert type(maps) is AttentionMaps, f"{name}: {type(maps).__name__}"
        assert isinstance(maps.self_attn, list) and isinstance(maps.cross_attn, list)
        # only the RNN baseline without attention (attention="none") has no map
        assert maps.self_attn or maps.cross_attn or model.config.attention == "none"
        for m in maps.self_attn + maps.cross_attn:
            assert m.dim() == 4 and m.shape[0] == inputs[0].shape[0]
            assert m.shape[2] == features.shape[1]
            torch.testing.assert_close(m.sum(-1), torch.ones_like(m.sum(-1)))
        for m in maps.self_attn:
            assert m.shape[-1] == m.shape[-2]
        # a sequence of the self-attention layers (ViT's and the audio encoder's list before)
        assert len(maps) == len(maps.self_attn) and list(maps) == maps.self_attn
        if maps.self_attn:
            assert maps[0] is maps.self_attn[0] and maps[-1] is maps.self_attn[-1]


def _padded_and_alone(model: nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The second example input padded at its end (junk in the padding, ``attention_mask``
    0 there) -> its pooled features, and the same input without the padding alone ->
    its pooled features; and how many positions were padding."""
    inputs = model.example_inputs(2)
    if name == "AudioClassifier":
        (features,) = inputs
        frames = features.shape[1]
        keep = frames // 2
        feats, mask = model.forward_features(features, torch.tensor([frames, keep]),
                                             return_attention_mask=True)
        alone = model.forward_features(features[1:2, :keep])
        return (model.pool(feats, attention_mask=mask)[1], model.pool(alone)[0],
                int((~mask[1]).sum()))
    *sources, ids = inputs
    keep = max(ids.shape[1] - 2, 1)
    padded = ids.clone()
    padded[1, keep:] = ids[0, keep:]  # junk: other valid tokens
    mask = torch.ones_like(ids)
    mask[1, keep:] = 0
    takes_mask = "attention_mask" in inspect.signature(model.forward_features).parameters
    extra = (mask,) if takes_mask else ()
    feats = model.forward_features(*sources, padded, *extra)
    alone = model.forward_features(*(x[1:2] for x in sources), ids[1:2, :keep])
    return model.pool(feats, attention_mask=mask)[1], model.pool(alone)[0], ids.shape[1] - keep


# models whose inputs never pad (images; CLIP's features are one row per tower)
UNPADDED = {"ViT", "CLIP", "ImageGPT"}


@pytest.mark.parametrize("name", sorted(MODEL_CLASSES))
def test_padding_changes_nothing_for_real_tokens(name: str) -> None:
    """Pooling a padded input under its ``attention_mask`` (1 = real token) gives what the
    unpadded input gives alone; models whose inputs never pad pool the same under an
    all-ones mask as without one."""
    torch.manual_seed(0)
    model = _class_model(name)
    if name == "AudioClassifier":  # the mean over real tokens (the class token never pads)
        model = type(model)(dataclasses.replace(model.config, pool="mean")).eval()
    with torch.no_grad():
        if name in UNPADDED:
            features = model.forward_features(*model.example_inputs(2))
            ones = torch.ones(features.shape[:2], dtype=torch.long)
            assert torch.equal(model.pool(features, attention_mask=ones), model.pool(features))
            assert torch.equal(model.forward_head(features, attention_mask=ones),
                               model.forward_head(features))
            return
        padded, alone, pads = _padded_and_alone(model, name)
    assert pads > 0
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-4)


def test_vit_mean_pool_averages_the_real_patches_only() -> None:
    """``mean`` pooling under a mask: ``sum_n m_n x_n / sum_n m_n`` over the patch tokens."""
    vit = mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, dim=8, depth=1, heads=2,
                              pool="mean")).eval()
    features = torch.randn(2, vit.num_prefix_tokens + 4, 8)
    mask = torch.ones(2, features.shape[1], dtype=torch.long)
    mask[1, -2:] = 0
    pooled = vit.pool(features, attention_mask=mask)
    p = vit.num_prefix_tokens
    torch.testing.assert_close(pooled[0], features[0, p:].mean(0))
    torch.testing.assert_close(pooled[1], features[1, p:-2].mean(0))


def test_every_generate_takes_the_same_decoding_arguments() -> None:
    """Every model's ``generate`` names the shared decoding arguments with the shared
    defaults (greedy unless do_sample=True), keyword-only, and they are the decoding loop's
    own defaults; ``max_new_tokens`` defaults to the room left (TextDecoder: 20)."""
    loop = inspect.signature(generation_loop).parameters
    for key, value in GENERATE_DEFAULTS.items():
        assert loop[key].default == value, key
    decoders = [c for c in MODEL_CLASSES.values() if hasattr(c, "generate")] + [CodecAR]
    assert {c.__name__ for c in decoders} >= {"TextDecoder", "ImageGPT", "Captioner",
                                              "Seq2Seq", "RNNSeq2Seq", "Whisper", "CodecAR"}
    for cls in decoders:
        params = inspect.signature(cls.generate).parameters
        for key, value in GENERATE_DEFAULTS.items():
            assert key in params, f"{cls.__name__}.generate lacks {key}"
            if cls is mm.ImageGPT and key == "do_sample":
                value = True  # the one documented exception: an image generator samples
            assert params[key].default == value, (cls.__name__, key, params[key].default)
            assert params[key].kind is inspect.Parameter.KEYWORD_ONLY, (cls.__name__, key)
        assert "max_new_tokens" in params, cls.__name__
        want = 20 if cls is mm.TextDecoder else None  # the room left; open-ended text: 20
        assert params["max_new_tokens"].default == want, cls.__name__


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
