"""Number words, the encoder-decoder model and its task."""

from __future__ import annotations

import random
import time

import lightning as L
import pytest
import torch

from multimodal.data.numbers import (
    NumberWordsDataModule,
    number_to_words,
    source_tokenizer,
    target_tokenizer,
    words_to_number,
)
from multimodal.loading import from_pretrained
from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
from multimodal.tasks.seq2seq import Seq2SeqTask, exact_match
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID
from tests.random_weights import o1_weights

# --- number words --------------------------------------------------------------------

KNOWN = {
    0: "zero", 7: "seven", 13: "thirteen", 20: "twenty", 42: "forty-two", 99: "ninety-nine",
    100: "one hundred", 101: "one hundred and one", 110: "one hundred and ten",
    312: "three hundred and twelve", 1000: "one thousand", 1005: "one thousand and five",
    1010: "one thousand and ten", 1100: "one thousand one hundred",
    2019: "two thousand and nineteen", 12345: "twelve thousand three hundred and forty-five",
    100000: "one hundred thousand", 100001: "one hundred thousand and one",
    700050: "seven hundred thousand and fifty",
    999999: "nine hundred and ninety-nine thousand nine hundred and ninety-nine",
}


@pytest.mark.parametrize(("n", "words"), KNOWN.items())
def test_number_to_words_known_values(n: int, words: str) -> None:
    assert number_to_words(n) == words
    assert words_to_number(words) == n


def test_number_words_are_unique_and_invert_on_a_sample() -> None:
    rng = random.Random(0)
    sample = list(range(2000)) + rng.sample(range(1_000_000), 20_000)
    words = [number_to_words(n) for n in sample]
    assert len(set(words)) == len(set(sample))
    assert all(words_to_number(w) == n for n, w in zip(sample, words, strict=True))


@pytest.mark.slow
def test_number_words_whole_range_is_a_bijection() -> None:
    words = [number_to_words(n) for n in range(1_000_000)]
    assert len(set(words)) == 1_000_000
    assert all(words_to_number(w) == n for n, w in enumerate(words))


@pytest.mark.parametrize("bad", [-1, 1_000_000, 2.5, True, "12"])
def test_number_to_words_rejects_bad_input(bad: object) -> None:
    with pytest.raises(ValueError, match="integer"):
        number_to_words(bad)  # type: ignore[arg-type]


def test_tokenizers_cover_every_word_and_digit() -> None:
    src, tgt = source_tokenizer(), target_tokenizer()
    for n in (0, 17, 999999, 123456, 40012):
        ids = src.encode(number_to_words(n))
        assert src.unk_token_id not in ids
        assert words_to_number(src.decode(ids).replace(" - ", "-")) == n
        digits = tgt.encode(str(n), add_bos=True, add_eos=True)
        assert digits[0] == BOS_ID and digits[-1] == EOS_ID
        assert tgt.decode(digits) == str(n)


def test_held_out_numbers_never_appear_in_training() -> None:
    dm = NumberWordsDataModule(train_size=5000, held_out=1000, val_size=200, test_size=300)
    dm.setup()
    train, val, test = (set(dm.numbers[k]) for k in ("train", "val", "test"))
    assert len(train) == 5000 and len(val) == 200 and len(test) == 300
    assert not train & (val | test) and not val & test
    assert min(test) < 10_000 < max(test)  # short and long numbers are both tested
    batch = next(iter(dm.test_dataloader()))
    tgt, src = target_tokenizer(), source_tokenizer()
    for i in range(3):
        n = int(tgt.decode(batch["target_ids"][i]))
        assert n == dm.numbers["test"][i]
        ids = batch["source_ids"][i][batch["source_mask"][i].bool()]
        assert src.decode(ids).replace(" - ", "-") == number_to_words(n)


# --- the model -----------------------------------------------------------------------


def tiny_seq2seq(**kw) -> Seq2Seq:
    torch.manual_seed(0)
    cfg = {"source_vocab_size": 20, "target_vocab_size": 12, "max_source_len": 16,
           "max_target_len": 10, "dim": 32, "encoder_depth": 1, "decoder_depth": 2,
           "heads": 2, **kw}
    # O(1) weights so that outputs depend visibly on every input
    return o1_weights(Seq2Seq(Seq2SeqConfig(**cfg)).eval())


def test_decoder_is_causal_and_reads_the_source() -> None:
    model = tiny_seq2seq()
    src = torch.randint(7, 20, (2, 6))
    tgt = torch.randint(7, 12, (2, 5))
    logits = model(src, tgt)
    assert logits.shape == (2, 5, 12)
    changed = tgt.clone()
    changed[:, 3] = (changed[:, 3] - 7 + 1) % 5 + 7
    other = model(src, changed)
    torch.testing.assert_close(other[:, :3], logits[:, :3])  # earlier steps unaffected
    assert not torch.allclose(other[:, 3:], logits[:, 3:])
    src2 = src.clone()
    src2[:, -1] = (src2[:, -1] - 7 + 1) % 13 + 7
    assert not torch.allclose(model(src2, tgt), logits)  # every step sees the whole source


