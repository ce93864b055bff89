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
