"""Word2VecTask under Lightning: a tiny corpus trains, the vectors land next to the run in
both word2vec formats and the checkpoint carries the word list; a mode mismatch is an
error naming both."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from multimodal.data.word2vec import Word2VecDataModule
from multimodal.embeddings import analogy, load_word2vec_format
from multimodal.tasks.word2vec import Word2VecTask
from tests.models.test_word2vec import tiny_corpus


def test_fit_writes_vectors_and_learns_the_analogy(tmp_path):
    torch.manual_seed(0)
    dm = Word2VecDataModule(sentences=tiny_corpus(), mode="skipgram", min_count=1, window=2,
                            sample=0, batch_size=256)
    task = Word2VecTask(mode="skipgram", dim=16, data_sizes=dm.model_sizes)
    trainer = L.Trainer(max_epochs=4, accelerator="cpu", default_root_dir=tmp_path,
                        logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, datamodule=dm)
    txt = load_word2vec_format(tmp_path / "vectors.txt")
    binary = load_word2vec_format(tmp_path / "vectors.bin")
    assert txt.words == dm.vocab.words == binary.words
    assert torch.equal(txt.vectors, binary.vectors)
    assert torch.equal(binary.vectors, task.model.vectors)
    assert analogy(txt, txt, "man", "king", "woman", k=1)[0][0] == "queen"
    ckpt = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=True)
    assert ckpt["word2vec_words"] == dm.vocab.words


def test_mode_mismatch_is_an_error(tmp_path):
    dm = Word2VecDataModule(sentences=tiny_corpus(n=50), mode="cbow", min_count=1)
    task = Word2VecTask(mode="skipgram", dim=4, data_sizes=dm.model_sizes)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", default_root_dir=tmp_path,
                        logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="cbow examples but the task's mode is skipgram"):
        trainer.fit(task, datamodule=dm)


def test_language_model_starts_from_word_vectors(tmp_path):
    """``LanguageModelTask(word_vectors=PATH)``: when the fit starts, the rows of the words
    the tokenizer has as whole tokens hold the file's vectors (a tiny lr keeps them to check)."""
    from multimodal.data.documents import Document
    from multimodal.data.text import TextCorpusDataModule
    from multimodal.embeddings import save_word2vec_format
    from multimodal.models.text import TextDecoder, TextDecoderConfig
    from multimodal.tasks.language_model import LanguageModelTask

    text = " ".join(" ".join(s) + "." for s in tiny_corpus(n=200))
    docs = [Document(text, "bible", f"d{i}") for i in range(5)]
    dm = TextCorpusDataModule(documents=docs, vocab_size=200, block_size=8, batch_size=2,
                              val_size=1, test_size=1)
    words = ["king", "queen", "crown", "zebra"]
    vectors = torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8) / 10
    path = save_word2vec_format(tmp_path / "v.txt", words, vectors)
    model = TextDecoder(TextDecoderConfig(vocab_size=200, max_len=8, dim=8, depth=1, heads=1,
                                          mlp_dim=16))
    task = LanguageModelTask(model, optimizer={"lr": 1e-12, "weight_decay": 0.0},
                             word_vectors=str(path))
    trainer = L.Trainer(max_steps=1, accelerator="cpu", default_root_dir=tmp_path,
                        logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        limit_val_batches=0)
    trainer.fit(task, datamodule=dm)
    tok = dm.tokenizer
    for i, word in enumerate(words[:3]):
        assert tok.token_to_id(word) is not None, word
        row = model.tok_embed.weight[tok.token_to_id(word)].detach()
        assert torch.allclose(row, vectors[i], atol=1e-6), word
    assert tok.token_to_id("zebra") is None
