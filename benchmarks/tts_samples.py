"""Write a few text-to-speech samples (and their reference voices) for docs/samples/tts/.

    python benchmarks/tts_samples.py --ckpt runs/tts_voices/version_0/checkpoints/last.ckpt \
        --out docs/samples/tts --texts "yes" "go" "stop" "the lord is my shepherd"

Each text is spoken in the voice of a held-out (test) voice of the TTS data set: the prompt
is the first second of one of that voice's phrases (``prompt_<voice>.wav``, also written).
``samples.json`` lists ``{"text", "voice", "wav", "prompt", "seconds"}`` for the notebook
``notebooks/08_text_to_speech.ipynb``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import soundfile as sf
import torch
from torchaudio.functional import resample

from multimodal.pipelines._loaders import tts
from multimodal.pipelines.speak import synthesize
from multimodal.tokenizers.audio import load_audio


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:30]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", default="docs/samples/tts")
    parser.add_argument("--texts", nargs="+", default=["yes", "go", "stop", "left"])
    parser.add_argument("--data", default="data/cache/tts", help="the TTS data folder")
    parser.add_argument("--voices", type=int, default=2, help="held-out voices to use")
    parser.add_argument("--prompt-seconds", type=float, default=1.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(data / "manifest.csv", newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["split"] == "test" and r["kind"] == "phrase"]
    voices = sorted({r["voice"] for r in rows})[:: max(1, len({r["voice"] for r in rows})
                                                       // max(args.voices, 1))][: args.voices]
    bundle = tts(args.ckpt)  # read once: the bundle synthesize picks from mm.load
    listing = []
    for v, voice in enumerate(voices):
        row = next(r for r in rows if r["voice"] == voice and float(r["seconds"]) >= 1.2)
        wave, rate = load_audio(data / row["path"])
        wave = resample(wave.mean(0), rate, bundle.codec.sample_rate)
        rate = bundle.codec.sample_rate
        prompt = wave[: int(args.prompt_seconds * rate)]
        prompt_file = out / f"prompt_{_slug(voice)}.wav"
        sf.write(prompt_file, prompt.numpy(), rate)
        for i, text in enumerate(args.texts):
            if i % len(voices) != v:  # each text once, the voices taking turns
                continue
            audio, rate = synthesize(bundle, text, prompt, rate, temperature=args.temperature,
                                     top_k=args.top_k, seed=args.seed)
            file = out / f"{_slug(text)}_{_slug(voice)}.wav"
            sf.write(file, audio.numpy(), rate)
            listing.append({"text": text, "voice": voice, "wav": file.name,
                            "prompt": prompt_file.name, "prompt_text": row["text"],
                            "seconds": round(audio.numel() / rate, 3)})
            print(f"{file}: {text!r} in the voice of {voice} ({listing[-1]['seconds']} s)")
    (out / "samples.json").write_text(json.dumps(listing, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