def test_source_padding_does_not_change_the_output() -> None:
    model = tiny_seq2seq()
    src = torch.randint(7, 20, (1, 5))
    tgt = torch.randint(7, 12, (1, 4))
    alone = model(src, tgt)
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 5), torch.zeros(1, 3)], 1).long()
    torch.testing.assert_close(model(padded, tgt, mask), alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def _reference_greedy(model: Seq2Seq, src: torch.Tensor, steps: int) -> list[int]:
    ids = [BOS_ID]
    for _ in range(steps):
        ids.append(int(model(src, torch.tensor([ids]))[0, -1].argmax()))
    return ids


def test_generate_matches_step_by_step_argmax_cached_or_not() -> None:
    model = tiny_seq2seq()
    src = torch.randint(7, 20, (1, 7))
    ref = _reference_greedy(model, src, 6)
    for use_cache in (True, False):
        out = model.generate(src, max_new_tokens=6, eos_token_id=None, use_cache=use_cache)
        assert out[0].tolist() == ref
    beam = [model.generate(src, max_new_tokens=6, num_beams=3, use_cache=c)[0].tolist()
            for c in (True, False)]
    assert beam[0] == beam[1]


def test_batched_padded_sources_generate_like_single_ones() -> None:
    model = tiny_seq2seq()
    srcs = [torch.randint(7, 20, (n,)) for n in (3, 7, 5)]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for i, s in enumerate(srcs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    for kw in ({}, {"num_beams": 2}):
        batch = model.generate(ids, mask, max_new_tokens=5, eos_token_id=None, **kw)
        for i, s in enumerate(srcs):
            alone = model.generate(s[None], max_new_tokens=5, eos_token_id=None, **kw)
            assert batch[i].tolist() == alone[0].tolist(), (kw, i)


def test_save_and_load_pretrained(tmp_path) -> None:
    model = tiny_seq2seq()
    model.save_pretrained(tmp_path / "s2s")
    again = from_pretrained(tmp_path / "s2s")
    assert isinstance(again, Seq2Seq)
    src, tgt = torch.randint(7, 20, (2, 4)), torch.randint(7, 12, (2, 3))
    torch.testing.assert_close(again(src, tgt), model(src, tgt))


def test_shared_embeddings_need_one_vocabulary() -> None:
    with pytest.raises(ValueError, match="share_embeddings"):
        Seq2Seq(Seq2SeqConfig(source_vocab_size=20, target_vocab_size=12,
                              share_embeddings=True))
    model = Seq2Seq(Seq2SeqConfig(source_vocab_size=20, target_vocab_size=20, dim=16,
                                  heads=2, share_embeddings=True))
    assert model.decoder.lm_head.weight is model.encoder.tok_embed.weight


# --- task ----------------------------------------------------------------------------


def test_exact_match_compares_up_to_eos() -> None:
    ref = torch.tensor([[5, 8, 9, 6, 0], [5, 8, 6, 0, 0], [5, 8, 9, 6, 0]])
    gen = torch.tensor([[5, 8, 9, 6, 6, 6], [5, 8, 9, 6, 6, 6], [5, 8, 9, 9, 6, 6]])
    assert exact_match(gen, ref).tolist() == [1.0, 0.0, 0.0]


def test_task_loss_ignores_padding_targets() -> None:
    model = tiny_seq2seq()
    task = Seq2SeqTask(model)
    batch = {"source_ids": torch.randint(7, 20, (2, 5)),
             "source_mask": torch.ones(2, 5, dtype=torch.long),
             "target_ids": torch.tensor([[BOS_ID, 8, 9, EOS_ID, PAD_ID],
                                         [BOS_ID, 8, EOS_ID, PAD_ID, PAD_ID]])}
    logp = model(batch["source_ids"], batch["target_ids"][:, :-1]).log_softmax(-1)
    expected = -(logp[0, 0, 8] + logp[0, 1, 9] + logp[0, 2, EOS_ID]
                 + logp[1, 0, 8] + logp[1, 1, EOS_ID]) / 5
    torch.testing.assert_close(task.loss(batch), expected)


@pytest.mark.slow
def test_numbers_reach_high_exact_match_on_held_out() -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    dm = NumberWordsDataModule(train_size=30_000, held_out=2000, val_size=200,
                               test_size=1000, batch_size=128)
    model = Seq2Seq(Seq2SeqConfig(source_vocab_size=dm.source_vocab_size,
                                  target_vocab_size=dm.target_vocab_size, max_source_len=24,
                                  max_target_len=12, dim=64, encoder_depth=2,
                                  decoder_depth=2, heads=4, mlp_dim=256))
    task = Seq2SeqTask(model, optimizer={"lr": 2e-3})
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    start = time.perf_counter()
    trainer.fit(task, datamodule=dm)
    (result,) = trainer.test(task, datamodule=dm, verbose=False)
    print(f"held-out exact match {result['test/exact_match']:.4f} "
          f"in {time.perf_counter() - start:.0f} s")
    assert result["test/exact_match"] >= 0.97
