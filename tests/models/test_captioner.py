"""Captioner: ViT encoder + cross-attending decoder, decoding, attention maps, task."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import multimodal as mm
from multimodal.models.api import AttentionMaps
from multimodal.models.captioner import Captioner, CaptionerConfig, caption, cut_at_eos
from multimodal.models.text import TextDecoderConfig
from multimodal.models.vit import ViTConfig
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID, WordTokenizer

VOCAB = 24


def tiny(dynamic_size: bool = True, class_token: bool = False) -> Captioner:
    enc = ViTConfig(image_size=16, patch_size=4, num_classes=0, dim=32, depth=2, heads=2,
                    mlp_dim=64, pool="cls" if class_token else "mean",
                    class_token=class_token, dynamic_size=dynamic_size)
    dec = TextDecoderConfig(vocab_size=VOCAB, max_len=12, dim=32, depth=2, heads=4, mlp_dim=64)
    return Captioner(CaptionerConfig(encoder=enc, decoder=dec)).eval()


@pytest.fixture
def model() -> Captioner:
    m = tiny()
    # larger weights than the init, so that greedy paths are not all the same token
    with torch.no_grad():
        for p in m.decoder.parameters():
            p.mul_(4.0)
    return m


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(3, 3, 16, 16)


def greedy_reference(model: Captioner, images: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding by definition: full teacher-forced forward pass, argmax, append."""
    ids = torch.full((images.shape[0], 1), BOS_ID)
    for _ in range(steps):
        nxt = model(images, ids)[:, -1].argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return ids


# --- config -----------------------------------------------------------------------------


def test_config_fills_cross_attention_and_memory_dim() -> None:
    cfg = CaptionerConfig(encoder=ViTConfig(image_size=16, patch_size=4, dim=48, heads=4),
                          decoder=TextDecoderConfig(vocab_size=30, dim=32, heads=4))
    assert cfg.decoder.cross_attention is True
    assert cfg.decoder.memory_dim == 48
    assert cfg.encoder.num_classes == 0
    with pytest.raises(ValueError, match="memory_dim"):
        CaptionerConfig(encoder=ViTConfig(dim=48, heads=4),
                        decoder=TextDecoderConfig(memory_dim=32))
    with pytest.raises(ValueError, match="outside the decoder vocabulary"):
        CaptionerConfig(decoder=TextDecoderConfig(vocab_size=5))


# --- forward ----------------------------------------------------------------------------


def test_forward_shapes_and_memory_is_patch_tokens(model: Captioner,
                                                   images: torch.Tensor) -> None:
    ids = torch.randint(0, VOCAB, (3, 7))
    assert model(images, ids).shape == (3, 7, VOCAB)
    assert model.encode(images).shape == (3, 16, 32)  # 4x4 patches
    with_cls = tiny(class_token=True)
    assert with_cls.encode(images).shape == (3, 16, 32)  # class token dropped


def test_forward_depends_on_image(model: Captioner, images: torch.Tensor) -> None:
    ids = torch.randint(0, VOCAB, (1, 5))
    a = model(images[:1], ids)
    b = model(images[1:2], ids)
    assert not torch.allclose(a, b)


# --- generation -------------------------------------------------------------------------


def test_greedy_matches_definition_and_cache(model: Captioner, images: torch.Tensor) -> None:
    ref = greedy_reference(model, images, 8)
    cached = model.generate(images, max_new_tokens=8, eos_token_id=-1)
    uncached = model.generate(images, max_new_tokens=8, eos_token_id=-1, use_cache=False)
    assert torch.equal(cached, ref)
    assert torch.equal(uncached, ref)
    assert len({tuple(r) for r in ref[:, 1:].tolist()}) > 1  # images lead to different words


def test_beam_search_cached_equals_uncached(model: Captioner, images: torch.Tensor) -> None:
    a = model.generate(images, max_new_tokens=6, num_beams=3, eos_token_id=EOS_ID)
    b = model.generate(images, max_new_tokens=6, num_beams=3, eos_token_id=EOS_ID,
                       use_cache=False)
    assert torch.equal(a, b)


