"""Procedural scenes of coloured shapes with known truth, for compositional captioning.

A scene holds 1 to ``max_shapes`` shapes; each has a kind (circle, square, ...), a colour,
a size (small / large) and a centre. Captions come from a small grammar::

    object   := "a" SIZE COLOUR SHAPE                      e.g. "a small red circle"
    caption  := object
              | object REL object                          (REL relates object 1 to object 2)
              | object REL object "which is" REL object    (REL 1: objects 1-2, REL 2: objects 2-3)
    REL      := "left of" | "right of" | "above" | "below"

Relation of A to B, with image rows growing downwards and (dx, dy) = (x_B - x_A, y_B - y_A)::

    |dx| >= |dy|:  "left of" if dx > 0 else "right of"
    |dy| >  |dx|:  "above"   if dy > 0 else "below"

Scenes are only accepted when every pair is unambiguous: the dominant displacement is at
least ``relation_margin`` times the other one, and the shapes' boxes do not overlap.

Compositional split: the (colour, shape) pairs in ``SceneConfig.holdout`` never appear in
"train" or "val" scenes, and every "test" scene contains at least one of them. Every colour
and every shape still appears in training (checked), so test measures whether a model
composes attributes it has seen separately.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch

SPLITS = ("train", "val", "test")
RELATIONS = ("left of", "right of", "above", "below")
SIZES = ("small", "large")

#: RGB values of the colour names a scene may use.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 235),
    "yellow": (240, 215, 40),
    "purple": (160, 60, 200),
    "cyan": (40, 210, 220),
    "orange": (245, 140, 20),
    "white": (245, 245, 245),
}

#: Shape kinds a scene may draw. All fit inside the box [-r, r]^2 around their centre.
SHAPES = ("circle", "square", "triangle", "diamond", "cross", "star")


@dataclass
class SceneConfig:
    """How scenes are sampled and drawn.

    Radii are fractions of ``image_size``; a shape of radius r fits in a 2r x 2r box.
    ``order`` is the order in which a caption names the shapes: "random" (one of the
    valid descriptions, drawn per scene) or "left_to_right" (sorted by centre x).
    ``antialias`` is the number of sub-samples per pixel side (1: hard edges).
    """

    image_size: int = 32
    min_shapes: int = 1
    max_shapes: int = 3
    shapes: tuple[str, ...] = ("circle", "square", "triangle", "cross")
    colours: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "cyan")
    holdout: tuple[tuple[str, str], ...] = (
        ("green", "triangle"),
        ("red", "square"),
        ("blue", "circle"),
        ("yellow", "cross"),
    )
    small_radius: float = 0.1
    large_radius: float = 0.18
    background: tuple[int, int, int] = (0, 0, 0)
    relation_margin: float = 1.5
    gap: float = 1.0
    order: str = "random"
    antialias: int = 4
    max_tries: int = 200

    def __post_init__(self) -> None:
        self.shapes = tuple(self.shapes)
        self.colours = tuple(self.colours)
        self.holdout = tuple((str(c), str(s)) for c, s in self.holdout)
        self.background = tuple(int(v) for v in self.background)  # type: ignore[assignment]
        self.validate()

    def validate(self) -> None:
        """Raise ValueError when the config cannot produce the promised splits."""
        if self.image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {self.image_size}")
        if not 1 <= self.min_shapes <= self.max_shapes <= 3:
            raise ValueError(
                "need 1 <= min_shapes <= max_shapes <= 3 (the grammar covers up to 3 shapes), "
                f"got min_shapes={self.min_shapes}, max_shapes={self.max_shapes}"
            )
        bad = [s for s in self.shapes if s not in SHAPES]
        if bad or not self.shapes:
            raise ValueError(f"shapes must be a non-empty subset of {SHAPES}, got {self.shapes}")
        bad = [c for c in self.colours if c not in PALETTE]
        if bad or not self.colours:
            raise ValueError(
                f"colours must be a non-empty subset of {tuple(PALETTE)}, got {self.colours}"
            )
        for pair in self.holdout:
            if pair[0] not in self.colours or pair[1] not in self.shapes:
                raise ValueError(
                    f"held-out pair {pair} is not a (colour, shape) of this config "
                    f"(colours {self.colours}, shapes {self.shapes})"
                )
        train = set(self.train_pairs())
        if len(train) < self.max_shapes:
            raise ValueError(
                f"need at least max_shapes={self.max_shapes} training (colour, shape) pairs, "
                f"got {len(train)}"
            )
        for colour in self.colours:
            if not any(c == colour for c, _ in train):
                raise ValueError(f"holdout removes every shape of colour {colour!r} from training")
        for shape in self.shapes:
            if not any(s == shape for _, s in train):
                raise ValueError(f"holdout removes every colour of shape {shape!r} from training")
        if self.order not in ("random", "left_to_right"):
            raise ValueError(f"order must be 'random' or 'left_to_right', got {self.order!r}")
        if not 0 < self.small_radius < self.large_radius <= 0.25:
            raise ValueError(
                "need 0 < small_radius < large_radius <= 0.25 (fractions of image_size), got "
                f"{self.small_radius}, {self.large_radius}"
            )
        if self.antialias < 1:
            raise ValueError(f"antialias must be >= 1, got {self.antialias}")
        if self.relation_margin < 1:
            raise ValueError(f"relation_margin must be >= 1, got {self.relation_margin}")

    def all_pairs(self) -> list[tuple[str, str]]:
        return [(c, s) for c in self.colours for s in self.shapes]

    def train_pairs(self) -> list[tuple[str, str]]:
        """(colour, shape) pairs allowed in "train" and "val" scenes."""
        held = set(self.holdout)
        return [p for p in self.all_pairs() if p not in held]

    def radius(self, size: str) -> float:
        """Radius in pixels of a shape of the given size."""
        frac = self.small_radius if size == "small" else self.large_radius
        return frac * self.image_size


@dataclass(frozen=True)
class SceneShape:
    """One drawn shape; (x, y) is its centre in pixels (x: column, y: row, origin top-left)."""

    shape: str
    colour: str
    size: str
    x: float
    y: float
    radius: float

    def phrase(self) -> str:
        return f"a {self.size} {self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """Shapes in the order the caption names them."""

    shapes: tuple[SceneShape, ...]
    image_size: int

    @property
    def caption(self) -> str:
        return describe(self)


@dataclass(frozen=True)
class ParsedCaption:
    """Objects as (size, colour, shape) and relations between consecutive objects."""

    objects: tuple[tuple[str, str, str], ...]
    relations: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- relations


def relation(a: SceneShape, b: SceneShape) -> str:
    """Relation of ``a`` to ``b``: "left of", "right of", "above" or "below" (see module doc)."""
    dx, dy = b.x - a.x, b.y - a.y
    if abs(dx) >= abs(dy):
        return "left of" if dx > 0 else "right of"
    return "above" if dy > 0 else "below"


def _clear_of(x: np.ndarray, y: np.ndarray, r: float, other: SceneShape, margin: float,
              gap: float) -> np.ndarray:
    """For candidate centres (x, y) of radius r: the boxes do not overlap ``other`` and the
    relation is clear (dominant shift >= margin * the other shift)."""
    dx, dy = np.abs(x - other.x), np.abs(y - other.y)
    reach = r + other.radius + gap
    apart = (dx >= reach) | (dy >= reach)
    return apart & (np.maximum(dx, dy) >= margin * np.minimum(dx, dy))


# --------------------------------------------------------------------------- captions


def describe(scene: Scene) -> str:
    """Caption of a scene by the grammar in the module docstring."""
    parts = [scene.shapes[0].phrase()]
    for i in range(1, len(scene.shapes)):
        rel = relation(scene.shapes[i - 1], scene.shapes[i])
        joiner = f"{rel} " if i == 1 else f"which is {rel} "
        parts.append(joiner + scene.shapes[i].phrase())
    return " ".join(parts)


_WORD = r"[a-z]+"
_OBJ = rf"a ({_WORD}) ({_WORD}) ({_WORD})"
_REL = r"(left of|right of|above|below)"
_CAPTION = re.compile(rf"^{_OBJ}(?: {_REL} {_OBJ}(?: which is {_REL} {_OBJ})?)?$")


def parse_caption(caption: str) -> ParsedCaption:
    """Inverse of :func:`describe`; ValueError when the text is not in the grammar."""
    match = _CAPTION.match(caption.strip().lower())
    if match is None:
        raise ValueError(f"caption is not in the scene grammar: {caption!r}")
    g = match.groups()
    objects = [tuple(g[0:3])]
    relations = []
    if g[3] is not None:
        relations.append(g[3])
        objects.append(tuple(g[4:7]))
    if g[7] is not None:
        relations.append(g[7])
        objects.append(tuple(g[8:11]))
    for size, colour, shape in objects:
        if size not in SIZES or colour not in PALETTE or shape not in SHAPES:
            raise ValueError(f"unknown size/colour/shape {(size, colour, shape)} in {caption!r}")
    return ParsedCaption(tuple(objects), tuple(relations))  # type: ignore[arg-type]


def caption_matches_scene(caption: str, scene: Scene) -> bool:
    """True when ``caption`` is grammatical, names exactly the scene's shapes (any order)
    and every stated relation holds. Useful to score generated captions: a scene has
    several correct descriptions when the shape order is free."""
    try:
        parsed = parse_caption(caption)
    except ValueError:
        return False
    by_key = {(s.size, s.colour, s.shape): s for s in scene.shapes}
    if len(by_key) != len(scene.shapes) or sorted(parsed.objects) != sorted(by_key):
        return False
    shapes = [by_key[o] for o in parsed.objects]
    return all(
        relation(shapes[i], shapes[i + 1]) == rel for i, rel in enumerate(parsed.relations)
    )


# --------------------------------------------------------------------------- sampling


def _rng(seed: int, split: str) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return np.random.default_rng([int(seed), SPLITS.index(split)])


def _place(rng: np.random.Generator, kinds: list[tuple[str, str, str]],
           config: SceneConfig) -> list[SceneShape] | None:
    """Centres at pixel centres, inside the image, pairwise clear; None if no fit found.
    Each shape takes the first clear one of ``max_tries`` candidate centres."""
    n = config.image_size
    placed: list[SceneShape] = []
    for colour, shape, size in kinds:
        r = config.radius(size)
        lo, hi = math.ceil(r - 0.5), math.floor(n - r - 0.5)
        xy = rng.integers(lo, hi + 1, size=(2, config.max_tries)) + 0.5
        ok = np.ones(config.max_tries, dtype=bool)
        for other in placed:
            ok &= _clear_of(xy[0], xy[1], r, other, config.relation_margin, config.gap)
        if not ok.any():
            return None
        i = int(np.argmax(ok))
        placed.append(SceneShape(shape, colour, size, float(xy[0, i]), float(xy[1, i]), r))
    return placed


def sample_scene(rng: np.random.Generator, config: SceneConfig, split: str) -> Scene:
    """One scene of the given split (see the module doc for what each split allows)."""
    allowed = config.all_pairs() if split == "test" else config.train_pairs()
    for _ in range(config.max_tries):
        k = int(rng.integers(config.min_shapes, config.max_shapes + 1))
        picks = rng.choice(len(allowed), size=k, replace=False)
        pairs = [allowed[i] for i in picks]
        if split == "test" and not any(p in config.holdout for p in pairs):
            pairs[int(rng.integers(k))] = config.holdout[int(rng.integers(len(config.holdout)))]
            if len(set(pairs)) != k:
                continue
        kinds = [(c, s, SIZES[int(rng.integers(2))]) for c, s in pairs]
        placed = _place(rng, kinds, config)
        if placed is None:
            continue
        if config.order == "left_to_right":
            placed.sort(key=lambda s: (s.x, s.y))
        return Scene(tuple(placed), config.image_size)
    raise ValueError(
        f"could not place {config.max_shapes} shapes in a {config.image_size}px image after "
        f"{config.max_tries} tries; use smaller radii or a larger image_size"
    )


def sample_scenes(n: int, config: SceneConfig | None = None, split: str = "train",
                  seed: int = 0) -> list[Scene]:
    """``n`` scenes, a deterministic function of (config, split, seed)."""
    config = config or SceneConfig()
    if config.holdout == () and split == "test":
        raise ValueError("split 'test' needs at least one held-out (colour, shape) pair")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = _rng(seed, split)
    return [sample_scene(rng, config, split) for _ in range(n)]


# --------------------------------------------------------------------------- rendering


def _polygon(kind: str) -> np.ndarray | None:
    """Unit-radius polygon (V, 2) as (x, y) with y down, or None for the circle."""
    if kind == "square":
        s = 0.8
        return np.array([[-s, -s], [s, -s], [s, s], [-s, s]])
    if kind == "triangle":
        return np.array([[0.0, -1.0], [1.0, 0.8], [-1.0, 0.8]])
    if kind == "diamond":
        return np.array([[0.0, -1.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    if kind == "cross":
        w = 0.33
        return np.array([[-w, -1], [w, -1], [w, -w], [1, -w], [1, w], [w, w], [w, 1], [-w, 1],
                         [-w, w], [-1, w], [-1, -w], [-w, -w]], dtype=float)
    if kind == "star":
        angles = -np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
        return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    return None


def _inside(kind: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean mask of points (u, v), in units of the radius around the centre."""
    if kind == "circle":
        return u * u + v * v <= 1.0
    poly = _polygon(kind)
    if poly is None:
        raise ValueError(f"unknown shape {kind!r}; expected one of {SHAPES}")
    # even-odd rule: count edges crossed by a ray from the point towards +u
    inside = np.zeros(u.shape, dtype=bool)
    for (x0, y0), (x1, y1) in zip(poly, np.roll(poly, -1, axis=0), strict=True):
        straddles = (y0 > v) != (y1 > v)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_cross = x0 + (v - y0) * (x1 - x0) / (y1 - y0)
        inside ^= straddles & (u < x_cross)
    return inside


