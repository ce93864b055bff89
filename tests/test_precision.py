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
