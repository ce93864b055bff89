"""The one image reader (``multimodal.files.read_image``): every extension ``fit`` takes,
checked against PIL on files written in the test; EXIF orientation as PIL's
``exif_transpose``; one error naming the file; and ``predict`` / ``embed`` folders take
every extension ``fit`` takes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from multimodal.files import IMAGE_EXTENSIONS, CorruptFileError, read_image

RNG = np.random.default_rng(0)
# the PIL format each extension is written in, and whether it keeps pixels exactly
FORMATS = {".png": ("PNG", True), ".jpg": ("JPEG", False), ".jpeg": ("JPEG", False),
           ".webp": ("WEBP", True), ".bmp": ("BMP", True), ".gif": ("GIF", True),
           ".tif": ("TIFF", True), ".tiff": ("TIFF", True)}


def _write(path, image: Image.Image, **kwargs) -> None:
    fmt = FORMATS[path.suffix][0]
    if fmt == "WEBP":
        kwargs.setdefault("lossless", True)
    if fmt == "GIF":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE) \
            if image.mode == "RGB" else image
    image.save(path, format=fmt, **kwargs)


def _picture(h: int = 10, w: int = 14) -> Image.Image:
    # few colours, so a GIF palette holds them all and keeps the pixels exactly
    palette = RNG.integers(0, 256, size=(6, 3), dtype=np.uint8)
    return Image.fromarray(palette[RNG.integers(0, 6, size=(h, w))])


def _pil(path, channels: int) -> np.ndarray:
    """What PIL reads (orientation applied), as ``(channels, H, W)``."""
    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        array = np.asarray(im.convert({1: "L", 3: "RGB", 4: "RGBA"}[channels]))
    return array.reshape(*array.shape[:2], -1).transpose(2, 0, 1)


def test_the_extension_lists_cover_every_format_written_here():
    assert set(FORMATS) == set(IMAGE_EXTENSIONS)  # a new extension needs a case here


@pytest.mark.parametrize("ext", IMAGE_EXTENSIONS)
def test_every_extension_reads_as_pil_reads_it(tmp_path, ext):
    file = tmp_path / f"picture{ext}"
    _write(file, _picture())
    for channels in (3, 1, 4):
        ours = read_image(file, channels)
        ref = _pil(file, channels)
        assert ours.dtype == torch.uint8 and tuple(ours.shape) == ref.shape, (ext, channels)
        diff = np.abs(ours.numpy().astype(int) - ref.astype(int)).max()
        # JPEG: libjpeg builds may differ by one level; grey: torchvision's luma rounds
        # differently from PIL's by at most 1
        exact = FORMATS[ext][1] and channels != 1
        assert diff <= (0 if exact else 2), (ext, channels, diff)
    # bytes, a 1-D uint8 tensor of them and a PIL image give what the path gives
    data = file.read_bytes()
    torch.testing.assert_close(read_image(data, 3), read_image(file, 3))
    torch.testing.assert_close(read_image(torch.frombuffer(bytearray(data), dtype=torch.uint8)),
                               read_image(file))
    with Image.open(file) as im:
        assert (read_image(im, 3).int() - read_image(file, 3).int()).abs().max() <= 2


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp", ".tiff"])
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied(tmp_path, ext, orientation):
    """A photo stored sideways with an EXIF orientation comes out as PIL's
    ``exif_transpose`` shows it (6: rotated 90 degrees: height and width swap)."""
    file = tmp_path / f"photo{ext}"
    image = _picture(8, 12)
    exif = Image.Exif()
    exif[0x0112] = orientation
    _write(file, image, exif=exif.tobytes())
    ours = read_image(file, 3)
    want = (8, 12) if orientation == 3 else (12, 8)
    assert tuple(ours.shape[1:]) == want
    ref = _pil(file, 3)
    tol = 0 if FORMATS[ext][1] else 2
    assert np.abs(ours.numpy().astype(int) - ref.astype(int)).max() <= tol
    # and it is the stored picture turned: orientation 3 = 180 degrees, 6 = 90 clockwise
    with Image.open(file) as im:  # the pixels as stored (no orientation applied)
        stored = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)
    turned = {3: stored.flip(1, 2), 6: stored.rot90(-1, (1, 2)),
              8: stored.rot90(1, (1, 2))}[orientation]
    if ext == ".tiff":  # PIL's TIFF decoder (libtiff) hands out the picture already turned
        turned = stored
    assert (ours.int() - turned.int()).abs().max() <= tol


def test_one_error_names_the_file(tmp_path):
    good = tmp_path / "good.png"
    _picture().save(good)
    data = good.read_bytes()
    cases = {"empty.jpg": b"", "text.png": b"hello, not a picture\n",
             "truncated.png": data[: len(data) // 2],
             "garbage.jpg": b"\xff\xd8\xff" + b"\x00" * 50,
             "bad.webp": b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 8,
             "bad.tif": b"II*\x00" + b"\x00" * 20}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CorruptFileError) as err:
            read_image(tmp_path / name)
        message = str(err.value)
        assert message.startswith(f"{tmp_path / name}: not a readable image (") \
            and message.endswith(")") and "\n" not in message, message
    with pytest.raises(CorruptFileError, match=r"^input\[2\]: not a readable image \(the file"):
        read_image(b"", name="input[2]")
    with pytest.raises(FileNotFoundError, match=r"missing\.png"):
        read_image(tmp_path / "missing.png")


def test_sixteen_bit_and_own_channels(tmp_path):
    wide = RNG.integers(0, 65536, size=(6, 7), dtype=np.uint16)
    Image.fromarray(wide).save(tmp_path / "g16.png")
    expected = np.floor((wide.astype(np.int64) * 255 + 32767) / 65535)  # round(v * 255/65535)
    ours = read_image(tmp_path / "g16.png", None)  # None: the file's own channels
    assert ours.shape == (1, 6, 7) and ours.dtype == torch.uint8
    np.testing.assert_array_equal(ours[0].numpy(), expected)
    buf = io.BytesIO()
    Image.fromarray(RNG.integers(0, 256, size=(4, 5, 4), dtype=np.uint8)).save(buf, "PNG")
    assert read_image(buf.getvalue(), None).shape == (4, 4, 5)


# ----------------------------------------------------------------- predict / embed folders


def _every_extension(folder, size: int = 12) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, ext in enumerate(IMAGE_EXTENSIONS):
        names.append(f"img{i}{ext}")
        _write(folder / names[-1], _picture(size, size + 2))
    return names


def test_predict_reads_every_extension_fit_reads(tmp_path):
    """``fit`` takes a class folder of every extension; ``predict`` on a folder of them
    gives one row per file, each the tensor fit's evaluation transform makes of it."""
    from multimodal.data.vision import ImageClassificationDataModule
    from multimodal.data.vision_transforms import image_transform

    for cls in ("a", "b"):
        _every_extension(tmp_path / "train" / cls)
    names = _every_extension(tmp_path / "new")
    dm = ImageClassificationDataModule(train=str(tmp_path / "train"), image_size=8,
                                       predict=str(tmp_path / "new"), mean=0.5, std=0.25,
                                       val_size=0, test_size=0, batch_size=64)
    dm.setup("fit")
    assert len(dm._load_file_splits()["train"]) == 2 * len(IMAGE_EXTENSIONS)
    x, got = next(iter(dm.predict_dataloader()))
    assert list(got) == sorted(names) and x.shape == (len(names), 3, 8, 8)
    evaluation = image_transform(dm.transform_config(), train=False)
    for row, name in zip(x, got, strict=True):
        torch.testing.assert_close(row, evaluation(read_image(tmp_path / "new" / name, 3)))


def test_embed_inputs_take_every_extension(tmp_path):
    from multimodal.pipelines.inputs import Reader, Skipped, collect_inputs, read_batch

    names = _every_extension(tmp_path / "photos")
    items = collect_inputs(tmp_path / "photos", ("image",))
    assert sorted(i.id for i in items) == sorted(names)
    kept, values = read_batch(items, "image", Reader(channels=1), False, Skipped())
    assert len(kept) == len(names)
    for item, value in zip(kept, values, strict=True):
        torch.testing.assert_close(value, read_image(item.path, 1))
