"""Every shipped config parses through the CLI: class paths resolve and every value has
the type the signature asks for (a typo in a key or a Literal fails here, not after a
long data load)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multimodal.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_parses(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None), capsys.readouterr().err[-2000:]
    assert "class_path" in capsys.readouterr().out


def test_a_bad_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).parents[1] / "configs" / "caption_scenes.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path), "--print_config",
              "--model.init_args.model.init_args.config.encoder.stem", "cnv"])
    assert exit_info.value.code not in (0, None)
