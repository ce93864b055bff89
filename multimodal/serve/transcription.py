"""``POST /v1/audio/transcriptions``: OpenAI's speech-to-text API over a Whisper, with
dynamic batching.

Multipart form: ``file`` (a WAV / FLAC / OGG upload; required), ``model``, ``language``
(default: detected by a multilingual model), ``response_format`` (``json``: ``{"text"}``,
``text``: the text alone, ``verbose_json``: also ``language``, ``duration`` and one segment
per 30 s window). The API process reads the upload (an unreadable, empty, silent or
shorter than 0.1 s file is a 400 naming ``file``), averages its channels and resamples it
to 16 kHz; the worker cuts each clip into 30 s windows as :func:`multimodal.transcribe` does
and decodes the windows of every request in the batch together, greedily.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from multimodal.serve.errors import ApiError
from multimodal.serve.spec import CheckedRequestsAPI, QueueSpec

SAMPLE_RATE = 16000
FORMATS = ("json", "text", "verbose_json")


def read_upload(data: bytes, min_seconds: float = 0.1, silence: float = 1e-4) -> np.ndarray:
    """An uploaded audio file as a 16 kHz mono float32 waveform, or a 400 naming ``file``."""
    import soundfile as sf

    if not data:
        raise ApiError(400, "'file' is empty", "file", "invalid_audio")
    try:
        wave, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as err:  # soundfile raises its own LibsndfileError / RuntimeError
        raise ApiError(400, f"'file' is not readable audio: {err}", "file",
                       "invalid_audio") from None
    wave = wave.mean(axis=1)
    if rate != SAMPLE_RATE:
        import torch

        from multimodal.deps import require

        torchaudio = require("torchaudio")

        wave = torchaudio.functional.resample(torch.from_numpy(wave), rate,
                                              SAMPLE_RATE).numpy()
    seconds = wave.size / SAMPLE_RATE
    if seconds < min_seconds:
        raise ApiError(400, f"'file' is {seconds * 1000:.0f} ms of audio, need at least "
                       f"{min_seconds * 1000:.0f} ms", "file", "invalid_audio")
    if not np.isfinite(wave).all():
        raise ApiError(400, "'file' has NaN or infinite samples", "file", "invalid_audio")
    if float(np.abs(wave).max()) < silence:
        raise ApiError(400, "'file' is silent: nothing to transcribe", "file",
                       "invalid_audio")
    return wave.astype(np.float32)


class TranscriptionSpec(QueueSpec):
    """Registers ``POST /v1/audio/transcriptions``; reads the upload in the API process."""

    def __init__(self, model_name: str) -> None:
        super().__init__("/v1/audio/transcriptions")
        self.model_name = model_name
        self.add_endpoint(self.api_path, self.transcriptions, ["POST"])

    async def transcriptions(self, request: Request) -> Response:
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise ApiError(400, "send the audio as multipart/form-data with a 'file' field",
                           "file", "invalid_request")
        try:
            form = await request.form()
        except ApiError:
            raise
        except Exception as err:
            raise ApiError(400, f"unreadable multipart form: {err}", None,
                           "invalid_request") from None
        upload = form.get("file")
        if upload is None:
            raise ApiError(400, "missing required field 'file' (the audio upload)", "file",
                           "missing_field")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "'file' must be a file upload, not a text field", "file",
                           "invalid_type")
        fmt = form.get("response_format") or "json"
        if fmt not in FORMATS:
            raise ApiError(400, f"'response_format' must be one of {', '.join(FORMATS)}, got "
                           f"{fmt!r}", "response_format", "invalid_value")
        language = form.get("language") or None
        wave = read_upload(await upload.read())
        text, segments, detected = await self.submit({"wave": wave, "language": language})
        if fmt == "text":
            return PlainTextResponse(text)
        if fmt == "json":
            return JSONResponse({"text": text})
        return JSONResponse({"task": "transcribe", "language": detected,
                             "duration": wave.size / SAMPLE_RATE, "text": text,
                             "segments": segments})


class TranscriptionAPI(CheckedRequestsAPI):
    """The inference worker: the 30 s windows of a batch of requests decoded together."""

    def __init__(self, path: str, spec: TranscriptionSpec, *, max_batch_size: int = 8,
                 batch_timeout: float = 0.01) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout,
                         spec=spec)
        self.path = path

    def setup(self, device: str) -> None:
        from multimodal.pipelines._loaders import served

        model, self.tokenizer = served(self.path, "transcribe")
        self.model = model.to(device).eval()
        enc = self.model.config.encoder
        self.window = int(enc.max_frames) * round(enc.sample_rate * enc.hop_ms / 1000)

    def _decode(self, windows: list[Any], language: str | None) -> tuple[list[str], list]:
        from multimodal.pipelines.transcribe import prompt_languages as _prompt_languages

        feats = self.model.features(windows)
        ids = self.model.generate(feats, language=language, task="transcribe")
        texts = [self.tokenizer.decode(t).strip() for t in self.model.text_tokens(ids)]
        return texts, _prompt_languages(self.model, ids)

    def transcribe(self, jobs: list[dict[str, Any]]) -> list[tuple[str, list, str | None]]:
        """(text, segments, language) per job."""
        import torch

        out: list[Any] = [None] * len(jobs)
        by_language: dict[str | None, list[int]] = {}
        for i, job in enumerate(jobs):
            by_language.setdefault(job["language"], []).append(i)
        with torch.no_grad():
            for language, members in by_language.items():
                pieces = [(i, s, torch.from_numpy(jobs[i]["wave"][s:s + self.window]))
                          for i in members
                          for s in range(0, jobs[i]["wave"].size, self.window)]
                texts, langs = self._decode([w for _, _, w in pieces], language)
                for i in members:
                    own = [(s, w, t, lang) for (j, s, w), t, lang
                           in zip(pieces, texts, langs, strict=True) if j == i]
                    segments = [{"id": k, "start": s / SAMPLE_RATE,
                                 "end": (s + w.numel()) / SAMPLE_RATE, "text": t}
                                for k, (s, w, t, _) in enumerate(own)]
                    text = " ".join(t for _, _, t, _ in own if t)
                    out[i] = (text, segments, language or own[0][3])
        return out

    def predict(self, x: Any, **kwargs: Any) -> Any:
        if isinstance(x, dict):  # max_batch_size 1
            return self.transcribe([x])[0]
        return self.transcribe(x)

    def encode_response(self, output: Any, **kwargs: Any) -> Any:
        return output
