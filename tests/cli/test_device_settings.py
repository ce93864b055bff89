"""The run's device settings: TF32 on a CUDA GPU (overridable), a line when a GPU is left
unused."""

from __future__ import annotations

import pytest

from multimodal.cli.precision import TF32_ENV, matmul_precision, unused_gpu


def test_tf32_on_a_gpu_by_default_and_off_by_the_variable() -> None:
    assert matmul_precision("auto", cuda=True, env=None)[0] in ("high", "highest")
    assert matmul_precision("auto", cuda=True, env="1")[0] == "high"
    assert matmul_precision("gpu", cuda=True, env="")[0] == "high"
    value, why = matmul_precision("gpu", cuda=True, env="0")
    assert value == "highest" and TF32_ENV in why
    with pytest.raises(ValueError, match=TF32_ENV):
        matmul_precision("gpu", cuda=True, env="maybe")


def test_tf32_left_alone_on_a_cpu() -> None:
    assert matmul_precision("auto", cuda=False, env="1")[0] is None
    assert matmul_precision("cpu", cuda=True, env="1")[0] is None


def test_a_cpu_run_beside_a_gpu_says_so() -> None:
    assert "GPU left unused" in unused_gpu("cpu", cuda=True)
    assert unused_gpu("auto", cuda=True) is None
    assert unused_gpu("cpu", cuda=False) is None


def test_the_rules_read_this_machine_when_not_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from multimodal.cli import precision as module

    monkeypatch.delenv(TF32_ENV, raising=False)
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: True)
    value, why = matmul_precision("auto")
    assert value == "high" and "TF32" in why
    assert unused_gpu("cpu") is not None
    monkeypatch.setenv(TF32_ENV, "0")
    assert matmul_precision("auto")[0] == "highest"
