"""Twitter emoji pictures with their Unicode names, as an image-captioning source.

Local copy made by ``bash data/get_emoji.sh`` (the npm package ``emoji-datasource-twitter``,
unpacked into ``data/cache/emoji/package/``)::

    package/emoji.json                     list of {name, unified, image, category, ...}
    package/img/twitter/64/<image>.png     64x64 RGBA pictures (<image> = lower-case unified)

Only the base emoji are used: skin-tone variants live under ``skin_variations`` of their
base entry and are skipped (they repeat the base caption with another skin colour), as is
the "Component" category (bare skin-tone swatches and hair pieces) by default.

Captions are built from the lower-cased name: "RED APPLE" -> "an emoji of a red apple",
"GRINNING FACE WITH SMILING EYES" -> "an emoji of a grinning face with smiling eyes",
"EYES" -> "an emoji of eyes", "Andorra Flag" -> "an emoji of the flag of andorra".
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from multimodal.data.splits import check_sizes, split_size
from multimodal.files import read_image

DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "data" / "cache" / "emoji"
IMAGE_DIR = Path("img") / "twitter" / "64"
GET_DATA = "bash data/get_emoji.sh"
SPLITS = ("train", "val", "test")

# Last words that end in "s" but are singular (or names that take no article anyway).
_SINGULAR_S = {"bus", "minibus", "trolleybus", "octopus", "cactus", "hibiscus", "lotus",
               "abacus", "compass", "dress", "princess", "kiss", "cross", "glass", "hourglass",
               "christmas", "claus", "sos", "vs", "rhinoceros", "hippopotamus", "wireless",
               "fleur-de-lis", "aries", "taurus", "scorpius", "sagittarius", "aquarius",
               "ophiuchus", "pisces", "biceps", "leftwards",
               "rightwards", "upwards", "downwards"}
# Words starting with a vowel letter but a consonant sound ("a unicorn"), and vice versa.
_A_BEFORE = ("uni", "use", "usb", "u.s.", "one", "eu", "ufo", "ewe")
_AN_BEFORE = ("hour", "honey", "8", "11", "18")
_PLURAL = {"people", "men", "women", "children"}
_BREAKS = {"with", "in", "of", "and", "on", "over", "under", "without", "for", "facing", "from",
           "at", ","}


@dataclass(frozen=True)
class EmojiRecord:
    """One emoji: its name, caption, category and picture file."""

    name: str
    caption: str
    category: str
    subcategory: str
    unified: str
    path: Path


def find_package_dir(root: str | Path | None = None) -> Path:
    """The unpacked package directory (holding emoji.json) under ``root``.

    ``root`` may be the cache directory (containing ``package/``) or the package itself.
    """
    root = Path(root) if root is not None else DEFAULT_ROOT
    for candidate in (root / "package", root):
        if (candidate / "emoji.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"emoji data not found: expected {root / 'package' / 'emoji.json'} "
        f"(or {root / 'emoji.json'}). Get it with `{GET_DATA}`."
    )


def normalise_name(name: str) -> str:
    """Lower-case name, '&' spelled out, "X: bald" -> "bald X", "X: Y" -> "X with Y"
    ("MAN: RED HAIR" -> "man with red hair"), single spaces."""
    text = name.lower().replace("&", "and").replace("\u2019", "'")
    head, sep, tail = text.partition(":")
    if sep:
        tail = tail.strip()
        text = f"{tail} {head}" if tail == "bald" else f"{head} with {tail}"
    return re.sub(r"\s+", " ", text).strip()


def _head_noun(phrase: str) -> str:
    """Last word before the first preposition / conjunction / comma / "-ing" word: the noun
    that decides the article ("face" in "face with rolling eyes", "person lifting weights")."""
    words = phrase.replace(",", " , ").split()
    for i, word in enumerate(words):
        if i > 0 and (word in _BREAKS or (word.endswith("ing") and words[-1] != "cards")):
            return words[i - 1]
    return words[-1]


def _article(phrase: str) -> str:
    last = _head_noun(phrase)
    plural = last in _PLURAL or (last.endswith("s") and not last.endswith(("ss", "us", "is"))
                                 and last not in _SINGULAR_S)
    if plural:
        return ""
    if phrase.startswith(_A_BEFORE):
        return "a "
    if phrase.startswith(_AN_BEFORE) or phrase[0] in "aeiou":
        return "an "
    return "a "


def emoji_caption(name: str, category: str = "") -> str:
    """Caption from an emoji's name (see the module doc for examples).

    Country flags (category "Flags", name "<Country> Flag" in title case) become
    "the flag of <country>"; plural names take no article; others take "a" / "an".
    """
    if not name or not name.strip():
        raise ValueError(f"emoji name must be non-empty, got {name!r}")
    phrase = normalise_name(name)
    if category == "Flags" and not name.isupper() and phrase.endswith(" flag"):
        return f"an emoji of the flag of {phrase[: -len(' flag')]}"
    return f"an emoji of {_article(phrase)}{phrase}"


def load_emoji_records(
    root: str | Path | None = None,
    skip_categories: Sequence[str] = ("Component",),
) -> list[EmojiRecord]:
    """Base emoji that have a Twitter picture, in the package's sort order.

    Entries without ``has_img_twitter`` or without the PNG file are skipped, and so are
    later entries whose caption repeats an earlier one (so a caption never spans splits).
    """
    package = find_package_dir(root)
    with open(package / "emoji.json", encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list):
        raise ValueError(f"{package / 'emoji.json'} should hold a list of emoji entries, "
                         f"got {type(entries).__name__}")
    image_dir = package / IMAGE_DIR
    if not image_dir.is_dir():
        raise FileNotFoundError(f"emoji pictures not found: expected {image_dir}. "
                                f"Get them with `{GET_DATA}`.")
    available = {p.name for p in image_dir.iterdir()}
    entries = sorted(entries, key=lambda e: e.get("sort_order", 0))
    records: list[EmojiRecord] = []
    seen: set[str] = set()
    for entry in entries:
        if not entry.get("has_img_twitter") or entry.get("category") in skip_categories:
            continue
        file = entry.get("image") or f"{entry['unified'].lower()}.png"
        if file not in available or not entry.get("name"):
            continue
        caption = emoji_caption(entry["name"], entry.get("category", ""))
        if caption in seen:
            continue
        seen.add(caption)
        records.append(EmojiRecord(
            name=entry["name"], caption=caption, category=entry.get("category", ""),
            subcategory=entry.get("subcategory", ""), unified=entry["unified"],
            path=image_dir / file,
        ))
    if not records:
        raise FileNotFoundError(f"no emoji with a Twitter picture found under {package}. "
                                f"Get the data with `{GET_DATA}`.")
    return records


def split_emoji(records: Sequence[EmojiRecord], val_size: float = 0.1,
                test_size: float = 0.1, seed: int = 0) -> dict[str, list[EmojiRecord]]:
    """Random split by emoji, deterministic under ``seed``; each split keeps sort order.

    Sizes (:func:`~multimodal.data.splits.split_size`): n_test = round(test_size * N) for a
    fraction, the count itself for a whole count; n_val likewise; the rest train.
    """
    check_sizes(val_size, test_size)
    n = len(records)
    order = np.random.default_rng(seed).permutation(n)
    n_test, n_val = split_size(test_size, n, "test_size"), split_size(val_size, n, "val_size")
    parts = {"test": order[:n_test], "val": order[n_test:n_test + n_val],
             "train": order[n_test + n_val:]}
    return {name: [records[i] for i in sorted(idx)] for name, idx in parts.items()}


def read_emoji_image(path: str | Path, image_size: int = 64) -> torch.Tensor:
    """RGB uint8 (3, S, S): RGBA composited on white, ``rgb * a + 255 * (1 - a)``, then
    resized (bilinear, antialiased) when S differs from the file's size."""
    if image_size < 1:
        raise ValueError(f"image_size must be positive, got {image_size}")
    rgba = read_image(path, 4).float()
    alpha = rgba[3:] / 255.0
    rgb = rgba[:3] * alpha + 255.0 * (1.0 - alpha)
    if rgb.shape[-2:] != (image_size, image_size):
        rgb = F.interpolate(rgb[None], size=(image_size, image_size), mode="bilinear",
                            antialias=True, align_corners=False)[0]
    return rgb.round().clamp(0, 255).to(torch.uint8)


def load_emoji_images(records: Sequence[EmojiRecord], image_size: int = 64) -> torch.Tensor:
    """Pictures of ``records`` as uint8 (N, 3, S, S)."""
    out = torch.empty(len(records), 3, image_size, image_size, dtype=torch.uint8)
    for i, record in enumerate(records):
        out[i] = read_emoji_image(record.path, image_size)
    return out


def load_emoji(root: str | Path | None = None, image_size: int = 64, val_size: float = 0.1,
               test_size: float = 0.1, seed: int = 0
               ) -> dict[str, tuple[torch.Tensor, list[str], list[EmojiRecord]]]:
    """All splits as {split: (images uint8 (N, 3, S, S), captions, records)}."""
    splits = split_emoji(load_emoji_records(root), val_size, test_size, seed)
    return {name: (load_emoji_images(recs, image_size), [r.caption for r in recs], recs)
            for name, recs in splits.items()}
