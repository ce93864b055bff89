"""``multimodal serve`` on a tiny random Whisper (a CTranslate2 directory, as
tests/test_asr.py writes it): /v1/audio/transcriptions against ``mm.transcribe`` offline,
and refused uploads."""

from __future__ import annotations

import io
import uuid

import numpy as np
import pytest
import soundfile as sf

from tests.serve.running import Server

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")


def tone(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * g.standard_normal(t.size)) \
        .astype(np.float32)


def wav_bytes(wave: np.ndarray, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format="WAV")
    return buf.getvalue()


def multipart(fields: dict[str, str], file: bytes | None) -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
             .encode() for k, v in fields.items()]
    if file is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                     'filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'.encode()
                     + file + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    from tests.models.test_whisper import hf_whisper, write_ct2

    return write_ct2(hf_whisper(), tmp_path_factory.mktemp("serve") / "whisper", "float32")


@pytest.fixture(scope="module")
def server(whisper_dir):
    srv = Server(whisper_dir, "--batch_timeout_ms", "50")
    yield srv
    assert srv.stop() == 0


def transcribe(server, fields, file):
    body, headers = multipart(fields, file)
    return server.post("/v1/audio/transcriptions", body, headers=headers)


def test_transcription_equals_mm_transcribe(server, whisper_dir, tmp_path):
    import multimodal as mm

    wave = tone(2.5)  # the tiny model reads 1 s windows: three segments
    sf.write(tmp_path / "a.wav", wave, 16000)
    want = mm.transcribe(str(whisper_dir), tmp_path / "a.wav", show_progress=False)[0]
    reply = transcribe(server, {"model": "whisper", "response_format": "verbose_json"},
                       wav_bytes(wave))
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["text"] == want.text
    assert body["duration"] == pytest.approx(2.5)
    assert [(s["start"], s["end"]) for s in body["segments"]] == [(0, 1), (1, 2), (2, 2.5)]
    assert " ".join(s["text"] for s in body["segments"] if s["text"]) == want.text
    plain = transcribe(server, {"response_format": "text"}, wav_bytes(wave))
    assert plain.body.decode() == want.text
    assert transcribe(server, {}, wav_bytes(wave)).json() == {"text": want.text}


@pytest.mark.parametrize(("fields", "file", "param"), [
    ({"model": "whisper"}, None, "file"),
    ({}, b"RIFF not really a wave file", "file"),
    ({}, wav_bytes(np.zeros(16000, dtype=np.float32)), "file"),   # silent
    ({}, wav_bytes(tone(0.05)), "file"),                          # too short
    ({"response_format": "srt"}, wav_bytes(tone(0.5)), "response_format"),
])
def test_bad_upload_is_400_naming_the_field(server, fields, file, param):
    reply = transcribe(server, fields, file)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == param
    assert transcribe(server, {}, wav_bytes(tone(0.5))).status == 200


def test_json_body_instead_of_a_form_is_400(server):
    reply = server.post("/v1/audio/transcriptions", {"file": "a.wav"})
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "file"
