"""``multimodal chat``: one prompt, or a conversation with ``--interactive``, on a tiny random
GGUF chat model; replies equal ``mm.chat`` of the same conversation."""

from __future__ import annotations

import io

import pytest
import torch

from multimodal.cli.verbs import VERBS, run, usage


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The tiny GGUF chat model of ``tests/serve/conftest.py`` (a random 2-block Llama with a
    byte-level BPE and a ChatML template)."""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from tests.convert.test_gguf import Q, byte_level_bpe, llama, write_gguf

    tok = byte_level_bpe()
    model = llama(tok.get_vocab_size())
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers" in name and "norm" not in name:
                p.normal_(0, 0.2)
    return write_gguf(tmp_path_factory.mktemp("chat") / "chat.gguf", model, tok, qtype=Q.F32)


@pytest.fixture(scope="module")
def encoder(gguf):
    import multimodal as mm

    return mm.load_encoder(gguf)


def test_chat_is_a_verb_listed_by_help():
    assert "chat" in VERBS
    assert any(line.split()[:1] == ["chat"] for line in usage().splitlines())


def test_one_prompt_prints_mm_chats_reply(gguf, encoder, capsys):
    import multimodal as mm

    want = mm.chat(encoder, "In the beginning", max_new_tokens=12)
    assert run(["chat", "--model", str(gguf), "In the beginning", "--max_new_tokens", "12"]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_interactive_keeps_the_conversation(gguf, encoder, capsys, monkeypatch):
    import multimodal as mm

    monkeypatch.setattr("sys.stdin", io.StringIO("In the beginning\n\nhello\nquit\nnever read\n"))
    assert run(["chat", "--model", str(gguf), "--interactive", "--max_new_tokens", "8"]) == 0
    first = mm.chat(encoder, "In the beginning", max_new_tokens=8)
    second = mm.chat(encoder, [{"role": "user", "content": "In the beginning"},
                               {"role": "assistant", "content": first},
                               {"role": "user", "content": "hello"}], max_new_tokens=8)
    assert capsys.readouterr().out == f"{first}\n{second}\n"


@pytest.mark.parametrize(("args", "says"), [
    ([], "give one prompt, or --interactive"),
    (["hi", "--interactive"], "give one prompt, or --interactive"),
    (["hi", "--max_new_tokens", "0"], "must be >= 1"),
])
def test_mistakes_are_one_error_line(gguf, args, says, capsys):
    assert run(["chat", "--model", str(gguf), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]


def test_a_model_that_cannot_chat_is_refused(tmp_path, capsys):
    import multimodal as mm
    from multimodal.encoder import Encoder

    tok = mm.WordPieceTokenizer.train(["a cat sat", "a dog ran"] * 10, vocab_size=60)
    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=16, dim=16,
                                                depth=1, heads=2, mlp_dim=32))
    folder = Encoder(model, tok).save_pretrained(tmp_path / "enc")
    assert run(["chat", "--model", str(folder), "hi"]) == 2
    assert "is not a chat model" in capsys.readouterr().err
