"""``multimodal.files``: what a path is, decided in one place.

Each kind of model path made for real (a save_pretrained folder, a transformers folder, a
CTranslate2 layout, a GGUF file under a wrong name, a task checkpoint, a legacy pickle), the
paths that hold no model named for what they are, and a scan of the package that fails on a
second classifier (magic bytes, layout tests, suffix lists) outside ``files.py``.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
import torch

import multimodal as mm
from multimodal.files import (
    AUDIO_EXTENSIONS,
    IMAGE_EXTENSIONS,
    path_kind,
    read_rows,
    sniff_torch_file,
)

PACKAGE = Path(__file__).resolve().parents[1] / "multimodal"


def _tiny_vit() -> mm.ViT:
    return mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1, num_classes=2,
                               dim=8, depth=1, heads=2, mlp_dim=16))


def test_every_model_kind_is_recognised(tmp_path):
    ours = _tiny_vit().save_pretrained(tmp_path / "ours")
    assert path_kind(ours) == "save_pretrained"

    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=16)
    transformers.BertModel(cfg).save_pretrained(tmp_path / "hf")
    assert path_kind(tmp_path / "hf") == "hf"

    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    (ct2 / "model.bin").write_bytes(b"\x00" * 16)
    (ct2 / "config.json").write_text("{}")
    assert path_kind(ct2) == "ctranslate2"

    gguf = tmp_path / "weights.bin"  # the magic decides, not the name
    gguf.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 16)
    assert path_kind(gguf) == "gguf"

    ckpt = tmp_path / "task.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    assert path_kind(ckpt) == "checkpoint"
    legacy = tmp_path / "legacy.pt"
    with legacy.open("wb") as f:
        pickle.dump({"state_dict": {}}, f, protocol=2)  # starts with 0x80: protocol byte
    assert path_kind(legacy) == "checkpoint"


@pytest.mark.parametrize("content,named", [
    (b"epoch,loss\n1,0.5\n", r"notes\.ckpt is not a checkpoint file: it is a text file"),
    (b"<!DOCTYPE html><html>login</html>", r"is not a checkpoint file: it is an HTML page"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\n", r"Git LFS pointer"),
    (b"", r"it is empty"),
])
def test_files_that_are_no_model_are_named(tmp_path, content, named):
    path = tmp_path / "notes.ckpt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=named):
        path_kind(path)


def test_folders_without_a_model_and_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent does not exist"):
        path_kind(tmp_path / "absent")
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.png").write_bytes(b"\x89PNG")
    with pytest.raises(FileNotFoundError, match=r"photos has no config\.json"):
        path_kind(photos)
    (photos / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        path_kind(photos)
    (photos / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match=r"expected a JSON object, got list"):
        path_kind(photos)


def test_sniff_names_what_a_file_is(tmp_path):
    zipped = tmp_path / "a.ckpt"
    torch.save({"x": 1}, zipped)
    assert sniff_torch_file(zipped) is None
    binary = tmp_path / "b.ckpt"
    binary.write_bytes(bytes(range(200, 256)))
    assert "starts with the bytes" in sniff_torch_file(binary)


def test_one_extension_list_per_modality():
    assert len(set(IMAGE_EXTENSIONS)) == len(IMAGE_EXTENSIONS)
    assert not set(IMAGE_EXTENSIONS) & set(AUDIO_EXTENSIONS)
    assert all(e.startswith(".") and e == e.lower() for e in IMAGE_EXTENSIONS + AUDIO_EXTENSIONS)


# ------------------------------------------------------------------------- read_rows
def test_a_csv_is_read_with_lines_quotes_blank_lines_and_a_bom(tmp_path):
    path = tmp_path / "my.csv"
    # a BOM (a spreadsheet's export), a quoted field over two lines, a blank line, CRLF
    path.write_bytes("\ufefftext,label\r\n\"a, b\",x\r\n\"two\nlines\",y\r\n\r\ncafé,z\r\n"
                     .encode("utf-8"))
    assert list(read_rows(path, ("text", "label"))) == [
        (2, {"text": "a, b", "label": "x"}),
        (3, {"text": "two\nlines", "label": "y"}),
        (6, {"text": "café", "label": "z"}),
    ]


def test_a_tsv_splits_on_tabs_without_quoting_and_may_have_no_header(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text('source\ttarget\textra\n"hi"\tsalut\t1\n\nbye\tau revoir\t2\n')
    assert list(read_rows(path, ("source", "target"))) == [
        (2, {"source": '"hi"', "target": "salut", "extra": "1"}),  # a quote is a character
        (4, {"source": "bye", "target": "au revoir", "extra": "2"}),
    ]
    path.write_text("hello\tbonjour\tCC-BY\n\nyes\toui\n")  # Tatoeba's layout: no header
    assert list(read_rows(path, ("source", "target"), header="optional")) == [
        (1, {"source": "hello", "target": "bonjour"}),
        (3, {"source": "yes", "target": "oui"}),
    ]


def test_a_jsonl_gives_each_object_as_it_is(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"image": "a.png", "caption": ["x", "y"], "n": 3}\n\n'
                    '{"image": "b.png", "caption": "z"}\n')
    assert list(read_rows(path, ("image", "caption"))) == [
        (1, {"image": "a.png", "caption": ["x", "y"], "n": 3}),
        (3, {"image": "b.png", "caption": "z"}),
    ]
    assert list(read_rows(path)) == list(read_rows(path, ("image",)))


@pytest.mark.parametrize("name,content,message", [
    ("my.csv", b"text\nhello\n", r"my\.csv:1: no 'label' column in the header \['text'\]"),
    ("my.csv", b"\n\ntext,lab\nx,y\n", r"my\.csv:3: no 'label' column in the header"),
    ("my.csv", b"text,label\na,b\n\nc,d,e\n", r"my\.csv:4: 3 fields, the header has 2"),
    ("my.csv", b"text,label\na,b\n  ,c\n", r"my\.csv:3: empty 'text'"),
    ("my.csv", b"", r"my\.csv:1: empty file, expected a header row"),
    ("my.csv", b"text,label\nok,a\ncaf\xe9,b\n", r"my\.csv:3: not UTF-8 text \(invalid "
                                                   r"continuation byte: byte b'\\xe9' at column 4"),
    ("my.tsv", b"text\tlabel\nonly one\n", r"my\.tsv:2: 1 fields, the header has 2"),
    ("my.csv", b"text,label\nok,a\n" + b"x" * 140_000 + b",b\n",
     r"my\.csv:3: not a valid CSV row \(field larger than field limit"),
    ("my.jsonl", b'{"text": "a", "label": 1}\n\n{"text": "b",\n', r"my\.jsonl:3: not valid "
                                                                  r"JSON"),
    ("my.jsonl", b'["text", "label"]\n', r"my\.jsonl:1: expected a JSON object, got list"),
    ("my.jsonl", b'{"text": "a", "label": 1}\n{"text": "b"}\n',
     r"my\.jsonl:2: no 'label' field \(fields: \['text'\]\)"),
    ("my.jsonl", b'{"text": "", "label": 1}\n', r"my\.jsonl:1: empty 'text'"),
])
def test_every_table_error_names_the_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        list(read_rows(path, ("text", "label")))


def test_a_headerless_tsv_row_too_short_and_files_that_are_no_table(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("hello\tbonjour\nno tab here\n")
    with pytest.raises(ValueError, match=r"pairs\.tsv:2: 1 field\(s\), expected 2 \(source, "
                                         r"target\) separated by a tab"):
        list(read_rows(path, ("source", "target"), header="optional"))
    with pytest.raises(FileNotFoundError, match=r"manifest not found: .*absent\.csv"):
        list(read_rows(tmp_path / "absent.csv", what="manifest"))
    with pytest.raises(ValueError, match=r"notes\.txt: expected a \.csv, \.tsv or \.jsonl"):
        list(read_rows(tmp_path / "notes.txt"))


# What classifying a path looks like in source: a magic-byte literal, a layout test, a suffix
# list. Outside files.py each would be a second answer to "what is at PATH".
SECOND_CLASSIFIERS = {
    "GGUF magic": re.compile(r"""b["']GGUF["']"""),
    "zip magic": re.compile(r"""b["']PK\\x03\\x04["']"""),
    "zipfile sniff": re.compile(r"\bis_zipfile\("),
    "old classifier": re.compile(r"\b(is_gguf_file|is_ctranslate2_dir|sniff_checkpoint|"
                                 r"_is_hf_folder)\b"),
    "CTranslate2 layout test": re.compile(r"""["']model\.bin(\.part1)?["']\)\.(is_file|exists)"""),
    "suffix list": re.compile(r"^\s*(IMAGE|AUDIO|SPEECH|TEXT)_(EXTENSIONS|SUFFIXES)\s*=",
                              re.MULTILINE),
}


