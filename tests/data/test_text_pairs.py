"""Sequence to sequence from your own text pairs: TSV (header or not), CSV and JSONL written
here; splits, batches, truncation, trained tokenizers kept in checkpoints, bad input named
by file and line, the shipped dates example and configs/seq2seq_pairs.yaml."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from multimodal.data.text_labelled import read_text_pairs
from multimodal.data.text_pairs import TextPairsDataModule

ROOT = Path(__file__).parents[2]
PAIRS = [("good morning", "bonjour"), ("thank you", "merci"), ("the cat", "le chat"),
         ("a red car", "une voiture rouge"), ("see you soon", "à bientôt"),
         ("good night", "bonne nuit")]


def write_tsv(path: Path, pairs, header: bool = False, extra: bool = False) -> Path:
    lines = ["source\ttarget"] if header else []
    lines += [f"{s}\t{t}" + ("\tCC-BY 2.0 (France) Attribution" if extra else "")
              for s, t in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_tsv_with_or_without_header_csv_and_jsonl_read_the_same_pairs(tmp_path):
    plain = read_text_pairs(write_tsv(tmp_path / "a.tsv", PAIRS, extra=True))
    header = read_text_pairs(write_tsv(tmp_path / "b.tsv", PAIRS, header=True))
    jl = tmp_path / "c.jsonl"
    jl.write_text("".join(json.dumps({"target": t, "source": s, "id": i}) + "\n"
                          for i, (s, t) in enumerate(PAIRS)), encoding="utf-8")
    csv_path = tmp_path / "d.csv"
    csv_path.write_text("id,target,source\n" + "".join(f'{i},"{t}","{s}"\n'
                                                       for i, (s, t) in enumerate(PAIRS)))
    for data in (plain, header, read_text_pairs(jl), read_text_pairs(csv_path)):
        assert list(zip(data.sources, data.targets, strict=True)) == PAIRS
    assert plain.where[2] == f"{tmp_path / 'a.tsv'}:3" and header.where[2] == \
        f"{tmp_path / 'b.tsv'}:4"


def test_batches_frame_targets_with_bos_and_eos(tmp_path):
    dm = TextPairsDataModule(train=str(write_tsv(tmp_path / "p.tsv", PAIRS)), vocab_size=90,
                             val_size=0, test_size=0, batch_size=6)
    dm.setup("fit")
    batch = next(iter(dm.loader(dm.split_dataset("train"), shuffle=False)))
    src, tgt = dm.source_tokenizer, dm.target_tokenizer
    assert src is tgt  # shared_vocabulary: one WordPiece for both sides
    assert (dm.bos_token_id, dm.eos_token_id, dm.pad_token_id) == (5, 6, 0)
    for b, (s, t) in enumerate(PAIRS):
        ids = src.encode(s)
        assert batch["source_ids"][b, : len(ids)].tolist() == ids
        assert batch["source_mask"][b].sum() == len(ids)
        want = [5, *tgt.encode(t), 6]
        assert batch["target_ids"][b, : len(want)].tolist() == want
        assert batch["target_ids"][b, len(want):].eq(0).all()
    assert dm.decode_targets(batch["target_ids"]) == [tgt.decode(tgt.encode(t))
                                                      for _, t in PAIRS]
    separate = TextPairsDataModule(train=str(tmp_path / "p.tsv"), vocab_size=90,
                                   shared_vocabulary=False, val_size=0, test_size=0)
    assert separate.source_tokenizer is not separate.target_tokenizer
    assert separate.target_tokenizer.token_to_id("morning") is None


def test_long_texts_are_cut_to_the_max_lengths_and_counted(tmp_path):
    long = [("one two three four five six seven", "a b c d e f g h")]
    dm = TextPairsDataModule(train=str(write_tsv(tmp_path / "p.tsv", PAIRS + long)),
                             vocab_size=90, max_source_len=4, max_target_len=5,
                             val_size=0, test_size=0)
    dm.setup("fit")
    source, target = dm.datasets["train"][len(PAIRS)]
    tok = dm.target_tokenizer
    assert source == dm.source_tokenizer.encode(long[0][0])[:4]
    assert target == [5, *tok.encode(long[0][1])[:3], 6]
    assert dm.truncated["train"] >= 2


def test_trained_tokenizers_travel_in_the_state_dict(tmp_path):
    kw = dict(train=str(write_tsv(tmp_path / "p.tsv", PAIRS * 3)), vocab_size=90,
              shared_vocabulary=False, val_size=3, test_size=3)
    dm = TextPairsDataModule(**kw)
    dm.setup("fit")
    state = dm.state_dict()
    again = TextPairsDataModule(**kw)
    again.setup("fit")  # Lightning sets up before restoring the checkpoint
    again.load_state_dict(state)
    assert again.datasets == {}  # encoded again, with the restored tokenizers, when asked
    for side in ("source", "target"):
        a, b = getattr(dm, f"{side}_tokenizer"), getattr(again, f"{side}_tokenizer")
        assert a.backend.get_vocab() == b.backend.get_vocab()
    for split in ("train", "val", "test"):
        assert again.split_dataset(split).targets == dm.datasets[split].targets
        assert again.split_dataset(split).sources == dm.datasets[split].sources


def test_bad_pairs_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("hello\tbonjour\nno tab on this line\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:2: 1 field\(s\), expected 2 \(source, "
                                         r"target\) separated by a tab"):
        read_text_pairs(bad)
    bad.write_text("source\ttarget\nhello\t\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:2: empty 'target'"):
        read_text_pairs(bad)
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"source": "a", "target": "b"}\n{"source": "a", "tgt": "b"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: no 'target' field"):
        read_text_pairs(jl)
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("src,target\na,b\n")
    with pytest.raises(ValueError, match=r"bad\.csv:1: no 'source' column in the header"):
        read_text_pairs(csv_path)
    with pytest.raises(ValueError, match="is a folder"):
        read_text_pairs(tmp_path)
    with pytest.raises(ValueError, match="give train"):
        TextPairsDataModule()


def _date_pairs_module():
    spec = importlib.util.spec_from_file_location("make_date_pairs",
                                                  ROOT / "data" / "make_date_pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_dates_example_is_what_the_recipe_writes(tmp_path):
    _date_pairs_module().write(tmp_path)
    shipped = ROOT / "data" / "examples" / "dates"
    dates = {}
    for split in ("train", "val", "test"):
        assert (shipped / f"{split}.tsv").read_text() == (tmp_path / f"{split}.tsv").read_text()
        dates[split] = set(read_text_pairs(shipped / f"{split}.tsv").targets)
    assert not dates["train"] & (dates["val"] | dates["test"])  # read, not remembered


@pytest.mark.slow  # ~6 s on a loaded machine
def test_seq2seq_pairs_config_fits_through_the_cli(tmp_path):
    from multimodal.cli.main import main

    main(["fit", "--config", str(ROOT / "configs" / "seq2seq_pairs.yaml"),
          "--data.init_args.train", str(ROOT / "data/examples/dates/train.tsv"),
          "--data.init_args.val", str(ROOT / "data/examples/dates/val.tsv"),
          "--data.init_args.test", str(ROOT / "data/examples/dates/test.tsv"),
          "--trainer.fast_dev_run", "2", "--trainer.default_root_dir", str(tmp_path)])
