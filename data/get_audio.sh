#!/usr/bin/env bash
# Make the audio classification datasets available offline, and say where they are.
#
#   spoken_words  Debian packages espeak-ng + flite (speech synthesisers)
#                 -> data/cache/spoken_words/{manifest.csv,wav/<voice>/<word>_s<speed>_p<pitch>.wav}
#                    (20 words x ~100 voices x 3 takes, made by `python -m multimodal.cli.datasets spoken-words`)
#   sonic_pi      Debian package sonic-pi-samples -> /usr/share/sonic-pi/samples/*.flac
#
# Idempotent: installs only missing packages (apt-get update runs only if a plain install
# fails) and synthesises only missing clips.
# Usage: bash data/get_audio.sh [extra args for python -m multimodal.cli.datasets spoken-words]
#        (PYTHON=path/to/python picks the interpreter; default: the repository's .venv, else python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

missing=()
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
command -v flite >/dev/null 2>&1 || missing+=(flite)
compgen -G "/usr/share/sonic-pi/samples/*.flac" >/dev/null || missing+=(sonic-pi-samples)

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "espeak-ng, flite and sonic-pi-samples already installed"
elif command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian packages: ${missing[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; then
        as_root apt-get update
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    fi
else
    echo "error: no apt-get here; install ${missing[*]} with your package manager" >&2
    exit 1
fi

cd "$repo"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m multimodal.cli.datasets spoken-words "$@"
