"""Captioning data: procedural scenes, the emoji reader and the caption DataModule."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import write_png

from multimodal.data.captions import CaptionDataModule, channel_stats
from multimodal.data.sources.emoji import (
    DEFAULT_ROOT,
    emoji_caption,
    find_package_dir,
    load_emoji_records,
    read_emoji_image,
    split_emoji,
)
from multimodal.data.sources.scenes import (
    PALETTE,
    SHAPES,
    Scene,
    SceneConfig,
    SceneShape,
    caption_matches_scene,
    coverage,
    describe,
    generate_scenes,
    parse_caption,
    relation,
    render_scene,
    sample_scenes,
)

torch.set_num_threads(1)

ALL_SHAPES = SceneConfig(image_size=48, shapes=SHAPES)


# --------------------------------------------------------------------------- scenes


@pytest.mark.parametrize("config", [SceneConfig(), ALL_SHAPES], ids=["default32", "all48"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_centre_pixel_has_shape_colour(config: SceneConfig, split: str) -> None:
    scenes = sample_scenes(60, config, split, seed=3)
    for scene in scenes:
        img = render_scene(scene, config)
        assert img.dtype == np.uint8 and img.shape == (3, config.image_size, config.image_size)
        for s in scene.shapes:
            row, col = math.floor(s.y), math.floor(s.x)
            assert tuple(img[:, row, col]) == PALETTE[s.colour], (scene, s)
        assert tuple(img[:, 0, 0]) in {config.background, *(PALETTE[s.colour]
                                                            for s in scene.shapes)}


@pytest.mark.parametrize(("kind", "area"), [
    ("circle", math.pi), ("square", 1.6 ** 2), ("triangle", 0.5 * 2.0 * 1.8), ("diamond", 2.0),
    ("cross", 2 * (2 * 0.66) - 0.66 ** 2),
])
def test_rendered_area_matches_geometry(kind: str, area: float) -> None:
    # area of the unit-radius shape times r^2, from sub-pixel coverage
    r = 12.0
    shape = SceneShape(kind, "red", "large", 32.5, 32.5, r)
    covered = coverage(shape, 64, antialias=8).sum()
    assert covered == pytest.approx(area * r * r, rel=0.01)


def test_single_shape_render_exact_pixels() -> None:
    # square of half-side 0.8 r = 4 px at centre (16, 16): pixels 12..19 fully red
    config = SceneConfig(antialias=1)
    scene = Scene((SceneShape("square", "blue", "large", 16.0, 16.0, 5.0),), 32)
    img = render_scene(scene, config)
    mask = (img == np.array(PALETTE["blue"], dtype=np.uint8)[:, None, None]).all(0)
    expected = np.zeros((32, 32), dtype=bool)
    expected[12:20, 12:20] = True
    np.testing.assert_array_equal(mask, expected)
    assert describe(scene) == "a large blue square"


@pytest.mark.parametrize("config", [SceneConfig(), ALL_SHAPES], ids=["default32", "all48"])
def test_caption_grammar_matches_drawn_shapes(config: SceneConfig) -> None:
    scenes = sample_scenes(80, config, "train", seed=1)
    lengths = set()
    areas: dict[tuple[str, str], list[float]] = defaultdict(list)
    for scene in scenes:
        parsed = parse_caption(describe(scene))
        assert list(parsed.objects) == [(s.size, s.colour, s.shape) for s in scene.shapes]
        assert len(parsed.relations) == len(scene.shapes) - 1
        lengths.add(len(scene.shapes))
        # the image holds exactly the named colours besides the background
        img = render_scene(scene, config)
        present = {c for c, rgb in PALETTE.items()
                   if (img == np.array(rgb, dtype=np.uint8)[:, None, None]).all(0).any()}
        assert present == {s.colour for s in scene.shapes}
        for s in scene.shapes:
            areas[(s.shape, s.size)].append(coverage(s, config.image_size).sum())
    assert lengths == {1, 2, 3}
    # "large" shapes are drawn bigger than every "small" shape of the same kind
    for kind in config.shapes:
        if areas[(kind, "large")] and areas[(kind, "small")]:
            assert min(areas[(kind, "large")]) > 2 * max(areas[(kind, "small")])


def test_caption_examples_and_parse_errors() -> None:
    a = SceneShape("circle", "red", "small", 5.5, 10.5, 3.0)
    b = SceneShape("square", "blue", "large", 20.5, 12.5, 5.0)
    c = SceneShape("triangle", "green", "small", 21.5, 27.5, 3.0)
    assert describe(Scene((a,), 32)) == "a small red circle"
    assert describe(Scene((a, b), 32)) == "a small red circle left of a large blue square"
    assert describe(Scene((b, a, c), 32)) == (
        "a large blue square right of a small red circle which is above a small green triangle")
    for bad in ["a red circle", "a small red circle near a large blue square", "",
                "a small pink circle", "a small red circle left of"]:
        with pytest.raises(ValueError, match=r"grammar|unknown"):
            parse_caption(bad)


def test_relations_follow_definition() -> None:
    centre = SceneShape("circle", "red", "small", 16.0, 16.0, 3.0)
    cases = {(26.0, 18.0): "left of", (6.0, 14.0): "right of", (17.0, 28.0): "above",
             (15.0, 4.0): "below"}
    for (x, y), rel in cases.items():
        other = SceneShape("square", "blue", "small", x, y, 3.0)
        assert relation(centre, other) == rel
        inverse = {"left of": "right of", "right of": "left of", "above": "below",
                   "below": "above"}[rel]
        assert relation(other, centre) == inverse


def test_relations_consistent_with_pixel_centroids() -> None:
    # two shapes of distinct colours: the relation read off the drawn pixels agrees
    config = SceneConfig(min_shapes=2, max_shapes=2)
    checked = 0
    for scene in sample_scenes(80, config, "train", seed=7):
        a, b = scene.shapes
        if a.colour == b.colour:
            continue
        img = render_scene(scene, config)
        cents = []
        for s in (a, b):
            ys, xs = np.nonzero((img == np.array(PALETTE[s.colour], np.uint8)[:, None, None])
                                .all(0))
            cents.append(SceneShape(s.shape, s.colour, s.size, xs.mean() + 0.5,
                                    ys.mean() + 0.5, s.radius))
        dx, dy = cents[1].x - cents[0].x, cents[1].y - cents[0].y
        expected = (("left of" if dx > 0 else "right of") if abs(dx) >= abs(dy)
                    else ("above" if dy > 0 else "below"))
        assert parse_caption(describe(scene)).relations == (expected,)
        # unambiguous: the dominant displacement is clearly larger
        assert max(abs(dx), abs(dy)) > 1.2 * min(abs(dx), abs(dy))
        checked += 1
    assert checked > 40


def test_caption_matches_scene_scores_alternative_orders() -> None:
    a = SceneShape("circle", "red", "small", 5.5, 10.5, 3.0)
    b = SceneShape("square", "blue", "large", 20.5, 12.5, 5.0)
    scene = Scene((a, b), 32)
    assert caption_matches_scene("a small red circle left of a large blue square", scene)
    assert caption_matches_scene("a large blue square right of a small red circle", scene)
    assert not caption_matches_scene("a large blue square left of a small red circle", scene)
    assert not caption_matches_scene("a small red circle left of a small blue square", scene)
    assert not caption_matches_scene("a small red circle", scene)
    assert not caption_matches_scene("gibberish", scene)


def test_holdout_pairs_only_in_test() -> None:
    config = SceneConfig()
    held = set(config.holdout)

    def pairs(captions: list[str]) -> list[set[tuple[str, str]]]:
        return [{(c, s) for _, c, s in parse_caption(t).objects} for t in captions]

    train = pairs(generate_scenes(600, config, "train", seed=0)[1])
    val = pairs(generate_scenes(200, config, "val", seed=0)[1])
    test = pairs(generate_scenes(200, config, "test", seed=0)[1])
    assert all(not (p & held) for p in train + val)
    assert all(p & held for p in test)
    seen_train = set().union(*train)
    assert {c for c, _ in seen_train} == set(config.colours)
    assert {s for _, s in seen_train} == set(config.shapes)
    assert held <= set().union(*test)  # every held-out pair is tested


def test_config_rejects_holdout_hiding_a_colour_or_shape() -> None:
    with pytest.raises(ValueError, match="colour 'red'"):
        SceneConfig(shapes=("circle", "square"), holdout=(("red", "circle"), ("red", "square")))
    with pytest.raises(ValueError, match="shape 'circle'"):
        SceneConfig(colours=("red", "blue"), holdout=(("red", "circle"), ("blue", "circle")))
    with pytest.raises(ValueError, match="not a"):
        SceneConfig(holdout=(("pink", "circle"),))
    with pytest.raises(ValueError, match="split"):
        generate_scenes(2, SceneConfig(), "validation", 0)


def test_scenes_deterministic_under_seed() -> None:
    config = SceneConfig(image_size=24)
    x1, c1 = generate_scenes(40, config, "train", seed=5)
    x2, c2 = generate_scenes(40, config, "train", seed=5)
    x3, c3 = generate_scenes(40, config, "train", seed=6)
    x4, _ = generate_scenes(40, config, "val", seed=5)
    assert x1.dtype == torch.uint8 and x1.shape == (40, 3, 24, 24)
    assert torch.equal(x1, x2) and c1 == c2
    assert not torch.equal(x1, x3) and c1 != c3
    assert not torch.equal(x1, x4)


def test_left_to_right_order() -> None:
    config = SceneConfig(order="left_to_right")
    for scene in sample_scenes(50, config, "train", seed=2):
        xs = [s.x for s in scene.shapes]
        assert xs == sorted(xs)
        assert "right of" not in describe(scene)


# --------------------------------------------------------------------------- emoji


def _fake_package(root: Path, n_extra: int = 0) -> Path:
    """A tiny emoji-datasource-twitter layout: 2 real entries, one without a Twitter image,
    one Component entry, and ``n_extra`` filler entries."""
    img_dir = root / "package" / "img" / "twitter" / "64"
    img_dir.mkdir(parents=True)
    apple = torch.zeros(4, 64, 64, dtype=torch.uint8)  # transparent...
    apple[0, 16:48, 16:48] = 200  # ...with an opaque red square
    apple[3, 16:48, 16:48] = 255
    apple[1, 0, 0], apple[3, 0, 0] = 100, 128  # one half-transparent green pixel
    # torchvision writes only grey / RGB PNGs: the RGBA file goes through Pillow
    Image.fromarray(apple.permute(1, 2, 0).numpy(), mode="RGBA").save(img_dir / "1f34e.png")
    face = torch.full((3, 64, 64), 255, dtype=torch.uint8)
    face[2] = 0  # yellow, RGB file without alpha
    write_png(face, str(img_dir / "1f604.png"))
    entries = [
        {"name": "RED APPLE", "unified": "1F34E", "image": "1f34e.png", "category":
         "Food & Drink", "subcategory": "food-fruit", "sort_order": 2, "has_img_twitter": True},
        {"name": "GRINNING FACE WITH SMILING EYES", "unified": "1F604", "image": "1f604.png",
         "category": "Smileys & Emotion", "subcategory": "face-smiling", "sort_order": 1,
         "has_img_twitter": True,
         "skin_variations": {"1F3FB": {"unified": "1F604-1F3FB", "image": "1f604-1f3fb.png"}}},
        {"name": "NO PICTURE", "unified": "1F000", "image": "1f000.png", "category": "Objects",
         "subcategory": "x", "sort_order": 3, "has_img_twitter": False},
        {"name": "EMOJI MODIFIER FITZPATRICK TYPE-3", "unified": "1F3FC", "image": "1f3fc.png",
         "category": "Component", "subcategory": "skin-tone", "sort_order": 4,
         "has_img_twitter": True},
    ]
    write_png(face, str(img_dir / "1f3fc.png"))
    for i in range(n_extra):
        code = f"{0x1F680 + i:X}"
        write_png(face, str(img_dir / f"{code.lower()}.png"))
        entries.append({"name": f"ROCKET {i}", "unified": code, "image": f"{code.lower()}.png",
                        "category": "Travel & Places", "subcategory": "transport",
                        "sort_order": 10 + i, "has_img_twitter": True})
    (root / "package" / "emoji.json").write_text(json.dumps(entries))
    return root


def test_emoji_reader_on_fake_package(tmp_path: Path) -> None:
    root = _fake_package(tmp_path)
    records = load_emoji_records(root)
    assert [r.caption for r in records] == [
        "an emoji of a grinning face with smiling eyes", "an emoji of a red apple"]
    assert [r.category for r in records] == ["Smileys & Emotion", "Food & Drink"]
    assert find_package_dir(root / "package") == root / "package"

    apple = read_emoji_image(records[1].path, 64)
    assert apple.dtype == torch.uint8 and apple.shape == (3, 64, 64)
    assert apple[:, 20, 20].tolist() == [200, 0, 0]  # opaque
    assert apple[:, 5, 5].tolist() == [255, 255, 255]  # transparent -> white
    a = 128 / 255  # half transparent: rgb * a + 255 * (1 - a)
    assert apple[:, 0, 0].tolist() == [round(255 * (1 - a)), round(100 * a + 255 * (1 - a)),
                                       round(255 * (1 - a))]
    face = read_emoji_image(records[0].path, 64)
    assert face[:, 10, 10].tolist() == [255, 255, 0]  # RGB file: opaque
    small = read_emoji_image(records[1].path, 32).float()
    assert small.shape == (3, 32, 32)
    # antialiased 2x reduction: a triangle filter over 4 input pixels; interior stays red
    assert small[:, 9:23, 9:23].mean(dim=(1, 2)).tolist() == pytest.approx([200, 0, 0], abs=0.5)
    assert small[0].mean().item() == pytest.approx(apple[0].float().mean().item(), abs=1.0)


def test_emoji_missing_data_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"get_emoji\.sh"):
        load_emoji_records(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match=r"get_emoji\.sh"):
        CaptionDataModule(dataset="emoji", root=str(tmp_path)).prepare_data()


@pytest.mark.parametrize(("name", "category", "caption"), [
    ("RED APPLE", "Food & Drink", "an emoji of a red apple"),
    ("GRINNING FACE WITH SMILING EYES", "Smileys & Emotion",
     "an emoji of a grinning face with smiling eyes"),
    ("EYES", "People & Body", "an emoji of eyes"),
    ("ELEPHANT", "Animals & Nature", "an emoji of an elephant"),
    ("UNICORN FACE", "Animals & Nature", "an emoji of a unicorn face"),
    ("HOURGLASS", "Travel & Places", "an emoji of an hourglass"),
    ("OCTOPUS", "Animals & Nature", "an emoji of an octopus"),
    ("PERSON LIFTING WEIGHTS", "People & Body", "an emoji of a person lifting weights"),
    ("MAN: RED HAIR", "People & Body", "an emoji of a man with red hair"),
    ("Antigua & Barbuda Flag", "Flags", "an emoji of the flag of antigua and barbuda"),
    ("PIRATE FLAG", "Flags", "an emoji of a pirate flag"),
])
def test_emoji_caption(name: str, category: str, caption: str) -> None:
    assert emoji_caption(name, category) == caption


def test_emoji_split_deterministic_and_disjoint(tmp_path: Path) -> None:
    records = load_emoji_records(_fake_package(tmp_path, n_extra=18))
    assert len(records) == 20
    s1 = split_emoji(records, 0.2, 0.1, seed=0)
    assert {k: len(v) for k, v in s1.items()} == {"train": 14, "val": 4, "test": 2}
    assert s1 == split_emoji(records, 0.2, 0.1, seed=0)
    assert s1 != split_emoji(records, 0.2, 0.1, seed=1)
    names = [r.unified for v in s1.values() for r in v]
    assert sorted(names) == sorted(r.unified for r in records)
    with pytest.raises(ValueError, match="fraction"):
        split_emoji(records, 0.6, 0.5)


@pytest.mark.skipif(not (DEFAULT_ROOT / "package" / "emoji.json").is_file(),
                    reason="real emoji data absent (bash data/get_emoji.sh)")
def test_real_emoji_package() -> None:
    records = load_emoji_records()
    assert len(records) > 1000
    assert all(r.caption.startswith("an emoji of ") and r.path.is_file() for r in records)
    assert len({r.caption for r in records}) == len(records)
    assert len({r.category for r in records}) >= 8
    apple = next(r for r in records if r.name == "RED APPLE")
    assert apple.caption == "an emoji of a red apple"
    img = read_emoji_image(apple.path, 32).float()
    assert img[0].mean() > img[1].mean() + 20  # mostly red / white, not green
    splits = split_emoji(records, seed=0)
    assert sum(len(v) for v in splits.values()) == len(records)


# --------------------------------------------------------------------------- DataModule


def test_datamodule_scenes_batches() -> None:
    dm = CaptionDataModule(dataset="scenes", image_size=32, num_train=96, num_val=20,
                           num_test=20, batch_size=16, seed=0)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"images", "captions"}
    assert batch["images"].shape == (16, 3, 32, 32) and batch["images"].dtype == torch.float32
    assert len(batch["captions"]) == 16 and all(isinstance(c, str) for c in batch["captions"])
    assert dm.in_channels == 3 and dm.image_size == 32
    assert len(dm.train_captions()) == 96
    # normalisation: training images have per-channel mean 0 and std 1
    full = torch.stack([dm.split_dataset("train")[i][0] for i in range(96)])
    torch.testing.assert_close(full.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(full.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3, rtol=0)
    raw = dm.raw_images("train")
    torch.testing.assert_close(dm.denormalize(full), raw.float() / 255, atol=1e-5, rtol=0)
    m, s = channel_stats(raw)
    torch.testing.assert_close(m, raw.float().div(255).mean(dim=(0, 2, 3)))
    assert s.shape == (3,)
    val = next(iter(dm.val_dataloader()))
    assert val["images"].shape == (16, 3, 32, 32)
    assert sum(len(b["captions"]) for b in dm.test_dataloader()) == 20


def test_datamodule_scene_options_reach_the_scenes() -> None:
    dm = CaptionDataModule(dataset="scenes", image_size=32, num_train=40, num_val=8,
                           num_test=8, min_shapes=2, max_shapes=3, order="left_to_right")
    for split in ("train", "val", "test"):
        scenes = dm.scenes(split)
        assert [describe(s) for s in scenes] == dm.captions(split)
        assert all(2 <= len(s.shapes) <= 3 for s in scenes)
        assert all([x.x for x in s.shapes] == sorted(x.x for x in s.shapes) for s in scenes)
        # the images are the scenes drawn: re-render and compare pixel for pixel
        config = dm.scene_config()
        assert torch.equal(dm.raw_images(split)[0], torch.from_numpy(
            render_scene(scenes[0], config)))
    with pytest.raises(ValueError, match="order"):
        CaptionDataModule(num_train=4, num_val=2, num_test=2, order="by_colour")


def test_datamodule_emoji_on_fake_package(tmp_path: Path) -> None:
    _fake_package(tmp_path, n_extra=8)
    dm = CaptionDataModule(dataset="emoji", image_size=16, batch_size=4, root=str(tmp_path),
                           val_size=0.2, test_size=0.2)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["images"].shape == (4, 3, 16, 16)
    assert all(c.startswith("an emoji of ") for c in batch["captions"])
    assert {k: len(dm.captions(k)) for k in ("train", "val", "test")} == {
        "train": 6, "val": 2, "test": 2}
    assert len(dm.metadata["train"]) == 6


def test_datamodule_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dataset"):
        CaptionDataModule(dataset="coco")
    dm = CaptionDataModule(num_train=4, num_val=2, num_test=2)
    with pytest.raises(ValueError, match="split"):
        dm.captions("dev")
