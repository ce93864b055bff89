"""``python -m multimodal.cli.datasets KIND``: make a built-in data set that is synthesised on
this machine (the ``data/get_*.sh`` scripts run it after installing the voices).

    python -m multimodal.cli.datasets spoken-words [--root data/cache/spoken_words]
        [--takes-per-word 3] [--seed 0] [--workers N] [--samples-dir DIR]
    python -m multimodal.cli.datasets tts [--root data/cache] [--fit-clips 800] [--workers N]

``spoken-words``: 20 words read by the espeak-ng / flite voices, cached, and a check of the
Sonic Pi samples (:func:`multimodal.data.sources.spoken_words.make_spoken_words`). ``tts``:
the TTS voices set, its phoneme tokenizer, codec and token cache
(:func:`multimodal.data.tts.make_tts_data`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from multimodal.data.sources.sonic_pi import SONIC_PI_DIR
    from multimodal.data.sources.spoken_words import DEFAULT_ROOT
    from multimodal.data.sources.tts_voices import DEFAULT_ROOT as TTS_ROOT

    parser = argparse.ArgumentParser(prog="python -m multimodal.cli.datasets",
                                     description="Make a built-in data set that is "
                                                 "synthesised on this machine.")
    kinds = parser.add_subparsers(dest="kind", required=True)
    words = kinds.add_parser("spoken-words", help="synthesise the spoken-words set (cached) "
                                                  "and check the Sonic Pi samples")
    words.add_argument("--root", default=str(DEFAULT_ROOT / "spoken_words"))
    words.add_argument("--takes-per-word", type=int, default=3)
    words.add_argument("--seed", type=int, default=0)
    words.add_argument("--workers", type=int, default=None)
    words.add_argument("--samples-dir", default=str(SONIC_PI_DIR))
    tts = kinds.add_parser("tts", help="make the TTS voices set, its phoneme tokenizer, "
                                       "codec and token cache")
    tts.add_argument("--root", default=str(TTS_ROOT.parent))
    tts.add_argument("--workers", type=int, default=None)
    tts.add_argument("--fit-clips", type=int, default=800)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.kind == "spoken-words":
        from multimodal.data.sources.spoken_words import make_spoken_words

        make_spoken_words(args.root, takes_per_word=args.takes_per_word, seed=args.seed,
                          workers=args.workers, samples_dir=args.samples_dir)
    else:
        from multimodal.data.tts import make_tts_data

        make_tts_data(args.root, fit_clips=args.fit_clips, workers=args.workers)


if __name__ == "__main__":
    main()
