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


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "chat"}, "messages"),
    ({"model": "chat", "messages": "hi"}, "messages"),
    ({"model": "chat", "messages": QUESTION, "temperature": "hot"}, "temperature"),
])
def test_bad_chat_request_is_400_naming_the_field(server, want, body, param):
    reply = server.post("/v1/chat/completions", body)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == param
    ok = server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 12,
                                              "temperature": 0})
    assert ok.json()["choices"][0]["message"]["content"] == want


def test_openai_client_streams_the_reply(server, want):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    stream = client.chat.completions.create(model="chat", messages=QUESTION, max_tokens=12,
                                            temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == want


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
    from multimodal.serve.models import load_served

    served = load_served(tiny_chat, "chat", quantize="int4")
    assert any(isinstance(m, QuantizedLinear) for m in served.model.backbone.modules())
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
    from multimodal.serve.models import load_served
    from multimodal.serve.server import ServeConfig, _apis

    for kind in ("transcribe", "classify"):
        with pytest.raises(ValueError, match=f"applies to embedding and chat models; m is a "
                                             f"{kind} model"):
            _apis(ServeConfig(model="m", quantize="int8"), kind)
        with pytest.raises(ValueError, match="--compile applies"):
            _apis(ServeConfig(model="m", compile=True), kind)
    with pytest.raises(ValueError, match="dynamic-int8 applies to encoders"):
        load_served("m.gguf", "chat", quantize="dynamic-int8")
