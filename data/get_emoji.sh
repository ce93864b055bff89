#!/usr/bin/env bash
# Fetch the Twitter emoji pictures and their names for the captioning task.
#
# Source: the npm package `emoji-datasource-twitter`, fetched with the ordinary
# npm client (`npm pack`), unpacked into data/cache/emoji/package/:
#   package/emoji.json                      names, short names, categories
#   package/img/twitter/64/<unified>.png    64x64 RGBA pictures
#
# Idempotent: does nothing when the package is already unpacked.
# Usage: bash data/get_emoji.sh [DEST_DIR]   (default: data/cache/emoji next to this script)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$here/cache/emoji}"
pkg="emoji-datasource-twitter"

if [[ -f "$dest/package/emoji.json" && -d "$dest/package/img/twitter/64" ]]; then
    echo "emoji data already present in $dest/package"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    echo "error: npm is needed to fetch $pkg (e.g. apt-get install npm)" >&2
    exit 1
fi

mkdir -p "$dest"
cd "$dest"
tarball="$(ls -1 "$pkg"-*.tgz 2>/dev/null | tail -n 1 || true)"
if [[ -z "$tarball" ]]; then
    tarball="$(npm pack "$pkg" --silent | tail -n 1)"
fi
echo "unpacking $tarball into $dest/package"
rm -rf package.tmp package
mkdir package.tmp
tar -xzf "$tarball" -C package.tmp
mv package.tmp/package package
rmdir package.tmp
n="$(ls -1 package/img/twitter/64 | wc -l)"
echo "done: $n pictures in $dest/package/img/twitter/64"
