"""Shared test setup: one CPU thread (the test machines are shared) and a fixed seed."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