@functools.lru_cache(maxsize=256)
def _patch(kind: str, fx: float, fy: float, radius: float, ss: int) -> np.ndarray:
    """Coverage of the (2h+1)^2 pixels around the pixel holding the centre, h = ceil(r) + 1,
    for a centre at fraction (fx, fy) of that pixel. Snapped centres all share one patch."""
    h = math.ceil(radius) + 1
    offsets = (np.arange(ss) + 0.5) / ss
    grid = (np.arange(-h, h + 1)[:, None] + offsets).reshape(-1)
    u = (grid[None, :] - fx) / radius
    v = (grid[:, None] - fy) / radius
    mask = _inside(kind, *np.broadcast_arrays(u, v)).astype(float)
    patch = mask.reshape(2 * h + 1, ss, 2 * h + 1, ss).mean(axis=(1, 3))
    patch.setflags(write=False)
    return patch


def coverage(shape: SceneShape, image_size: int, antialias: int = 4) -> np.ndarray:
    """Fraction of each pixel covered by the shape, (H, W) float in [0, 1], from
    ``antialias``^2 sub-samples per pixel (pixel (i, j) spans [j, j+1] x [i, i+1])."""
    n = image_size
    col, row = math.floor(shape.x), math.floor(shape.y)
    patch = _patch(shape.shape, shape.x - col, shape.y - row, shape.radius, antialias)
    h = patch.shape[0] // 2
    alpha = np.zeros((n, n))
    r0, r1 = max(row - h, 0), min(row + h + 1, n)
    c0, c1 = max(col - h, 0), min(col + h + 1, n)
    alpha[r0:r1, c0:c1] = patch[r0 - row + h:r1 - row + h, c0 - col + h:c1 - col + h]
    return alpha