def test_one_beam_is_greedy(model: Captioner, images: torch.Tensor) -> None:
    greedy = model.generate(images, max_new_tokens=8, eos_token_id=-1)
    beam1 = model.generate(images, max_new_tokens=8, num_beams=1, eos_token_id=-1)
    assert torch.equal(beam1, greedy)


def test_beam_search_scores_at_least_greedy(model: Captioner, images: torch.Tensor) -> None:
    """With no EOS and length_penalty 0, beam search maximises the summed log-probability
    of a fixed-length caption, so it can only beat greedy."""

    def logprob(ids: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(model(images, ids[:, :-1]), dim=-1)
        return logp.gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)

    greedy = model.generate(images, max_new_tokens=5, eos_token_id=-1)
    beam = model.generate(images, max_new_tokens=5, num_beams=4, eos_token_id=None,
                          length_penalty=0.0)
    assert torch.all(logprob(beam) >= logprob(greedy) - 1e-5)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_encoder_runs_once_per_generate(model: Captioner, images: torch.Tensor,
                                        num_beams: int) -> None:
    calls = []
    handle = model.encoder.transformer.register_forward_hook(lambda *a: calls.append(1))
    try:
        ids, maps = model.generate(images, max_new_tokens=6, num_beams=num_beams,
                                   eos_token_id=-1, return_attention=True)
    finally:
        handle.remove()
    assert len(calls) == 1
    # the maps of the steps that produced the generated tokens, over the 16 patches
    assert type(maps) is AttentionMaps and len(maps.cross_attn) == len(maps.self_attn) == 2
    assert maps.cross_attn[0].shape == (3, 4, ids.shape[1] - 1, 16)
    grid = model.cross_attention_maps(images, ids)
    torch.testing.assert_close(grid, maps.cross_attn[-1].mean(1).reshape(grid.shape))


def test_generate_stops_and_pads_after_eos(model: Captioner, images: torch.Tensor) -> None:
    out = model.generate(images, max_new_tokens=10)
    assert torch.all(out[:, 0] == BOS_ID)
    for row in out.tolist():
        if EOS_ID in row:
            assert all(t == PAD_ID for t in row[row.index(EOS_ID) + 1:])


def test_sampling_is_reproducible_with_a_generator(model: Captioner,
                                                   images: torch.Tensor) -> None:
    def draw() -> torch.Tensor:
        return model.generate(images, max_new_tokens=6, do_sample=True, top_k=5,
                              generator=torch.Generator().manual_seed(3))

    assert torch.equal(draw(), draw())


# --- cross-attention maps -----------------------------------------------------------------


def test_attention_maps_shape_and_normalised(model: Captioner, images: torch.Tensor) -> None:
    ids = model.generate(images, max_new_tokens=7, eos_token_id=-1)
    maps = model.cross_attention_maps(images, ids)
    assert maps.shape == (3, ids.shape[1] - 1, 4, 4)  # one row per generated token
    torch.testing.assert_close(maps.sum(dim=(-1, -2)), torch.ones(3, 7))
    assert torch.all(maps >= 0)
    mean_maps = model.cross_attention_maps(images, ids, layers="mean")
    torch.testing.assert_close(mean_maps.sum(dim=(-1, -2)), torch.ones(3, 7))