def test_paths_are_classified_only_in_files_py():
    found = []
    for file in sorted(PACKAGE.rglob("*.py")):
        if file == PACKAGE / "files.py":
            continue
        text = file.read_text(encoding="utf-8")
        for what, pattern in SECOND_CLASSIFIERS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{file.relative_to(PACKAGE.parent)}:{line}: {what}")
    assert not found, "classify paths with multimodal.files instead:\n" + "\n".join(found)


def test_the_scan_catches_a_second_classifier(tmp_path):
    """The patterns above match the code they are meant to catch (else the scan proves
    nothing)."""
    samples = {
        "GGUF magic": 'if f.read(4) == b"GGUF":',
        "zip magic": r'if head != b"PK\x03\x04":',
        "zipfile sniff": "zipfile.is_zipfile(p)",
        "old classifier": "if is_ctranslate2_dir(path):",
        "CTranslate2 layout test": 'if (path / "model.bin").is_file():',
        "suffix list": 'IMAGE_SUFFIXES = (".png",)',
    }
    for what, code in samples.items():
        assert SECOND_CLASSIFIERS[what].search(code), what


# Who may ask files.py what a path is. Everyone else takes the parts of multimodal.load(path)
# (load_encoder, chat and the pickers of pipelines/_loaders.py take parts of it), or asks
# multimodal.loading.model_kind(path) what load would read it as (tasks/pretrained.py,
# serve/models.py).
CLASSIFIER_CALLERS = {
    "path_kind": {
        "loading.py",  # the one dispatch over model paths
        "convert/hf_folder.py",  # mm.from_hf(path) reads a GGUF file and a CTranslate2 folder
    },
    "read_path_kind": {
        "loading.py",  # locate(path): the kind and a folder's config.json, read once
    },
    "sniff_torch_file": {
        "checkpoints.py",  # a file read as a checkpoint says what it is instead
        "cli/main.py",  # --ckpt_path of a resumed run: Lightning's file, not a model path
        "cli/callbacks.py",
    },
}


def _callers(name: str, package: Path) -> set[str]:
    call = re.compile(rf"\b{name}\(")
    return {str(f.relative_to(package)) for f in package.rglob("*.py")
            if f.name != "files.py" or f.parent != package
            if call.search(f.read_text(encoding="utf-8"))}


def test_only_the_loader_asks_what_a_path_is():
    """A picker that calls ``path_kind`` / ``sniff_torch_file`` itself is a second answer
    to "what is at PATH"; the list above may only shrink."""
    for name, allowed in CLASSIFIER_CALLERS.items():
        extra = _callers(name, PACKAGE) - allowed
        assert not extra, f"{name} called outside its callers: {sorted(extra)}; take the " \
                          "parts of multimodal.load(path) instead"


def test_the_caller_scan_sees_a_call(tmp_path):
    (tmp_path / "asr.py").write_text("kind = path_kind(folder)\n")
    (tmp_path / "files.py").write_text("def path_kind(p):\n    return sniff_torch_file(p)\n")
    assert _callers("path_kind", tmp_path) == {"asr.py"}
    assert _callers("sniff_torch_file", tmp_path) == set()
