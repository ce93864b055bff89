#!/usr/bin/env bash
# Make the text-to-speech set offline (issue 21): short phrases of the King James Bible and
# of plain-prose fortunes, and isolated words, read by ~100 espeak-ng / flite voices
# (voices split as the spoken words split them), then the phoneme tokenizer, the fitted
# log-mel RVQ codec and the token cache.
#
#   -> data/cache/tts/{manifest.csv, wav/<voice>/NNN_<phrase|word>.wav,
#                      phonemes.json, codec.safetensors, codec.json, tokens.safetensors}
#
# Needs the text and audio groups (bible-kjv, fortunes, espeak-ng, flite): installs them
# with data/get_text.sh / data/get_audio.sh when missing. ~3 000 utterances, a few minutes
# on 2 cores. Idempotent: each step runs only when its output is missing or stale.
# Usage: bash data/get_tts.sh [--workers N] [--fit-clips N]
#        (PYTHON=path/to/python picks the interpreter; default: the repository's .venv, else python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

command -v bible >/dev/null 2>&1 && compgen -G "/usr/share/games/fortunes/*" >/dev/null \
    || bash "$here/get_text.sh"
command -v espeak-ng >/dev/null 2>&1 && command -v flite >/dev/null 2>&1 \
    || PYTHON="$PYTHON" bash "$here/get_audio.sh"

cd "$repo"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m multimodal.cli.datasets tts "$@"
