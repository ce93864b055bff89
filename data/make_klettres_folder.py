"""Real recorded speech as class-per-subfolder audio trees, from Debian's ``klettres-data``
(KLettres: letters and syllables spoken by native speakers, OGG, 16-128 kHz, mono/stereo).

Every recording is listed, with its name, in ``<lang>/sounds.xml``; there is one recording
per letter/syllable per language, so no language has more than one or two clips per letter.
What has enough clips per class is the language itself (one or two speakers each):

    python data/make_klettres_folder.py /usr/share/klettres data/cache/klettres
        -> OUT/language/<lang>/<alpha|syllab>_<name>.ogg: spoken-language (and speaker)
           identification; languages with >= 40 recordings, at most 100 each (evenly spaced
           over the sorted list, so no class dominates); en_GB is
           merged into en.
        -> OUT/letters/<A..Z>/<lang>.ogg: the Latin letters A-Z across the languages that
           spell them (one clip per language): the same letter said in another language.
        -> OUT/manifest.csv: path,label,language,name of every recording kept (language tree).

Idempotent: a tree whose marker OUT/.complete exists is left as it is. Files listed in a
sounds.xml but not installed (``id``, ``nn``) are skipped and counted.
"""

from __future__ import annotations

import csv
import shutil
import string
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

MIN_CLIPS, MAX_CLIPS = 40, 100


def read_sounds(src: Path) -> list[tuple[str, str, str, Path]]:
    """``(language, kind, name, file)`` of every installed recording of every sounds.xml."""
    rows, missing = [], 0
    for xml in sorted(src.glob("*/sounds.xml")):
        lang = xml.parent.name
        root = ET.parse(xml).getroot()
        for kind, tag in (("alpha", "alphabet"), ("syllab", "syllables")):
            for block in root.iter(tag):
                for sound in block.iter("sound"):
                    path = src / sound.attrib["file"]
                    if path.is_file():
                        rows.append((lang, kind, sound.attrib["name"], path))
                    else:
                        missing += 1
    print(f"{len(rows)} recordings listed and installed, {missing} listed but not installed")
    return rows


def safe(name: str) -> str:
    return "".join(c if c.isalnum() else f"U{ord(c):04X}" for c in name)


def build(src: Path, out: Path) -> None:
    rows = read_sounds(src)
    if not rows:
        raise SystemExit(f"no recordings under {src}: apt-get install klettres-data")
    seen: set[Path] = set()
    by_lang: dict[str, list[tuple[str, str, Path]]] = {}
    for lang, kind, name, path in rows:
        if path in seen:  # a file listed by two languages belongs to neither twice
            continue
        seen.add(path)
        by_lang.setdefault("en" if lang == "en_GB" else lang, []).append((kind, name, path))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    kept = []
    for lang, items in sorted(by_lang.items()):
        if len(items) < MIN_CLIPS:
            print(f"  {lang}: {len(items)} recordings, fewer than {MIN_CLIPS}: left out")
            continue
        items = sorted(items, key=lambda t: str(t[2]))
        if len(items) > MAX_CLIPS:  # MAX_CLIPS evenly spaced over the sorted list
            items = [items[i * len(items) // MAX_CLIPS] for i in range(MAX_CLIPS)]
        for kind, name, path in items:
            recorded_as = path.parent.parent.name
            dest = tmp / "language" / lang / f"{recorded_as}_{kind}_{safe(name)}{path.suffix}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            kept.append((dest.relative_to(tmp), lang, path.parent.parent.name, name))
    with open(tmp / "manifest.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "recorded_as", "name"])
        writer.writerows([str(p), lang, rec, name] for p, lang, rec, name in kept)
    letters = 0
    for lang, kind, name, path in rows:
        if kind == "alpha" and name.upper() in string.ascii_uppercase and len(name) == 1:
            dest = tmp / "letters" / name.upper() / f"{lang}{path.suffix}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            letters += 1
    classes = sorted(p.name for p in (tmp / "language").iterdir())
    print(f"language tree: {len(kept)} recordings in {len(classes)} classes {classes}")
    print(f"letters tree: {letters} recordings of A-Z")
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python data/make_klettres_folder.py SRC OUT")
    src, out = Path(argv[0]), Path(argv[1])
    if (out / ".complete").is_file():
        print(f"{out} exists")
        return
    build(src, out)


if __name__ == "__main__":
    main(sys.argv[1:])
