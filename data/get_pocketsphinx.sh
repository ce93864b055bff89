#!/usr/bin/env bash
# Real recorded English speech with reference transcripts (Debian pocketsphinx-testdata:
# five LibriVox clips and five "cards" clips, 16 kHz) for benchmarks/asr_real.py and the
# slow Whisper tests. Files stay where Debian puts them: /usr/share/pocketsphinx/test/data.
# Part of `get.sh all`, so that CI runs the real-speech slow tests instead of skipping them.
set -euo pipefail
src=/usr/share/pocketsphinx/test/data
if [[ ! -d "$src/librivox" ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
        apt-get install -y pocketsphinx-testdata \
            || { apt-get update && apt-get install -y pocketsphinx-testdata; }
    else
        echo "pocketsphinx-testdata is not installed: sudo apt-get install pocketsphinx-testdata" >&2
        exit 1
    fi
fi
echo "pocketsphinx test clips: $(ls "$src"/librivox/*.wav "$src"/cards/*.wav | wc -l) in $src"
