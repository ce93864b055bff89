"""Language-model text from your own files: .txt files (one, a folder, a glob) and JSONL with
a text field, written here; chunking into documents, splits, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from multimodal.data.readers.text import read_text_documents
from multimodal.data.text import TextCorpusDataModule

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
         "wizards", "quietly", "hex"]


def paragraph(i: int, n: int = 12) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(n)) + f" number {i}."


def write_book(path, paragraphs, start=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(paragraph(start + i) for i in range(paragraphs)) + "\n")
    return path


def test_txt_is_cut_at_blank_lines_into_documents_of_chunk_chars(tmp_path):
    book = write_book(tmp_path / "book.txt", 10)
    size = len(paragraph(0))
    docs = read_text_documents(str(book), chunk_chars=2 * size)
    # paragraphs are grouped in order until a group reaches chunk_chars: pairs here
    assert [d.text for d in docs] == [paragraph(2 * k) + "\n\n" + paragraph(2 * k + 1)
                                      for k in range(5)]
    assert [d.title for d in docs] == [f"{book}#{k}" for k in range(5)]


def test_folder_glob_and_jsonl_name_the_same_kinds_of_files(tmp_path):
    write_book(tmp_path / "lib" / "a.txt", 3)
    write_book(tmp_path / "lib" / "sub" / "b.txt", 3, start=3)
    (tmp_path / "lib" / "notes.md").write_text("not read")
    with open(tmp_path / "lib" / "c.jsonl", "w") as f:
        for i in range(6, 8):
            f.write(json.dumps({"text": paragraph(i), "id": i}) + "\n")
    folder = read_text_documents(str(tmp_path / "lib"), chunk_chars=1)
    assert [d.text for d in folder] == [paragraph(i) for i in (0, 1, 2, 6, 7, 3, 4, 5)]
    globbed = read_text_documents(str(tmp_path / "lib" / "**" / "*.txt"), chunk_chars=1)
    assert [d.text for d in globbed] == [paragraph(i) for i in (0, 1, 2, 3, 4, 5)]
    assert [d.title for d in folder][3] == f"{tmp_path / 'lib' / 'c.jsonl'}:1"


def test_datamodule_trains_on_text_files_with_seeded_document_splits(tmp_path):
    write_book(tmp_path / "lib" / "a.txt", 40)
    write_book(tmp_path / "lib" / "b.txt", 40, start=40)
    kw = dict(train=str(tmp_path / "lib"), vocab_size=120, block_size=8, batch_size=4,
              val_size=0.2, test_size=0.2, chunk_chars=150)
    dm = TextCorpusDataModule(**kw)
    dm.setup("fit")
    titles = {k: [d.title for d in v] for k, v in dm.splits.items()}
    assert all(titles.values())
    assert not set(titles["train"]) & (set(titles["val"]) | set(titles["test"]))
    n = sum(len(v) for v in titles.values())
    assert n == len(read_text_documents(str(tmp_path / "lib"), 150))
    assert len(titles["test"]) == round(0.2 * n)
    again = TextCorpusDataModule(**kw)
    again.setup("fit")
    assert {k: [d.title for d in v] for k, v in again.splits.items()} == titles
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 8)
    assert torch.equal(batch["input_ids"][:, 1:], batch["targets"][:, :-1])
    # the val blocks are the val documents' tokens joined by [EOS]
    tok = dm.tokenizer
    stream = []
    for d in dm.splits["val"]:
        stream += [*tok.encode(d.text), tok.eos_token_id]
    assert dm.datasets["val"][0]["input_ids"].tolist() == stream[:8]


def test_given_val_file_is_used_whole(tmp_path):
    train = write_book(tmp_path / "train.txt", 30)
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"text": paragraph(i)}) + "\n" for i in range(50, 53)))
    dm = TextCorpusDataModule(train=str(train), val=str(val), test_size=0.0, vocab_size=100,
                              block_size=4, chunk_chars=100)
    dm.setup("fit")
    assert [d.text for d in dm.splits["val"]] == [paragraph(i) for i in range(50, 53)]
    assert dm.splits["test"] == [] and len(dm.splits["train"]) > 0


def test_bad_text_input_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no \.txt or \.jsonl files in .*nothing"):
        read_text_documents(str(tmp_path / "nothing*.txt"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8"):
        read_text_documents(str(tmp_path / "latin1.txt"))
    (tmp_path / "blank.txt").write_text("\n\n   \n")
    with pytest.raises(ValueError, match=r"blank\.txt holds no text"):
        read_text_documents(str(tmp_path / "blank.txt"))
    (tmp_path / "rows.jsonl").write_text('{"text": "fine"}\n{"text": ""}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: empty 'text'"):
        read_text_documents(str(tmp_path / "rows.jsonl"))
    (tmp_path / "keys.jsonl").write_text('{"body": "no text key"}\n')
    with pytest.raises(ValueError, match=r"keys\.jsonl:1: no 'text' field \(fields: "
                                         r"\['body'\]\)"):
        read_text_documents(str(tmp_path / "keys.jsonl"))
    (tmp_path / "rows.jsonl").write_text('{"text": "fine"}\n\n{"text": 3}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:3: 'text' must be a string, got int"):
        read_text_documents(str(tmp_path / "rows.jsonl"))
    short = write_book(tmp_path / "short.txt", 2)
    with pytest.raises(ValueError, match=r"short\.txt: 1 documents"):
        TextCorpusDataModule(train=str(short), chunk_chars=4000).setup("fit")
