from pathlib import Path

import pytest

from multimodal.precision import (
    BF16_MIN_DIM,
    BF16_MIN_TOKENS,
    choose_precision,
    cpu_flags,
    native_bf16,
)

ZEN4 = ["fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"]
SPR = ["fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"]
AMX_ONLY = ["fpu", "avx2", "amx_tile", "amx_bf16"]
HASWELL = ["fpu", "sse2", "avx", "avx2", "fma"]


@pytest.mark.parametrize("flags, expected", [(ZEN4, True), (SPR, True), (AMX_ONLY, True),
                                             (HASWELL, False), (["avx512f"], False)])
def test_native_bf16_from_flags(flags: list[str], expected: bool) -> None:
    assert native_bf16(flags) is expected


def test_native_bf16_falls_back_to_torch_capability() -> None:
    assert native_bf16([], capability="AMX") is True
    assert native_bf16([], capability="AVX512") is False
    assert native_bf16([], capability="AVX2") is False


def test_cpu_flags_reads_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: x\nflags\t\t: fpu avx2 avx512_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_choose_precision_as_documented() -> None:
    # no native bf16: fp32 whatever the size
    assert choose_precision(768, 197, bf16=False)[0] == "32-true"
    # native bf16: ViT-Tiny at 224 px (measured faster) gets bf16 ...
    assert choose_precision(192, 197, bf16=True)[0] == "bf16-mixed"
    # ... the Fashion-MNIST ViT (width 128, 16 tokens; measured slower) stays fp32
    precision, reason = choose_precision(128, 16, bf16=True)
    assert precision == "32-true" and "threshold" in reason
    assert choose_precision(BF16_MIN_DIM - 1, 1024, bf16=True)[0] == "32-true"
    assert choose_precision(1024, BF16_MIN_TOKENS - 1, bf16=True)[0] == "32-true"
    assert choose_precision(BF16_MIN_DIM, BF16_MIN_TOKENS, bf16=True)[0] == "bf16-mixed"


# ---- precision: auto (model shape, device) and the CLI wiring --------------------------

import logging  # noqa: E402

import multimodal.precision as precision_module  # noqa: E402
from multimodal.cli.precision import auto_precision, model_shape  # noqa: E402
from multimodal.models.audio import AudioClassifierConfig  # noqa: E402
from multimodal.models.clip import CLIPConfig  # noqa: E402
from multimodal.models.image_gpt import ImageGPTConfig  # noqa: E402
from multimodal.models.seq2seq import Seq2SeqConfig  # noqa: E402
from multimodal.models.text import TextDecoderConfig  # noqa: E402
from multimodal.models.vit import ViTConfig  # noqa: E402


def test_model_shape_reads_width_and_tokens_per_sample() -> None:
    # ViT-Tiny/16 at 224 px: 14 x 14 patches + class token
    assert model_shape(ViTConfig(dim=192, depth=1, heads=3)) == (192, 14 * 14 + 1)
    # the main job's ViT: 4 x 4 patches of 7 px, a class token
    assert model_shape(ViTConfig(image_size=28, patch_size=7, in_channels=1, dim=128,
                                 depth=1, heads=4)) == (128, 17)
    assert model_shape(ImageGPTConfig(image_size=32, dim=256, depth=1)) == (256, 32 * 32)
    assert model_shape(TextDecoderConfig(max_len=512, dim=96, depth=1, heads=2)) == (96, 512)
    # two towers: the heavier (width x tokens) one
    s2s = Seq2SeqConfig(max_source_len=100, max_target_len=20, dim=64, heads=2)
    assert model_shape(s2s) == (64, 100)
    clip = CLIPConfig()
    gh, gw = clip.vision.grid_size
    vision = (clip.vision.dim, gh * gw + int(clip.vision.class_token))
    text = (clip.text.dim, clip.text.max_len)
    assert model_shape(clip) == max(vision, text, key=lambda s: s[0] * s[1])
    # audio frames: 1 s at 10 ms = 100 frames, 2 stacked per token
    assert model_shape(AudioClassifierConfig(dim=64, heads=2, stack_frames=2)) == (64, 50)
    with pytest.raises(ValueError, match=r"trainer\.precision"):
        model_shape(object())