def test_attention_maps_match_definition(model: Captioner, images: torch.Tensor) -> None:
    """Last layer, head-averaged softmax(q k^T / sqrt(d)) recomputed from the weights."""
    ids = model.generate(images, max_new_tokens=5, eos_token_id=-1)
    block = model.decoder.transformer.blocks[-1]
    captured = {}
    handle = block.norm_cross.register_forward_hook(
        lambda mod, inp, out: captured.__setitem__("h", out))
    try:
        maps = model.cross_attention_maps(images, ids)
    finally:
        handle.remove()
    attn = block.cross_attn
    memory = model.encode(images)
    q = attn.q(captured["h"])
    k, _ = attn.kv(memory).chunk(2, dim=-1)
    b, n, m, h, d = q.shape[0], q.shape[1], k.shape[1], attn.heads, attn.head_dim
    q = q.view(b, n, h, d).transpose(1, 2)
    k = k.view(b, m, h, d).transpose(1, 2)
    want = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1).mean(1)
    torch.testing.assert_close(maps, want.view(b, n, 4, 4))


# --- bad input ----------------------------------------------------------------------------


def test_other_image_size_resamples_positions(model: Captioner) -> None:
    big = torch.randn(2, 3, 24, 24)
    ids = model.generate(big, max_new_tokens=3, eos_token_id=-1)
    maps = model.cross_attention_maps(big, ids)
    assert maps.shape == (2, 3, 6, 6)
    fixed = tiny(dynamic_size=False)
    with pytest.raises(ValueError, match="patch grid"):
        fixed.generate(big, max_new_tokens=3)
    with pytest.raises(ValueError, match="multiple of the patch size"):
        model.generate(torch.randn(1, 3, 18, 18), max_new_tokens=3)


def test_empty_batch_is_an_error(model: Captioner) -> None:
    empty = torch.randn(0, 3, 16, 16)
    with pytest.raises(ValueError, match="empty batch"):
        model.generate(empty, max_new_tokens=3)
    with pytest.raises(ValueError, match="empty batch"):
        model(empty, torch.zeros(0, 3, dtype=torch.long))


