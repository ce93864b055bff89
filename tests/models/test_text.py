"""Text training pieces against their definitions: next-token NLL / perplexity, BERT
masking proportions, the masked-LM loss, [CLS] classification, embedding queries and the
bigram baselines of the language-model benchmark."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from multimodal.embeddings import analogy, nearest_neighbours
from multimodal.models.text import TextDecoder, TextDecoderConfig, TextEncoder, TextEncoderConfig
from multimodal.tasks.classification import ClassificationTask
from multimodal.tasks.language_model import LanguageModelTask, TokenNLL, next_token_nll
from multimodal.tasks.masked_lm import (
    MaskedLMTask,
    load_encoder_weights,
    mask_tokens,
    mlm_loss,
)
from multimodal.tokenizers.text import MASK_ID, SPECIAL_TOKENS, WordTokenizer

ROOT = Path(__file__).resolve().parents[2]


# --- next-token NLL and perplexity -------------------------------------------------------


def test_next_token_nll_is_summed_negative_log_softmax() -> None:
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 3.0]]])
    targets = torch.tensor([[0, -100]])
    total, count = next_token_nll(logits, targets)
    expected = -(2.0 - math.log(math.exp(2) + 2))
    assert count == 1
    assert float(total) == pytest.approx(expected, rel=1e-6)


def test_perplexity_is_exp_of_mean_over_all_tokens() -> None:
    acc = TokenNLL()
    acc.update(torch.tensor(3.0), torch.tensor(1))  # batch 1: one token, NLL 3
    acc.update(torch.tensor(3.0), torch.tensor(3))  # batch 2: three tokens, NLL 1 each
    assert acc.perplexity == pytest.approx(math.exp(6.0 / 4))  # not the mean of batch ppls


def test_uniform_model_has_perplexity_equal_to_vocab_size() -> None:
    vocab = 37
    model = TextDecoder(TextDecoderConfig(vocab_size=vocab, max_len=16, dim=16, depth=1,
                                          heads=2))
    with torch.no_grad():
        model.tok_embed.weight.zero_()  # tied head -> all logits 0 -> p = 1/V
    task = LanguageModelTask(model)
    ids = torch.randint(0, vocab, (4, 9))
    loader = [{"input_ids": ids[:, :-1], "targets": ids[:, 1:]}]
    assert task.evaluate(loader).perplexity == pytest.approx(vocab, rel=1e-5)


def test_language_model_task_rejects_other_models() -> None:
    with pytest.raises(ValueError, match="TextDecoder"):
        LanguageModelTask(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def _cyclic_blocks(vocab: int, n: int, length: int) -> list[dict[str, torch.Tensor]]:
    """Blocks of the sequence 7, 8, ..., vocab-1, 7, 8, ... at random phases."""
    period = torch.arange(7, vocab)
    out = []
    for i in range(n):
        seq = period.roll(-i % len(period)).repeat(length // len(period) + 2)[: length + 1]
        out.append({"input_ids": seq[:-1], "targets": seq[1:]})
    return out


def test_language_model_task_fit_lowers_perplexity() -> None:
    vocab = 15
    data = _cyclic_blocks(vocab, 16, 12)
    model = TextDecoder(TextDecoderConfig(vocab_size=vocab, max_len=12, dim=32, depth=1,
                                          heads=2))
    task = LanguageModelTask(model, optimizer={"lr": 3e-3, "warmup_fraction": 0.0})
    loader = DataLoader(data, batch_size=8)
    before = task.evaluate(loader).perplexity
    trainer = L.Trainer(max_steps=40, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(task, loader, loader)
    after = task.evaluate(loader).perplexity
    assert after < 0.5 * before
    assert "val/ppl" in trainer.callback_metrics
    val = trainer.callback_metrics
    assert float(val["val/ppl"]) == pytest.approx(math.exp(float(val["val/loss"])), rel=1e-4)


# --- BERT masking --------------------------------------------------------------------


def test_mask_tokens_proportions() -> None:
    vocab, n_special = 1000, len(SPECIAL_TOKENS)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(n_special, vocab, (200, 500), generator=gen)
    ids[:, 0] = 2  # [CLS]
    ids[:, 250] = 3  # [SEP]
    mask = torch.ones_like(ids)
    mask[:, 450:] = 0  # padding
    ids[:, 450:] = 0
    masked, labels = mask_tokens(ids, vocab, attention_mask=mask, generator=gen)
    chosen = labels != -100
    maskable = (ids >= n_special) & mask.bool()
    # labels: the original token where chosen, -100 elsewhere; specials / pads never chosen
    assert torch.equal(labels[chosen], ids[chosen])
    assert not (chosen & ~maskable).any()
    assert torch.equal(masked[~chosen], ids[~chosen])
    n = int(maskable.sum())
    c = int(chosen.sum())
    # binomial(n, 0.15): allow 4 standard deviations
    assert abs(c / n - 0.15) < 4 * math.sqrt(0.15 * 0.85 / n)
    to_mask = chosen & (masked == MASK_ID)
    kept = chosen & (masked == ids)
    random = chosen & (masked != ids) & (masked != MASK_ID)
    p_same = 1 / (vocab - n_special)  # a random replacement may draw the same token
    for got, p in ((to_mask, 0.8), (kept, 0.1 + 0.1 * p_same), (random, 0.1 * (1 - p_same))):
        share = int(got.sum()) / c
        assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / c), (share, p)
    assert (masked[random] >= n_special).all()  # random tokens are never special


def test_mask_tokens_bad_arguments() -> None:
    ids = torch.randint(7, 20, (2, 5))
    with pytest.raises(ValueError):
        mask_tokens(ids, 20, mask_prob=1.5)
    with pytest.raises(ValueError):
        mask_tokens(ids, 20, replace_probs=(0.9, 0.2))
    with pytest.raises(ValueError):
        mask_tokens(ids, 5)


def test_mlm_loss_only_counts_chosen_positions() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    labels = torch.full((2, 6), -100)
    labels[0, 1], labels[1, 4] = 3, 7
    loss = mlm_loss(logits, labels)
    logp = logits.log_softmax(-1)
    expected = -(logp[0, 1, 3] + logp[1, 4, 7]) / 2
    torch.testing.assert_close(loss, expected)
    other = logits.clone()
    other[labels == -100] = torch.randn(10, 11) * 10  # change only unchosen positions
    torch.testing.assert_close(mlm_loss(other, labels), loss)


def tiny_encoder(**kw) -> TextEncoder:
    cfg = {"vocab_size": 30, "max_len": 16, "dim": 16, "depth": 1, "heads": 2, **kw}
    return TextEncoder(TextEncoderConfig(**cfg))


def test_masked_lm_task_step_and_export_to_classifier(tmp_path: Path) -> None:
    enc = tiny_encoder()
    task = MaskedLMTask(enc, save_dir=str(tmp_path / "enc"))
    batch = {"input_ids": torch.randint(7, 30, (4, 10)),
             "attention_mask": torch.ones(4, 10, dtype=torch.long)}
    loss, logits, _labels = task.step(batch, torch.Generator().manual_seed(0))
    assert logits.shape == (4, 10, 30) and torch.isfinite(loss)
    enc.save_pretrained(tmp_path / "enc")
    clf = tiny_encoder(num_classes=3, mlm_head=False)
    not_loaded = load_encoder_weights(clf, tmp_path / "enc")
    assert all(k.startswith("head") for k in not_loaded)
    for name, p in clf.transformer.state_dict().items():
        torch.testing.assert_close(p, enc.transformer.state_dict()[name])
    with pytest.raises(ValueError, match="does not fit"):
        load_encoder_weights(tiny_encoder(dim=32, num_classes=3), tmp_path / "enc")


def test_sequence_classification_uses_cls_token_only() -> None:
    clf = tiny_encoder(num_classes=3).eval()
    task = ClassificationTask(clf)
    ids = torch.randint(7, 30, (2, 8))
    ids[:, 0] = 2
    logits = task({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert logits.shape == (2, 3)
    hidden = clf(ids)
    torch.testing.assert_close(logits, clf.head(hidden[:, 0]))
    # right padding (masked) does not change the prediction
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones_like(ids), torch.zeros(2, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(task({"input_ids": padded, "attention_mask": mask}), logits,
                               atol=1e-5, rtol=1e-5)


# --- embedding queries ---------------------------------------------------------------


def _toy_embedding() -> tuple[torch.Tensor, WordTokenizer]:
    """Axes: royalty, gender (+ male), fruitiness. king - man + woman = queen exactly."""
    words = {"king": [1, 1, 0], "queen": [1, -1, 0], "man": [0, 1, 0], "woman": [0, -1, 0],
             "prince": [0.9, 1, 0.1], "apple": [0, 0, 1], "pear": [0.1, 0, 1]}
    tok = WordTokenizer([*SPECIAL_TOKENS, *words])
    weight = torch.zeros(tok.vocab_size, 3)
    weight[: len(SPECIAL_TOKENS)] = torch.tensor([1.0, -1.0, 0.0])  # would tie with queen
    for w, v in words.items():
        weight[tok.token_to_id(w)] = torch.tensor(v)
    return weight, tok


def test_nearest_neighbours_by_cosine() -> None:
    weight, tok = _toy_embedding()
    got = nearest_neighbours(weight, tok, "apple", k=2)
    assert [w for w, _ in got] == ["pear", "prince"]
    cos = 1 / math.sqrt(1.01)  # apple . pear / (|apple| |pear|)
    assert got[0][1] == pytest.approx(cos, rel=1e-6)
    assert "king" not in [w for w, _ in nearest_neighbours(weight, tok, "king", k=7)]


def test_analogy_excludes_query_words_and_specials() -> None:
    weight, tok = _toy_embedding()
    got = analogy(weight, tok, "man", "king", "woman", k=3)
    assert got[0][0] == "queen" and got[0][1] == pytest.approx(1.0)
    assert not {"man", "king", "woman"} & {w for w, _ in got}
    assert not set(SPECIAL_TOKENS) & {w for w, _ in got}
    # also works on a model's tok_embed
    model = TextDecoder(TextDecoderConfig(vocab_size=tok.vocab_size, max_len=4, dim=3,
                                          depth=1, heads=1))
    with torch.no_grad():
        model.tok_embed.weight.copy_(weight)
    assert analogy(model, tok, "man", "king", "woman", k=1)[0][0] == "queen"
    with pytest.raises(ValueError, match="not a single token"):
        nearest_neighbours(weight, tok, "banana")


# --- bigram baselines of benchmarks/text_lm.py ---------------------------------------


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("text_lm", ROOT / "benchmarks" / "text_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bigram_baselines_match_their_formulas() -> None:
    bench = _benchmark_module()
    blocks = torch.tensor([[0, 1, 1, 2], [1, 2, 0, 1]])  # pairs: 01 11 12 12 20 01
    counts = bench.bigram_counts(blocks, 3)
    assert counts.tolist() == [[0, 2, 0], [0, 1, 2], [1, 0, 0]]
    add_one = bench.add_one_bigram(counts).exp()
    assert float(add_one[1, 2]) == pytest.approx((2 + 1) / (3 + 3))
    kn = bench.kneser_ney_bigram(counts, discount=0.5).exp()
    # P_cont(w) = (N1+(. w) + 1) / (N1+(. .) + V): N1+(. 0)=1, (. 1)=2, (. 2)=1, total 4
    cont = torch.tensor([2, 3, 2]) / 7
    # row 1: c(1,.) = 3, two distinct followers -> backoff weight 0.5 * 2 / 3
    expected = torch.tensor([0, 0.5, 1.5]) / 3 + (0.5 * 2 / 3) * cont
    torch.testing.assert_close(kn[1].float(), expected.float())
    for probs in (add_one, kn):
        torch.testing.assert_close(probs.sum(1), torch.ones(3, dtype=probs.dtype))
    nll = bench.bigram_nll(bench.add_one_bigram(counts), blocks)
    assert nll == pytest.approx(float(-add_one[blocks[:, :-1], blocks[:, 1:]].log().mean()))


def test_decoder_sliding_window_reaches_back_window_tokens_per_layer() -> None:
    torch.manual_seed(0)
    window, depth = 3, 2
    model = TextDecoder(TextDecoderConfig(vocab_size=50, max_len=16, dim=32, depth=depth,
                                          heads=4, mlp_dim=64, attention_pattern="sliding",
                                          attention_window=window)).eval()
    x = torch.randint(0, 50, (2, 12))
    y = x.clone()
    y[:, 0] = (x[:, 0] + 1) % 50
    with torch.no_grad():
        changed = ((model(x) - model(y)).abs().amax(dim=(0, 2)) > 1e-6).tolist()
    reach = depth * (window - 1)  # each layer looks window - 1 tokens further back
    assert changed == [True] * (reach + 1) + [False] * (12 - reach - 1)


def test_decoder_bad_ids_raise_clear_errors_with_and_without_cache() -> None:
    model = TextDecoder(TextDecoderConfig(vocab_size=10, max_len=8, dim=16, depth=1,
                                          heads=2)).eval()
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 10\)"):
        model(torch.tensor([[1, 10]]))  # full forward: values checked up front
    cache = model.make_cache()
    model(torch.tensor([[1, 2]]), cache=cache)  # prefill
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 10\)"):
        model(torch.tensor([[-1]]), cache=cache)  # cached step: the embedding's bound check
