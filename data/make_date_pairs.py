"""The small example of own text pairs shipped in ``data/examples/dates/``: dates written
the ways people write them, to ISO 8601 (``"the 3rd of March 2021" -> "2021-03-03"``).

    python data/make_date_pairs.py data/examples/dates
        -> OUT/train.tsv (3000 pairs), OUT/val.tsv (200), OUT/test.tsv (300): a header line
           ``source<TAB>target``, then one pair per line. The dates of val and test never
           occur in train (any wording), so a model must read, not remember.

Deterministic (seeded); ``tests/data/test_text_pairs.py`` checks the shipped files equal
what this writes. ``configs/seq2seq_pairs.yaml`` trains on them.
"""

from __future__ import annotations

import datetime as dt
import random
import sys
from pathlib import Path

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
SIZES = {"train": 3000, "val": 200, "test": 300}


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def wordings(d: dt.date) -> list[str]:
    """Ways to write ``d`` (English, British and American orders, abbreviations)."""
    month, short = MONTHS[d.month - 1], MONTHS[d.month - 1][:3]
    return [
        f"{d.day} {month} {d.year}",
        f"{month} {d.day}, {d.year}",
        f"the {ordinal(d.day)} of {month} {d.year}",
        f"{short} {d.day} {d.year}",
        f"{d.day:02d}/{d.month:02d}/{d.year}",
        f"{ordinal(d.day)} {short}. {d.year}",
    ]


def date_pairs(seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Split -> ``(wording, ISO date)`` pairs; the dates of the splits are disjoint."""
    rng = random.Random(seed)
    first, days = dt.date(1950, 1, 1), (dt.date(2049, 12, 31) - dt.date(1950, 1, 1)).days
    total = sum(SIZES.values())
    offsets = rng.sample(range(days + 1), total)
    out, start = {}, 0
    for split, n in SIZES.items():
        dates = [first + dt.timedelta(days=o) for o in offsets[start: start + n]]
        start += n
        out[split] = [(rng.choice(wordings(d)), d.isoformat()) for d in dates]
    return out


def write(out: Path, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in date_pairs(seed).items():
        lines = ["source\ttarget", *(f"{s}\t{t}" for s, t in pairs)]
        (out / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "data/examples/dates"))
