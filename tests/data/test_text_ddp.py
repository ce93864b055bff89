"""Distributed runs (2 CPU processes, gloo) of the data modules that train their own
WordPiece: every rank trains one, and ``tokenizers`` numbers tied pieces in hash order,
which differs between processes; the ranks must all end up with rank 0's tokenizer (else
the same id is another piece on each rank)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest

from multimodal import TextEncoder, TextEncoderConfig
from multimodal.data.documents import Document
from multimodal.data.text import SourceClassificationDataModule
from multimodal.data.text_classification import TextClassificationDataModule
from multimodal.data.text_pairs import TextPairsDataModule
from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
from multimodal.tasks import ClassificationTask
from multimodal.tasks.seq2seq import Seq2SeqTask
from multimodal.tokenizers.io import read_tokenizer, tokenizer_to_json

WORDS = ["amber", "basil", "cedar", "dune", "ember", "fjord", "grove", "heath", "inlet",
         "juniper", "kelp", "larch", "moss", "nettle", "oak", "pine"]


class SaveTokenizer(L.Callback):
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = trainer.datamodule
        if isinstance(dm, TextPairsDataModule):  # one shared vocabulary, still shared
            assert dm.source_tokenizer is dm.target_tokenizer
        text = tokenizer_to_json(getattr(dm, "tokenizer", None) or dm.target_tokenizer)
        Path(self.folder, f"rank{trainer.global_rank}.json").write_text(text)


def line(i: int) -> str:  # many words of equal frequency: many ties for the trainer to break
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(5))


@pytest.mark.slow
@pytest.mark.parametrize("module", ["labelled", "sources", "pairs"])
def test_ddp_ranks_share_rank_zeros_trained_wordpiece(tmp_path, module):
    if module == "labelled":
        rows = [f'{line(i)},{"ab"[i % 2]}' for i in range(64)]
        (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
        dm = TextClassificationDataModule(train=str(tmp_path / "train.csv"), vocab_size=60,
                                          max_length=16, val_size=0, test_size=0,
                                          batch_size=8)
    elif module == "pairs":
        (tmp_path / "pairs.tsv").write_text("".join(f"{line(i)}\t{line(i + 5)}\n"
                                                    for i in range(64)))
        dm = TextPairsDataModule(train=str(tmp_path / "pairs.tsv"), vocab_size=60,
                                 max_source_len=16, max_target_len=16, val_size=0,
                                 test_size=0, batch_size=8)
    else:
        docs = [Document(f"{line(i)}. {line(i + 3)}. {line(i + 7)}.", src, f"{src}{i}")
                for i in range(8) for src in ("bible", "fortunes", "shakespeare")]
        dm = SourceClassificationDataModule(documents=docs, vocab_size=60, max_length=16,
                                            val_size=0.0, test_size=0.0, batch_size=8,
                                            tokenizer_path=str(tmp_path / "tok.json"))
    if module == "pairs":
        task = Seq2SeqTask(Seq2Seq(Seq2SeqConfig(
            source_vocab_size=64, target_vocab_size=64, max_source_len=16, max_target_len=16,
            dim=16, encoder_depth=1, decoder_depth=1, heads=2, mlp_dim=32)))
    else:
        task = ClassificationTask(TextEncoder(TextEncoderConfig(
            vocab_size=64, max_len=16, dim=16, depth=1, heads=2, num_classes=dm.num_classes,
            mlm_head=False)), optimizer={"lr": 5e-4, "weight_decay": 0.01, "warmup_fraction": 0.1})
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_steps=1,
                        limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, callbacks=[SaveTokenizer(str(tmp_path))])
    trainer.fit(task, dm)
    assert (tmp_path / "rank0.json").read_text() == (tmp_path / "rank1.json").read_text()
    if module == "sources":  # the file kept for later runs is the one the ranks used
        assert tokenizer_to_json(read_tokenizer(tmp_path / "tok.json")) == \
            (tmp_path / "rank0.json").read_text()