def render_scene(scene: Scene, config: SceneConfig | None = None) -> np.ndarray:
    """RGB uint8 image (3, H, W): background, then each shape composited with its coverage
    alpha: ``img = img * (1 - a) + colour * a``."""
    config = config or SceneConfig(image_size=scene.image_size)
    n = scene.image_size
    img = np.empty((3, n, n))
    img[:] = np.asarray(config.background, dtype=float)[:, None, None]
    for shape in scene.shapes:
        a = coverage(shape, n, config.antialias)
        colour = np.asarray(PALETTE[shape.colour], dtype=float)[:, None, None]
        img = img * (1 - a) + colour * a
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def generate_scenes(n: int, config: SceneConfig | None = None, split: str = "train",
                    seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """``n`` scenes of ``split`` as (images uint8 tensor (N, 3, H, W), captions)."""
    config = config or SceneConfig()
    scenes = sample_scenes(n, config, split, seed)
    return render_scenes(scenes, config), [describe(s) for s in scenes]


def render_scenes(scenes: list[Scene], config: SceneConfig | None = None) -> torch.Tensor:
    """Images of ``scenes`` as one uint8 tensor (N, 3, H, W)."""
    size = scenes[0].image_size if scenes else (config or SceneConfig()).image_size
    images = np.zeros((len(scenes), 3, size, size), dtype=np.uint8)
    for i, scene in enumerate(scenes):
        images[i] = render_scene(scene, config)
    return torch.from_numpy(images)