def test_too_long_captions_are_an_error(model: Captioner, images: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="longer than the decoder's context of 12"):
        model(images, torch.ones(3, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        model.generate(images, max_new_tokens=12)
    with pytest.raises(ValueError, match="3 images but 2 captions"):
        model(images, torch.ones(2, 4, dtype=torch.long))


def test_task_rejects_too_long_caption(model: Captioner) -> None:
    from multimodal.tasks.captioning import CaptioningTask

    task = CaptioningTask(model)
    task.tokenizer = WordTokenizer.train(["a b c d e f g h i j k l m n"])
    task.encode_captions(["a b c"])
    with pytest.raises(ValueError, match="longer than the decoder's context"):
        task.encode_captions(["a b c d e f g h i j k l m n"])


# --- save / load and strings ----------------------------------------------------------------


def test_save_load_round_trip(model: Captioner, images: torch.Tensor, tmp_path) -> None:
    model.save_pretrained(tmp_path / "cap")
    loaded = mm.from_pretrained(tmp_path / "cap")
    assert isinstance(loaded, Captioner)
    assert loaded.config == model.config
    ids = torch.randint(0, VOCAB, (3, 6))
    torch.testing.assert_close(loaded.eval()(images, ids), model(images, ids))
    assert torch.equal(loaded.generate(images, max_new_tokens=5),
                       model.generate(images, max_new_tokens=5))


def test_caption_strings_cut_at_eos(model: Captioner, images: torch.Tensor) -> None:
    tok = WordTokenizer.train([" ".join(f"w{i}" for i in range(VOCAB - 7))])
    assert tok.vocab_size == VOCAB
    ids = model.generate(images, max_new_tokens=6)
    texts = caption(model, images, tok, max_new_tokens=6)
    for text, row in zip(texts, cut_at_eos(ids), strict=True):
        # structural specials dropped; a generated [UNK] (id 1) stays visible
        assert text == " ".join(tok.vocab[i] for i in row if i >= 7 or i == tok.unk_token_id)
    assert cut_at_eos(torch.tensor([[5, 9, 6, 0], [5, 8, 8, 8]])) == [[5, 9], [5, 8, 8, 8]]


# --- task ---------------------------------------------------------------------------------


def test_task_loss_ignores_padding(model: Captioner, images: torch.Tensor) -> None:
    from multimodal.tasks.captioning import CaptioningTask

    task = CaptioningTask(model)
    task.tokenizer = WordTokenizer.train(["a red circle", "a big blue square above"])
    caps = ["a red circle", "a big blue square above", "circle"]
    ids = task.encode_captions(caps)
    loss = task.loss(images, ids)
    # per caption, unpadded: mean over all real target tokens of -log p
    total, count = 0.0, 0
    for i, c in enumerate(caps):
        seq = torch.tensor([task.tokenizer.encode(c, add_bos=True, add_eos=True)])
        logp = F.log_softmax(model(images[i : i + 1], seq[:, :-1]), dim=-1)
        total += -logp.gather(-1, seq[:, 1:, None]).sum().item()
        count += seq.shape[1] - 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)


def test_task_tokenizer_travels_in_checkpoint(model: Captioner) -> None:
    from multimodal.tasks.captioning import CaptioningTask

    task = CaptioningTask(model)
    task.tokenizer = WordTokenizer.train(["a red circle left of a blue square"])
    ckpt: dict = {}
    task.on_save_checkpoint(ckpt)
    other = CaptioningTask(tiny())
    other.on_load_checkpoint(ckpt)
    assert other.tokenizer is not None
    assert other.tokenizer.vocab == task.tokenizer.vocab


def test_task_scene_check_lines_up_with_test_split() -> None:
    from multimodal.data.captions import CaptionDataModule
    from multimodal.data.sources.scenes import caption_matches_scene
    from multimodal.tasks.captioning import CaptioningTask

    dm = CaptionDataModule("scenes", image_size=16, num_train=8, num_val=4, num_test=6,
                           batch_size=4)
    dm.setup()
    task = CaptioningTask(tiny())
    task._prepare_checks(dm)
    check = task._checks["test"]["scene_match"]
    scenes = dm.scenes("test")
    refs = dm.captions("test")
    assert all(check(r, i) for i, r in enumerate(refs))
    assert all(caption_matches_scene(r, s) for r, s in zip(refs, scenes, strict=True))
    assert not check(refs[1], 0) or refs[0] == refs[1]
    assert CaptionDataModule("emoji").caption_checks("test") == {}


# --- figures ------------------------------------------------------------------------------


def test_attention_figures(model: Captioner, images: torch.Tensor, tmp_path) -> None:
    from multimodal.plots.attention import plot_captions, plot_cross_attention

    ids = model.generate(images, max_new_tokens=4, eos_token_id=-1)
    maps = model.cross_attention_maps(images, ids)
    pics = images.sigmoid()
    path = plot_cross_attention(pics[0], ["w1", "w2", "w3", "w4"], maps[0], tmp_path / "a.png")
    assert path.stat().st_size > 1000
    path = plot_captions(pics, ["one", "two", "three"], tmp_path / "c.png",
                         references=["1", "2", "3"])
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="one row per word"):
        plot_cross_attention(pics[0], ["w1"], maps[0], tmp_path / "b.png")
    with pytest.raises(ValueError, match="as many captions as images"):
        plot_captions(pics, ["one"], tmp_path / "d.png")


def test_task_input_dropout_masks_inputs_only(model: Captioner) -> None:
    from multimodal.tasks.captioning import CaptioningTask
    from multimodal.tokenizers.text import MASK_ID

    task = CaptioningTask(model, input_dropout=1.0)
    task.tokenizer = WordTokenizer.train(["a red circle"])
    ids = task.encode_captions(["a red circle", "a circle"])
    dropped = task.drop_inputs(ids)
    special = ids < 7
    assert torch.equal(dropped[special], ids[special])  # BOS / EOS / PAD kept
    assert torch.all(dropped[~special] == MASK_ID)
    assert torch.equal(CaptioningTask(model).drop_inputs(ids), ids)  # off by default
    with pytest.raises(ValueError, match="input_dropout"):
        CaptioningTask(model, input_dropout=1.5)