VIT_TINY = ViTConfig(dim=192, depth=1, heads=3)  # 197 tokens: above the threshold
VIT_FMNIST = ViTConfig(image_size=28, patch_size=7, in_channels=1, dim=128, depth=1, heads=4)


def test_auto_precision_cpu_follows_hardware_and_size() -> None:
    assert auto_precision(VIT_TINY, "cpu", bf16=True)[0] == "bf16-mixed"
    precision, reason = auto_precision(VIT_TINY, "cpu", bf16=False)
    assert precision == "32-true" and "no native bf16" in reason
    precision, reason = auto_precision(VIT_FMNIST, "cpu", bf16=True)
    assert precision == "32-true" and "width 128, 17 tokens" in reason
    # accelerator "auto" without CUDA is the CPU rule
    assert auto_precision(VIT_TINY, "auto", bf16=True, cuda=False)[0] == "bf16-mixed"
    assert auto_precision(VIT_TINY, "auto", bf16=False, cuda=False)[0] == "32-true"
    # a config the rule cannot read (RNN baselines): fp32, saying why
    precision, reason = auto_precision(object(), "cpu", bf16=True)
    assert precision == "32-true" and "no transformer shape" in reason


def test_auto_precision_gpu_picks_bf16_where_supported_whatever_the_size() -> None:
    assert auto_precision(VIT_FMNIST, "gpu", cuda_bf16=True) == ("bf16-mixed",
                                                                 "GPU with bf16 support")
    assert auto_precision(VIT_FMNIST, "cuda", cuda_bf16=False)[0] == "32-true"
    assert auto_precision(VIT_FMNIST, "auto", cuda=True, cuda_bf16=True)[0] == "bf16-mixed"


CONFIG = Path(__file__).parents[1] / "configs" / "vit_fashion_mnist.yaml"
# the main job's config widened to ViT-Tiny's shape (192 wide, 14 x 14 patches of 2 px + cls)
WIDE = ["--model.init_args.overrides", '{"dim": 192, "heads": 3, "patch_size": 2}']


class _Built(Exception):
    pass


def _cli_precision(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   bf16: bool) -> tuple[str, list[str]]:
    """Run the CLI up to the built trainer on a CPU whose bf16 support is ``bf16``; the
    trainer's precision and the precision lines logged."""
    from multimodal.cli.main import MultimodalCLI, main

    monkeypatch.setattr(precision_module, "native_bf16", lambda *a, **k: bf16)

    def stop(cli: MultimodalCLI, subcommand: str) -> None:
        raise _Built(cli.trainer.precision)

    monkeypatch.setattr(MultimodalCLI, "_run_subcommand", stop)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.raises(_Built) as built:
            main(["fit", "--config", str(CONFIG), "--trainer.default_root_dir", str(tmp_path),
                  "--trainer.accelerator", "cpu", *args])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return built.value.args[0], [ln for ln in lines if ln.startswith("precision:")]


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_cli_picks_precision_logs_why_and_obeys_the_override(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the shipped main job (width 128, 17 tokens) leaves precision to auto: fp32 even with bf16
    precision, lines = _cli_precision([], tmp_path, monkeypatch, bf16=True)
    assert precision == "32-true"
    assert lines == ["precision: 32-true (auto: CPU: native bf16, but the model (width 128, "
                     "17 tokens) is below the bf16 threshold (width >= 192 and tokens >= 64); "
                     "--trainer.precision overrides)"]
    # a ViT-Tiny-shaped model on a bf16 CPU: bf16 autocast ...
    precision, lines = _cli_precision(WIDE, tmp_path, monkeypatch, bf16=True)
    assert precision == "bf16-mixed" and len(lines) == 1 and "native bf16 and a model" in lines[0]
    # one switch overrides the rule (the AVX2 case of the rule: test_auto_precision_cpu_...)
    precision, lines = _cli_precision([*WIDE, "--trainer.precision", "32-true"], tmp_path,
                                      monkeypatch, bf16=True)
    assert (precision, lines) == ("32-true", ["precision: 32-true (set by trainer.precision)"])
