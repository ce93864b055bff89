"""Text classification from your own labelled texts: ``text,label`` CSV / JSONL and a folder
of class subfolders of ``.txt`` files, written here; labels as names or integers, splits,
batches, predict inputs, and every bad input named by file and line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from multimodal.data.text_classification import TextClassificationDataModule
from multimodal.data.text_labelled import read_labelled_texts

ANIMALS = ["the cat sat on the mat", "a dog ran in the park", "cats purr and sleep",
           "dogs bark at night", "the kitten chased a ball", "my puppy likes bones"]
LABELS = ["cat", "dog", "cat", "dog", "cat", "dog"]


def write_csv(path: Path, rows: list[dict], fields: list[str]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def animals_csv(tmp_path: Path, repeat: int = 1, name: str = "train.csv") -> Path:
    rows = [{"id": i, "text": f"{t} {k}", "label": lab}
            for k in range(repeat) for i, (t, lab) in enumerate(zip(ANIMALS, LABELS, strict=True))]
    return write_csv(tmp_path / name, rows, ["id", "text", "label"])


def test_csv_labels_are_sorted_names_known_right_after_construction(tmp_path):
    path = animals_csv(tmp_path)
    dm = TextClassificationDataModule(train=str(path), val_size=0, test_size=0,
                                      vocab_size=80, batch_size=6)
    assert dm.class_names == ["cat", "dog"] and dm.num_classes == 2
    assert dm.datasets == {}  # nothing encoded yet: the classes came from the labels alone
    dm.setup("fit")
    # every text and label arrives once; ids = the data module's tokenizer on that text
    # ([CLS] first), padded with [PAD] and masked
    batch = next(iter(dm.loader(dm.split_dataset("train"), shuffle=False)))
    tok = dm.tokenizer
    for row, mask, label, text, name in zip(batch["input_ids"], batch["attention_mask"],
                                            batch["label"], ANIMALS, LABELS, strict=True):
        ids = tok.encode(f"{text} 0", add_cls=True)
        assert row[: len(ids)].tolist() == ids and mask.sum() == len(ids)
        assert row[len(ids):].eq(tok.pad_token_id).all()
        assert dm.class_names[int(label)] == name


def test_a_spreadsheets_byte_order_mark_is_not_part_of_the_header(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("text,label\r\nhello,a\r\n".encode("utf-8-sig"))
    data = read_labelled_texts(path)
    assert data.texts == ["hello"] and data.labels == ["a"]


def test_integer_labels_are_class_ids_and_classes_names_them(tmp_path):
    rows = [{"text": t, "label": 1 if lab == "dog" else 0}
            for t, lab in zip(ANIMALS, LABELS, strict=True)]
    path = write_jsonl(tmp_path / "train.jsonl", [*rows, {"text": "a parrot talks", "label": 2}])
    dm = TextClassificationDataModule(train=str(path), val_size=0, test_size=0,
                                      vocab_size=80)
    assert dm.class_names == ["0", "1", "2"]
    named = TextClassificationDataModule(train=str(path), classes=["cat", "dog", "bird"],
                                         val_size=0, test_size=0, vocab_size=80)
    assert named.num_classes == 3
    named.setup("fit")
    assert named.datasets["train"].labels == [0, 1, 0, 1, 0, 1, 2]
    # CSV cells "10", "2", "0": integers (class 10 is index 10), not names sorted as text
    csv_path = write_csv(tmp_path / "ints.csv", [{"text": t, "label": lab} for t, lab in
                                                 [("a", "10"), ("b", "2"), ("c", "0")]],
                         ["text", "label"])
    ints = TextClassificationDataModule(train=str(csv_path), val_size=0,
                                        test_size=0, vocab_size=40)
    assert ints.num_classes == 11
    ints.setup("fit")
    assert ints.datasets["train"].labels == [10, 2, 0]


def test_folder_of_txt_files_per_class(tmp_path):
    root = tmp_path / "reviews"
    for cls, texts in {"neg": ["awful film", "too long\nand dull"],
                       "pos": ["loved it", "great cast", "a joy"]}.items():
        (root / cls / "sub").mkdir(parents=True)
        for i, t in enumerate(texts):
            (root / cls / ("sub" if i == 0 else "") / f"{i}.txt").write_text(t + "\n")
    (root / "pos" / "notes.md").write_text("not a text file of the class")
    data = read_labelled_texts(root)
    assert data.labels == ["neg", "neg", "pos", "pos", "pos"]
    assert sorted(data.texts) == sorted(["awful film", "too long\nand dull", "loved it",
                                         "great cast", "a joy"])
    dm = TextClassificationDataModule(train=str(root), val_size=0, test_size=0,
                                      vocab_size=60)
    assert dm.class_names == ["neg", "pos"]


def test_held_out_splits_are_seeded_and_disjoint(tmp_path, monkeypatch):
    path = animals_csv(tmp_path, repeat=10)  # 60 texts
    kw = dict(train=str(path), val_size=0.2, test_size=6, vocab_size=100, seed=3)
    dm = TextClassificationDataModule(**kw)
    splits = dm.read_splits()
    where = {k: v.where for k, v in splits.items()}
    assert len(where["test"]) == 6 and len(where["val"]) == round(0.2 * 54)
    assert len({w for rows in where.values() for w in rows}) == 60  # a partition of the rows
    assert TextClassificationDataModule(**kw).read_splits()["test"].where == where["test"]
    other = TextClassificationDataModule(**{**kw, "seed": 4}).read_splits()
    assert other["test"].where != where["test"]
    # the tokenizer is trained on the training split only
    from multimodal.tokenizers.text import WordPieceTokenizer
    seen = []
    train = WordPieceTokenizer.train.__func__

    def spy(cls, texts, **kw):
        seen.append(list(texts))
        return train(cls, seen[-1], **kw)

    monkeypatch.setattr(WordPieceTokenizer, "train", classmethod(spy))
    dm.setup("fit")
    assert seen == [splits["train"].texts]


def test_given_val_and_test_files_are_used_whole(tmp_path):
    train = animals_csv(tmp_path)
    test = write_jsonl(tmp_path / "test.jsonl", [{"text": "a cat", "label": "cat"}])
    dm = TextClassificationDataModule(train=str(train), test=str(test), val_size=0,
                                      vocab_size=60)
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 6 and dm.datasets["test"].labels == [0]


def test_predict_texts_are_named_by_file_and_line(tmp_path):
    train = animals_csv(tmp_path)
    lines = tmp_path / "new.txt"
    lines.write_text("a cat naps\n\nthe dog digs\n")
    dm = TextClassificationDataModule(train=str(train), val_size=0, test_size=0,
                                      vocab_size=60, predict=str(lines))
    batch = next(iter(dm.predict_dataloader()))
    assert batch["filename"] == [f"{lines}:1", f"{lines}:3"]
    assert batch["input_ids"][1, :batch["attention_mask"][1].sum()].tolist() == \
        dm.tokenizer.encode("the dog digs", add_cls=True)
    from multimodal.data.text_labelled import read_predict_texts

    (tmp_path / "new" / "sub").mkdir(parents=True)
    (tmp_path / "new" / "b.txt").write_text("second\n")
    (tmp_path / "new" / "sub" / "a.txt").write_text("first one\n")
    assert read_predict_texts(tmp_path / "new") == (["second", "first one"],
                                                    ["b.txt", "sub/a.txt"])
    rows = write_jsonl(tmp_path / "p.jsonl", [{"text": "x y"}, {"text": "z"}])
    assert read_predict_texts(rows) == (["x y", "z"], [f"{rows}:1", f"{rows}:2"])
    with pytest.raises(ValueError, match=r"p2\.jsonl:1: no 'text' field"):
        read_predict_texts(write_jsonl(tmp_path / "p2.jsonl", [{"body": "x"}]))


def test_fit_then_test_from_the_checkpoint_uses_the_trained_tokenizer(tmp_path):
    """``tokenizers`` breaks ties in hash order: a WordPiece trained again (by a new process,
    for ``multimodal test --ckpt_path``) may number the pieces differently. The checkpoint
    carries the one the model was trained with."""
    import lightning as L
    import torch

    from multimodal import TextEncoder, TextEncoderConfig
    from multimodal.tasks import ClassificationTask
    from multimodal.tokenizers.io import tokenizer_to_json

    train = animals_csv(tmp_path, repeat=4)
    kw = dict(train=str(train), vocab_size=64, max_length=32, batch_size=8)

    def task():
        return ClassificationTask(TextEncoder(TextEncoderConfig(
            vocab_size=64, max_len=32, dim=16, depth=1, heads=2, num_classes=2,
            mlm_head=False)), optimizer={"lr": 5e-4, "weight_decay": 0.01, "warmup_fraction": 0.1})

    def trainer():
        return L.Trainer(max_epochs=1, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)

    dm = TextClassificationDataModule(**kw)
    trainer().fit(task(), datamodule=dm)
    (ckpt,) = tmp_path.rglob("*.ckpt")
    state = torch.load(ckpt, weights_only=False)["TextClassificationDataModule"]
    assert state["tokenizer"] == tokenizer_to_json(dm.tokenizer)
    again = TextClassificationDataModule(**kw)
    trainer().test(task(), datamodule=again, ckpt_path=ckpt)
    assert tokenizer_to_json(again.tokenizer) == state["tokenizer"]
    assert again.datasets["test"].ids == dm.datasets["test"].ids
    # predict: the checkpoint's tokenizer, the module's arguments saved to rebuild it
    new = tmp_path / "new.txt"
    new.write_text("a cat naps\nthe dog digs\n")
    assert torch.load(ckpt, weights_only=False)["datamodule_hyper_parameters"]["train"] == \
        str(train)
    later = TextClassificationDataModule(**kw, predict=str(new))
    rows = trainer().predict(task(), datamodule=later, ckpt_path=ckpt)
    assert [name for batch in rows for name, _, _ in batch] == [f"{new}:1", f"{new}:2"]
    assert tokenizer_to_json(later.tokenizer) == state["tokenizer"] and later.datasets == {}


# ------------------------------------------------------------------------------ bad input
def test_text_data_without_a_text_column_names_the_file(tmp_path):
    path = write_csv(tmp_path / "t.csv", [{"body": "x", "label": "a"}], ["body", "label"])
    with pytest.raises(ValueError, match=r"t\.csv:1: no 'text' column in the header"):
        TextClassificationDataModule(train=str(path)).class_names
    rows = write_jsonl(tmp_path / "t.jsonl", [{"text": "ok", "label": "a"},
                                              {"body": "x", "label": "b"}])
    with pytest.raises(ValueError, match=r"t\.jsonl:2: no 'text' field"):
        TextClassificationDataModule(train=str(rows)).class_names


def test_malformed_rows_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text('text,label\n"fine, quoted",a\n"two\nlines",b\none,two,three\n')
    with pytest.raises(ValueError, match=r"bad\.csv:5: 3 fields, the header has 2"):
        read_labelled_texts(path)
    path.write_text("text,label\nok,a\n,b\n")
    with pytest.raises(ValueError, match=r"bad\.csv:3: empty 'text'"):
        read_labelled_texts(path)
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"text": "ok", "label": "a"}\n\n{"text": "no close", "label": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not valid JSON"):
        read_labelled_texts(jl)
    jl.write_text('{"text": "ok", "label": 1.5}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: 'label' must be a class name or an "
                                         r"integer class id, got 1.5"):
        read_labelled_texts(jl)
    jl.write_text('{"text": ["a"], "label": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: 'text' must be a string"):
        read_labelled_texts(jl)
    jl.write_text('{"text": "a", "label": 0}\n{"text": "b", "label": -1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: class id -1 is negative"):
        TextClassificationDataModule(train=str(jl)).class_names
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,label\ncaf\xe9,a\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.csv:2: not UTF-8 text"):
        read_labelled_texts(latin)


def test_a_label_never_seen_in_training_is_an_error_naming_where(tmp_path):
    train = animals_csv(tmp_path)
    test = write_jsonl(tmp_path / "test.jsonl", [{"text": "a cat", "label": "cat"},
                                                 {"text": "a bird", "label": "bird"}])
    dm = TextClassificationDataModule(train=str(train), test=str(test), val_size=0,
                                      vocab_size=60)
    with pytest.raises(ValueError, match=r"test\.jsonl:2: the test label 'bird' never "
                                         r"appears in the training data"):
        dm.setup("fit")
    # integer ids: an id the training file never uses, although below the largest
    ints = write_jsonl(tmp_path / "ints.jsonl", [{"text": "a", "label": 0},
                                                 {"text": "b", "label": 2}])
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": "c", "label": 1}])
    dm = TextClassificationDataModule(train=str(ints), val=str(val), test_size=0,
                                      vocab_size=30)
    with pytest.raises(ValueError, match=r"val\.jsonl:1: the val label 1 never appears"):
        dm.setup("fit")
    # a class list names the label yet no training text has it: allowed (the user said so)
    val.write_text(json.dumps({"text": "c", "label": "dog"}) + "\n")
    names = write_jsonl(tmp_path / "names.jsonl", [{"text": "a", "label": "cat"}] * 3)
    dm = TextClassificationDataModule(train=str(names), val=str(val), test_size=0,
                                      classes=["cat", "dog"], vocab_size=30)
    dm.setup("fit")
    assert dm.datasets["val"].labels == [1]
    # a training label outside the given classes
    with pytest.raises(ValueError, match=r"names\.jsonl:1: label 'cat' is not in classes"):
        TextClassificationDataModule(train=str(names), classes=["dog"]).class_names


def test_empty_class_folder_and_empty_text_file_are_errors(tmp_path):
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "a" / "1.txt").write_text("words")
    (root / "b").mkdir()
    (root / "b" / "readme.md").write_text("not a .txt")
    with pytest.raises(ValueError, match=r"empty class folder .*data/b: no file ending in "
                                         r"\.txt"):
        TextClassificationDataModule(train=str(root)).class_names
    (root / "b" / "2.txt").write_text("  \n")
    with pytest.raises(ValueError, match=r"data/b/2\.txt holds no text"):
        TextClassificationDataModule(train=str(root)).class_names


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="give train"):
        TextClassificationDataModule()
    with pytest.raises(ValueError, match="or shards, not both"):
        TextClassificationDataModule(train="x.csv", shards="s/")
    with pytest.raises(FileNotFoundError, match=r"tokenizer .*nope\.json not found"):
        TextClassificationDataModule(train="x.csv", tokenizer=str(tmp_path / "nope.json"))
    with pytest.raises(FileNotFoundError, match=r"holds no tokenizer\.json"):
        TextClassificationDataModule(train="x.csv", tokenizer=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"text data not found: .*missing\.csv"):
        TextClassificationDataModule(train=str(tmp_path / "missing.csv")).class_names
    path = tmp_path / "t.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"expected a \.csv, \.tsv or \.jsonl file"):
        TextClassificationDataModule(train=str(path)).class_names
