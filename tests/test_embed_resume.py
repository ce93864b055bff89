"""``embed --out`` resumes by content: a row is reused only for an input whose content hash it
carries; edited, inserted and deleted lines of a text file are embedded again, embedded, and
dropped, and the run says how many of each."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import multimodal as mm
from multimodal.encoder import Encoder
from multimodal.pipelines.embed import _write, embed, read_embeddings

LINES = ["the cat sat on the mat", "a dog ran in the park", "red green blue",
         "the big red square", "a circle", "blue birds sing"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = mm.WordPieceTokenizer.train(LINES * 10 + ["an edited line", "one more"] * 10,
                                      vocab_size=120)
    torch.manual_seed(0)
    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=16, dim=32,
                                                depth=2, heads=2, mlp_dim=64))
    return Encoder(model, tok, pooling="mean").save_pretrained(
        tmp_path_factory.mktemp("resume") / "enc")


class Counting:
    """The folder's encoder, noting every text it is asked to embed."""

    def __init__(self, folder: Path) -> None:
        self.encoder = mm.load_encoder(folder)
        self.seen: list[str] = []
        original = self.encoder.encode

        def encode(inputs, *args, **kwargs):
            self.seen += list(inputs)
            return original(inputs, *args, **kwargs)

        self.encoder.encode = encode  # type: ignore[method-assign]


def _alone(folder: Path, texts: list[str]) -> torch.Tensor:
    """Each text embedded on its own by a fresh encoder: the reference rows."""
    enc = mm.load_encoder(folder)
    return torch.cat([enc.encode([t]) for t in texts])


def _run(folder: Path, counting: Counting, txt: Path, out: Path) -> tuple[list[str], str]:
    log = io.StringIO()
    counting.seen.clear()
    embed(counting.encoder, txt, out, batch_size=2, stream=log, model_name=str(folder))
    return list(counting.seen), log.getvalue()


@pytest.mark.parametrize("suffix", [".safetensors", ".npy"])
def test_edited_inserted_and_deleted_lines_are_recomputed_not_reused(tmp_path, folder, suffix):
    txt, out = tmp_path / "texts.txt", tmp_path / f"emb{suffix}"
    txt.write_text("\n".join(LINES) + "\n")
    counting = Counting(folder)
    seen, _ = _run(folder, counting, txt, out)
    assert sorted(seen) == sorted(LINES)

    # line 1 edited, a line inserted after line 3, line 5 ("a circle") deleted
    new = ["an edited line", LINES[1], LINES[2], "one more", LINES[3], LINES[5]]
    txt.write_text("\n".join(new) + "\n")
    seen, log = _run(folder, counting, txt, out)
    assert sorted(seen) == ["an edited line", "one more"]  # nothing else recomputed
    assert "resuming: 4 of 6 inputs reused" in log
    assert "2 to embed (changed or new)" in log
    assert "2 stored row(s) dropped" in log  # the old line 1 and "a circle"
    ids, emb, meta = read_embeddings(out)
    assert len(ids) == 6 and len(meta["hashes"]) == 6
    torch.testing.assert_close(emb, _alone(folder, new), atol=1e-5, rtol=1e-5)

    seen, log = _run(folder, counting, txt, out)  # unchanged: nothing to do
    assert seen == [] and "resuming: 6 of 6 inputs reused" in log


def test_a_file_without_hashes_is_not_trusted(tmp_path, folder):
    """An output of the older version (ids, no hashes) whose line 1 no longer matches: every
    row is embedded again, never the stale vector returned."""
    txt, out = tmp_path / "texts.txt", tmp_path / "emb.safetensors"
    txt.write_text("\n".join(LINES) + "\n")
    ids, emb = embed(str(folder), txt)
    _write(out, ids, torch.zeros_like(emb), {"model": str(folder), "skipped": []})
    counting = Counting(folder)
    seen, log = _run(folder, counting, txt, out)
    assert sorted(seen) == sorted(LINES)
    assert "records no content hashes" in log
    torch.testing.assert_close(read_embeddings(out)[1], _alone(folder, LINES), atol=1e-5,
                               rtol=1e-5)
