"""Weights in and out: safetensors round trips, refusal of pickles, Lightning checkpoints,
encoders as feature extractors."""

import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import multimodal as mm
from multimodal.encoder import Encoder, load_encoder


def tiny_vit(**kw) -> mm.ViT:
    args = dict(image_size=16, patch_size=4, in_channels=1, num_classes=3, dim=32, depth=2,
                heads=2, mlp_dim=64)
    return mm.ViT(mm.ViTConfig(**{**args, **kw}))


def tiny_decoder() -> mm.TextDecoder:
    return mm.TextDecoder(mm.TextDecoderConfig(vocab_size=60, max_len=24, dim=32, depth=2,
                                               heads=2))


def tiny_encoder() -> mm.TextEncoder:
    return mm.TextEncoder(mm.TextEncoderConfig(vocab_size=60, max_len=24, dim=32, depth=2,
                                               heads=2, type_vocab_size=2, embed_norm=True,
                                               norm="post", pooler=True, num_classes=4))


class _Marker:
    """Unpickling this creates the file ``path`` (a stand-in for arbitrary code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


# -- save_pretrained / from_pretrained ----------------------------------------------------


def test_vit_round_trip_is_exact(tmp_path):
    model = tiny_vit(pool="mean").eval()
    model.save_pretrained(tmp_path / "vit")
    loaded = mm.from_pretrained(tmp_path / "vit")
    assert isinstance(loaded, mm.ViT) and loaded.config == model.config
    x = torch.randn(2, 1, 16, 16)
    assert torch.equal(loaded(x), model(x))


def test_text_decoder_round_trip_keeps_tied_weights(tmp_path):
    model = tiny_decoder().eval()
    model.save_pretrained(tmp_path / "lm")
    stored = load_file(str(tmp_path / "lm" / "model.safetensors"))
    assert ("lm_head.weight" in stored) != ("tok_embed.weight" in stored)  # stored once
    loaded = mm.TextDecoder.from_pretrained(tmp_path / "lm")
    assert loaded.lm_head.weight is loaded.tok_embed.weight
    ids = torch.randint(0, 60, (2, 7))
    assert torch.equal(loaded(ids), model(ids))
    assert torch.equal(loaded.generate(ids, max_new_tokens=5), model.generate(ids,
                                                                             max_new_tokens=5))


def test_text_encoder_round_trip_is_exact(tmp_path):
    model = tiny_encoder().eval()
    model.save_pretrained(tmp_path / "enc")
    loaded = mm.from_pretrained(tmp_path / "enc")
    ids = torch.randint(0, 60, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    h, h2 = model(ids, mask), loaded(ids, mask)
    assert torch.equal(h2, h)
    assert torch.equal(loaded.classify(h2), model.classify(h))
    assert torch.equal(loaded.mlm_logits(h2), model.mlm_logits(h))


def test_wrong_class_is_refused(tmp_path):
    tiny_vit().save_pretrained(tmp_path / "vit")
    with pytest.raises(ValueError, match="holds a ViT, not a TextDecoder"):
        mm.TextDecoder.from_pretrained(tmp_path / "vit")


# -- refusing what is not safetensors ----------------------------------------------------


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    folder = tiny_vit().save_pretrained(tmp_path / "vit")
    (folder / "model.safetensors").write_bytes(b"definitely not a weights file" * 10)
    with pytest.raises(ValueError, match="not a safetensors file"):
        mm.from_pretrained(folder)


def test_a_pickle_is_refused_and_never_executed(tmp_path):
    payload = pickle.dumps({"weights": _Marker(tmp_path / "probe")})
    pickle.loads(payload)  # the payload is live: plain unpickling runs it
    assert (tmp_path / "probe").exists()

    marker = tmp_path / "pwned"
    folder = tiny_vit().save_pretrained(tmp_path / "vit")
    (folder / "model.safetensors").write_bytes(pickle.dumps({"w": _Marker(marker)}))
    with pytest.raises(ValueError, match="pickled checkpoints are refused"):
        mm.from_pretrained(folder)
    ckpt = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": _Marker(marker)}}, ckpt)
    with pytest.raises(ValueError, match="could execute code"):
        mm.from_pretrained(ckpt)
    assert not marker.exists()


def test_missing_and_mis_shaped_keys_are_listed(tmp_path):
    folder = tiny_vit().save_pretrained(tmp_path / "vit")
    state = load_file(str(folder / "model.safetensors"))
    del state["transformer.blocks.1.mlp.fc2.bias"]
    state["head.weight"] = torch.zeros(5, 32)
    state["extra.weight"] = torch.zeros(1)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        mm.from_pretrained(folder)
    message = str(err.value)
    assert "mis-shaped: head.weight: expected (3, 32), got (5, 32)" in message
    assert "missing: transformer.blocks.1.mlp.fc2.bias" in message
    assert "unexpected: extra.weight" in message


def test_missing_folder_and_bad_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        mm.from_pretrained(tmp_path / "nothing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "Toaster", "config": {}}')
    with pytest.raises(ValueError, match="unknown model_type 'Toaster'"):
        mm.from_pretrained(tmp_path / "bad")


# -- Lightning checkpoints ---------------------------------------------------------------


def test_checkpoint_written_by_hand_with_task_prefix(tmp_path):
    import dataclasses

    model = tiny_vit().eval()
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["val_metrics.acc.tp"] = torch.zeros(3)  # other task state is ignored
    torch.save({"state_dict": state, "hyper_parameters": {
        "model_type": "ViT", "model_config": dataclasses.asdict(model.config), "lr": 1e-3}},
        tmp_path / "task.ckpt")
    loaded = mm.from_pretrained(tmp_path / "task.ckpt")
    x = torch.randn(2, 1, 16, 16)
    assert torch.equal(loaded(x), model(x))

    torch.save({"state_dict": state, "hyper_parameters": {"lr": 1e-3}}, tmp_path / "old.ckpt")
    with pytest.raises(ValueError, match="model_type"):
        mm.from_pretrained(tmp_path / "old.ckpt")
    with pytest.raises(FileNotFoundError):
        mm.from_pretrained(tmp_path / "absent.ckpt")


@pytest.mark.slow
def test_checkpoint_of_the_classification_task_loads(tmp_path):
    lightning = pytest.importorskip("lightning")
    from multimodal.tasks.classification import ClassificationTask

    task = ClassificationTask(tiny_vit(), optimizer={"lr": 1e-3})
    data = torch.utils.data.TensorDataset(torch.randn(8, 1, 16, 16), torch.randint(0, 3, (8,)))
    trainer = lightning.Trainer(max_steps=2, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                accelerator="cpu", default_root_dir=tmp_path)
    trainer.fit(task, torch.utils.data.DataLoader(data, batch_size=4))
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    loaded = mm.from_pretrained(tmp_path / "run.ckpt")
    x = torch.randn(2, 1, 16, 16)
    assert isinstance(loaded, mm.ViT)
    assert torch.equal(loaded(x), task.model.eval()(x))


# -- encoders ------------------------------------------------------------------------------


def test_load_encoder_from_a_folder_with_its_tokenizer(tmp_path):
    tokenizer = mm.WordPieceTokenizer.train(
        ["the cat sat on the mat", "a dog ran in the park", "cats and dogs"] * 5,
        vocab_size=60)
    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=tokenizer.vocab_size, max_len=24,
                                                dim=32, depth=2, heads=2))
    Encoder(model, tokenizer).save_pretrained(tmp_path / "enc")
    encoder = load_encoder(tmp_path / "enc")
    assert encoder.tokenizer is not None and encoder.modality == "text"
    assert not any(p.requires_grad for p in encoder.parameters())
    assert not encoder.train().backbone.training  # frozen: stays in eval mode
    features, mask = encoder.encode(["the cat sat", "a dog ran in the park"], output="tokens")
    ids = tokenizer.encode_batch(["the cat sat", "a dog ran in the park"], add_cls=True,
                                 add_sep=True)
    torch.testing.assert_close(features, model.eval()(ids["input_ids"], ids["attention_mask"]))
    assert torch.equal(mask, ids["attention_mask"])
    assert torch.equal(encoder.pool(features, mask), features[:, 0])
    torch.testing.assert_close(encoder.encode(["the cat sat", "a dog ran in the park"]),
                               features[:, 0])  # one embedding per text: the model's [CLS]


def test_load_encoder_from_models():
    vit = tiny_vit()
    encoder = load_encoder(vit)
    x = torch.randn(2, 1, 16, 16)
    features = encoder(x)
    assert features.shape == (2, 17, 32) and encoder.dim == 32
    assert torch.equal(features, vit.forward_features(x))
    assert torch.equal(encoder.pool(features), features[:, 0])

    lm = tiny_decoder()
    ids = torch.randint(0, 60, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    enc = load_encoder(lm)
    hidden = enc(ids, mask)
    pooled = enc.pool(hidden, mask)
    assert torch.equal(pooled[0], hidden[0, 5]) and torch.equal(pooled[1], hidden[1, 3])

    with pytest.raises(ValueError, match=r"cannot convert a .*Linear; supported: torchvision"):
        load_encoder(torch.nn.Linear(2, 2))  # neither ours nor a supported foreign model
    with pytest.raises(ValueError, match=r"folder, a \.ckpt file or a model"):
        load_encoder(42)


def test_load_encoder_converts_a_foreign_model():
    tv = pytest.importorskip("torchvision.models.vision_transformer")
    source = tv.VisionTransformer(image_size=16, patch_size=4, num_layers=1, num_heads=2,
                                  hidden_dim=16, mlp_dim=32).eval()
    encoder = load_encoder(source)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = source.encoder(torch.cat([source.class_token.expand(2, -1, -1),
                                         source._process_input(x)], dim=1))
    torch.testing.assert_close(encoder(x), want)


def test_datamodule_arguments_drop_cli_private_keys() -> None:
    from multimodal.checkpoints import datamodule_arguments

    ckpt = {"datamodule_hyper_parameters": {"_class_path": "x.Y", "_instantiator": "z",
                                            "dataset": "scenes", "image_size": 32}}
    assert datamodule_arguments(ckpt) == {"dataset": "scenes", "image_size": 32}
    assert datamodule_arguments({}) == {}


def test_moved_names_still_import_from_hub() -> None:
    """For one release ``from multimodal.hub import X`` keeps working for the names that
    moved to checkpoints / loading / encoder: the same objects as in their new homes."""
    import importlib
    import sys

    sys.modules.pop("multimodal.hub", None)  # imported afresh: the warning is raised on import
    with pytest.warns(DeprecationWarning, match="multimodal.hub is deprecated"):
        import multimodal.hub as hub

    old: dict[str, object] = {}  # the old spelling, as users wrote it (a string: the
    # one-import-path test holds the package's own code to the new homes)
    exec("from multimodal.hub import Encoder, read_checkpoint", old)
    assert old["Encoder"] is Encoder and old["read_checkpoint"] is importlib.import_module(
        "multimodal.checkpoints").read_checkpoint
    for name, module in hub.MOVED.items():
        assert getattr(hub, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        hub.nothing
