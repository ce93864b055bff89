#!/usr/bin/env bash
# Real recorded speech (Debian klettres-data: letters and syllables spoken in ~20 languages)
# as class-per-subfolder audio trees DEST/klettres/{language,letters}; see
# data/make_klettres_folder.py. Not part of `get.sh all`: it needs the Debian package.
# Usage: bash data/get_klettres.sh [DEST]   (default: data/cache next to this script)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$here/cache}"
python="${PYTHON:-python}"
src=/usr/share/klettres
if [[ ! -d "$src" ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
        apt-get install -y klettres-data || { apt-get update && apt-get install -y klettres-data; }
    else
        echo "klettres-data is not installed: sudo apt-get install klettres-data" >&2
        exit 1
    fi
fi
cd "$here/.."
"$python" data/make_klettres_folder.py "$src" "$dest/klettres"
