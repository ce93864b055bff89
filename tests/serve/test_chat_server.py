"""``multimodal serve`` on a tiny random GGUF chat model: /v1/chat/completions, plain and
streamed, against ``mm.chat`` offline (greedy)."""

from __future__ import annotations

import json

import pytest

from tests.serve.running import Server

QUESTION = [{"role": "user", "content": "In the beginning"}]


@pytest.fixture(scope="module")
def server(tiny_chat):
    srv = Server(tiny_chat)
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def want(tiny_chat):
    import multimodal as mm

    reply = mm.chat(mm.load_encoder(tiny_chat), QUESTION, max_new_tokens=12)
    assert reply  # the random model says something
    return reply


def test_chat_completion_equals_mm_chat(server, want):
    reply = server.post("/v1/chat/completions", {"model": "chat", "messages": QUESTION,
                                                 "max_tokens": 12, "temperature": 0})
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["choices"][0]["message"]["content"] == want
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] <= 12
    assert server.get("/v1/models").json()["data"][0]["endpoints"] == ["/v1/chat/completions"]


def test_streamed_chunks_add_up_to_the_same_reply(server, want):
    reply = server.post("/v1/chat/completions", {"model": "chat", "messages": QUESTION,
                                                 "max_tokens": 12, "temperature": 0,
                                                 "stream": True})
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in reply.body.decode().splitlines()
              if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == want
    assert len(chunks) > 2  # sent piece by piece, not as one block


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": "chat"}, "messages", "missing_field"),
    ({"model": "chat", "messages": "hi"}, "messages", "invalid_type"),
    ({"model": "chat", "messages": QUESTION, "temperature": "hot"}, "temperature",
     "invalid_type"),
    ({"model": "chat", "messages": QUESTION, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"model": "chat", "messages": []}, "messages", "invalid_value"),
    ({"messages": [{"role": "user", "content": "word " * 200}]}, "messages",  # > 128 tokens
     "context_length_exceeded"),
])
def test_bad_chat_request_is_400_naming_the_field(server, want, body, param, code):
    """Each refusal has the field in ``param`` and its kind in ``code`` (docs/serve.md's
    table: a missing ``messages`` is ``missing_field``)."""
    reply = server.post("/v1/chat/completions", body)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == param
    assert reply.json()["error"]["code"] == code
    ok = server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 12,
                                              "temperature": 0})
    assert ok.json()["choices"][0]["message"]["content"] == want


def test_openai_client_streams_the_reply(server, want):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    stream = client.chat.completions.create(model="chat", messages=QUESTION, max_tokens=12,
                                            temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == want


@pytest.fixture(scope="module")
def reply_tokens(tiny_chat):
    """How many tokens the greedy reply to QUESTION takes, its end-of-turn token included,
    decoded offline (the model's own ``generate``)."""
    import torch

    import multimodal as mm

    enc = mm.load_encoder(tiny_chat)
    tok = enc.tokenizer
    ids = tok.encode_many([tok.apply_chat_template(QUESTION, add_generation_prompt=True)],
                          truncation=False)[0]
    out = enc.backbone.generate(torch.tensor([ids]), max_new_tokens=40,
                                eos_token_id=tok.eos_token_id)[0, len(ids):].tolist()
    assert out[-1] == tok.eos_token_id and len(out) >= 2  # the model ends its turn itself
    return len(out)


@pytest.mark.parametrize("stream", [False, True])
def test_finish_reason_is_length_when_cut_at_max_tokens_and_stop_at_end_of_turn(
        server, reply_tokens, stream):
    """OpenAI's rule, through its client: ``max_tokens`` one short of the reply (whose last
    token ends the turn) is ``"length"``; exactly the reply's length, ``"stop"``. ``model``
    echoes the request's, or the served name (the file's name) when it names none."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    for limit, reason in ((reply_tokens - 1, "length"), (reply_tokens, "stop")):
        got = client.chat.completions.create(model="mine", messages=QUESTION, max_tokens=limit,
                                             temperature=0, stream=stream)
        if stream:
            chunks = list(got)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices]
            assert finish[-1] == reason and set(finish[:-1]) == {None}
            assert {c.model for c in chunks} == {"mine"}
        else:
            assert got.choices[0].finish_reason == reason
            assert got.model == "mine"
            assert got.usage.completion_tokens == (limit if reason == "length" else limit - 1)
    unnamed = server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2,
                                                   "temperature": 0, "stream": stream})
    assert '"model": "chat.gguf"' in unnamed.body.decode().replace('":"', '": "')


def test_openai_client_sees_the_code_of_a_refusal(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="chat", messages=QUESTION, max_tokens=0)
    assert err.value.code == "invalid_value"
    assert err.value.param == "max_tokens"


def _offline_int4(tiny_chat):
    import multimodal as mm

    enc = mm.load_encoder(tiny_chat, quantize="int4")
    reply = mm.chat(enc, QUESTION, max_new_tokens=12)
    assert reply
    return reply


@pytest.mark.parametrize("compile", [
    False, pytest.param(True, marks=pytest.mark.slow)])
def test_quantize_and_compile_reach_the_chat_decoder(tiny_chat, compile):
    """``serve --quantize int4`` serves the packed decoder (replies of the int4 model, not
    the float one it used to ignore the switch for); ``--compile`` the compiled step, with the
    same replies, streamed too."""
    from multimodal.nn.quantized import QuantizedLinear
    from multimodal.pipelines._loaders import served

    encoder, _ = served(tiny_chat, "chat", quantize="int4")
    assert any(isinstance(m, QuantizedLinear) for m in encoder.backbone.modules())
    want = _offline_int4(tiny_chat)
    args = ["--quantize", "int4", *(["--compile"] if compile else [])]
    srv = Server(tiny_chat, *args)
    try:
        for _ in range(2):  # the second turn reuses the compiled step
            reply = srv.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 12,
                                                      "temperature": 0}, timeout=300)
            assert reply.status == 200, reply.body
            assert reply.json()["choices"][0]["message"]["content"] == want
    finally:
        assert srv.stop() == 0, srv.output()


def test_switches_a_kind_cannot_use_are_refused_in_one_line():
    from multimodal.pipelines._loaders import served
    from multimodal.serve.server import ServeConfig, _apis

    for kind in ("transcribe", "classify"):
        with pytest.raises(ValueError, match=f"applies to embedding and chat models; m is a "
                                             f"{kind} model"):
            _apis(ServeConfig(model="m", quantize="int8"), kind)
        with pytest.raises(ValueError, match="--compile applies"):
            _apis(ServeConfig(model="m", compile=True), kind)
    with pytest.raises(ValueError, match="dynamic-int8 applies to encoders"):
        served("m.gguf", "chat", quantize="dynamic-int8")
