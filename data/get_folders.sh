#!/usr/bin/env bash
# Own-data proofs: Fashion-MNIST and the Twitter emoji written out as class-per-subfolder
# PNG trees (DEST/fashion_mnist_png, DEST/emoji_png). Needs `get.sh images emoji` first.
# Usage: bash data/get_folders.sh [DEST]   (default: data/cache next to this script)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$here/cache}"
python="${PYTHON:-python}"
cd "$here/.."
"$python" data/make_image_folders.py fashion_mnist "$dest/fashion_mnist_png"
"$python" data/make_image_folders.py emoji "$dest/emoji_png"
