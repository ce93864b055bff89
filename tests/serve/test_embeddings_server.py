"""``multimodal serve`` on a tiny random-weight encoder: /v1/embeddings against
``Encoder.encode`` offline, dynamic batching, and every refused request (a 4xx JSON error
naming the field, the server serving on)."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.serve.conftest import TEXTS
from tests.serve.running import Server

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tiny_encoder):
    srv = Server(tiny_encoder, "--max_batch_size", "8", "--batch_timeout_ms", "100",
                 "--api_key", KEY, "--max_request_mb", "0.01", "--max_inputs", "16")
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def offline(tiny_encoder):
    import multimodal as mm

    return mm.load_encoder(tiny_encoder)


def embed(server, body, **kw):
    return server.post("/v1/embeddings", body, headers=AUTH, **kw)


def rows(reply) -> np.ndarray:
    data = reply.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def assert_serving(server, offline):
    reply = embed(server, {"input": TEXTS[0], "model": "tiny"})
    assert reply.status == 200, reply.body
    np.testing.assert_allclose(rows(reply), offline.encode([TEXTS[0]]).numpy(), atol=1e-5)


def test_health_and_models_are_open_and_name_the_model(server):
    assert server.get("/health").status == 200  # no key needed for a load balancer
    models = server.get("/v1/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["endpoints"] == ["/v1/embeddings"]  # a text encoder: no zero-shot
    assert models["object"] == "list"


def test_embeddings_equal_encode_offline(server, offline):
    reply = embed(server, {"input": TEXTS, "model": "tiny"})
    assert reply.status == 200, reply.body
    got = rows(reply)
    want = offline.encode(TEXTS).numpy()
    assert got.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(got, want, atol=1e-5)
    usage = reply.json()["usage"]
    counts = [len(ids) for ids in offline.tokenizer.encode_many(TEXTS, add_cls=True,
                                                                add_sep=True)]
    assert usage["prompt_tokens"] == usage["total_tokens"] == sum(counts)


def test_base64_is_little_endian_float32_of_the_same_vector(server, offline):
    reply = embed(server, {"input": [TEXTS[1]], "encoding_format": "base64"})
    assert reply.status == 200
    raw = base64.b64decode(reply.json()["data"][0]["embedding"])
    got = np.frombuffer(raw, dtype="<f4")
    np.testing.assert_allclose(got, offline.encode([TEXTS[1]])[0].numpy(), atol=1e-5)


def test_concurrent_requests_share_a_batch_and_match_each_text_alone(server, offline):
    """Eight requests at once (texts of different lengths, so batched rows are padded):
    each text's served embedding equals the text encoded alone offline."""
    bodies = [{"input": TEXTS[i % len(TEXTS)] + " the cat" * (i % 3)} for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda b: embed(server, b), bodies))
    assert all(r.status == 200 for r in replies), [r.body for r in replies]
    assert max(int(r.headers["x-batch-requests"]) for r in replies) > 1
    for body, reply in zip(bodies, replies, strict=True):
        alone = offline.encode([body["input"]]).numpy()
        np.testing.assert_allclose(rows(reply), alone, atol=1e-5)


@pytest.mark.parametrize(("body", "status", "param"), [
    ('{"input": ["the cat"', 400, None),                       # malformed JSON
    ("", 400, None),                                           # no body
    ('["the cat"]', 400, None),                                # not an object
    ({"model": "tiny"}, 400, "input"),                         # missing field
    ({"input": 7}, 400, "input"),                              # wrong type
    ({"input": ["a cat", 3]}, 400, "input[1]"),                # wrong type inside
    ({"input": []}, 400, "input"),                             # empty
    ({"input": ["a"] * 17}, 400, "input"),                     # over --max_inputs
    ({"input": "a cat", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": "a cat", "model": 3}, 400, "model"),
    ({"input": "a cat", "dimensions": 8}, 400, "dimensions"),
    ({"input": ["a cat", "the cat " * 12]}, 400, "input[1]"),  # over the 16-token context
    ({"input": ""}, 400, "input[0]"),                          # an empty string
    ({"input": ["a cat", ""]}, 400, "input[1]"),
])
def test_bad_request_is_a_4xx_naming_the_field_and_the_server_serves_on(
        server, offline, body, status, param):
    reply = embed(server, body)
    assert reply.status == status, reply.body
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["message"]
    assert error["code"]  # every refusal names its kind, as OpenAI's do
    assert_serving(server, offline)


def test_too_long_text_is_cut_to_the_context_when_asked(server, offline):
    text = "the cat " * 12
    reply = embed(server, {"input": [text], "truncate": True})
    assert reply.status == 200
    np.testing.assert_allclose(rows(reply), offline.encode([text]).numpy(), atol=1e-5)
    assert reply.json()["usage"]["prompt_tokens"] == 16


def test_payload_over_max_request_mb_is_413(server, offline):
    reply = embed(server, {"input": ["the cat"] * 2000})  # ~22 KB > 0.01 MB
    assert reply.status == 413
    assert reply.json()["error"]["code"] == "payload_too_large"
    assert_serving(server, offline)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY}])
def test_missing_or_wrong_api_key_is_401(server, offline, headers):
    reply = server.post("/v1/embeddings", {"input": "a cat"}, headers=headers)
    assert reply.status == 401
    assert reply.json()["error"]["type"] == "authentication_error"
    assert server.get("/v1/models", headers=headers).status == 401
    assert_serving(server, offline)


def test_openai_client_reads_the_embeddings(server, offline):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY)
    got = client.embeddings.create(model="tiny", input=TEXTS[:2])  # base64 by default
    vectors = torch.tensor([d.embedding for d in got.data])
    torch.testing.assert_close(vectors, offline.encode(TEXTS[:2]), atol=1e-5, rtol=0)


def test_openai_client_sees_openais_refusals(server, offline):
    """Through the ``openai`` client: an empty string and a text over the context are 400s
    with their ``code`` (unless ``truncate``, TEI's rule), a body over ``--max_request_mb``
    a 413; ``model`` echoes the request's name."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY,
                           max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="tiny", input="")
    assert (err.value.code, err.value.param) == ("invalid_value", "input[0]")
    long = "the cat " * 12  # 24 words + 2 specials > the 16-token context
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="tiny", input=[long])
    assert err.value.code == "input_too_long"
    cut = client.embeddings.create(model="mine", input=[long], extra_body={"truncate": True})
    assert cut.model == "mine"
    torch.testing.assert_close(torch.tensor(cut.data[0].embedding), offline.encode([long])[0],
                               atol=1e-5, rtol=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.embeddings.create(model="tiny", input=["the cat"] * 2000)  # > 0.01 MB
    assert err.value.status_code == 413
    assert err.value.code == "payload_too_large"


def test_a_client_that_disconnects_mid_request_does_not_stall_the_others(server, offline):
    import json
    import socket

    body = json.dumps({"input": TEXTS}).encode()
    for _ in range(3):  # sent, then gone before the answer
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nAuthorization: Bearer " + KEY.encode()
                      + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda t: embed(server, {"input": t}), TEXTS[:4]))
    for text, reply in zip(TEXTS, replies, strict=False):
        assert reply.status == 200
        np.testing.assert_allclose(rows(reply), offline.encode([text]).numpy(), atol=1e-5)
