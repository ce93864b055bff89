"""Every shipped config parses through the CLI: class paths resolve and every value has
the type the signature asks for (a typo in a key or a Literal fails here, not after a
long data load)."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path

import pytest
import torch
import yaml
from jsonargparse import Namespace

from multimodal.cli.main import MultimodalCLI, main
from multimodal.progress import is_terminal

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 10


class _Parsed(Exception):
    """Raised in place of instantiating the classes: carries the final config."""


def _parse(args: list[str], monkeypatch: pytest.MonkeyPatch) -> Namespace:
    """The config the CLI would run with: parsed, overridden, run outputs placed."""
    def stop(cli: MultimodalCLI) -> None:
        raise _Parsed(cli.config[cli.subcommand])

    monkeypatch.setattr(MultimodalCLI, "instantiate_classes", stop)
    with pytest.raises(_Parsed) as info:
        main(args)
    return info.value.args[0]


def _strings(value: object, key: str = "") -> list[tuple[str, str]]:
    """Every string (or path) value of a config, with its dotted key."""
    if isinstance(value, Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _strings(v, f"{key}.{k}".strip("."))]
    if isinstance(value, (list, tuple)):
        return [kv for i, v in enumerate(value) for kv in _strings(v, f"{key}[{i}]")]
    return [(key, str(value))] if isinstance(value, (str, Path)) else []


# What a run reads from another run (bert_source_cls fine-tunes bert_mlm's encoder): inputs.
INPUTS_FROM_OTHER_RUNS = {"model.init_args.pretrained", "data.init_args.tokenizer_path"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_parses_and_default_root_dir_moves_the_whole_run(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # documented default: each shipped run lives in runs/<config name>
    assert yaml.safe_load(path.read_text())["trainer"]["default_root_dir"] == f"runs/{path.stem}"
    root = tmp_path / "elsewhere"
    config = _parse(["fit", "--config", str(path), "--trainer.default_root_dir", str(root)],
                    monkeypatch)
    assert config.model.class_path and config.data.class_path
    # Lightning's redrawn bar only on a terminal; else plain epoch lines (EpochSummary)
    assert config.trainer.enable_progress_bar is is_terminal(sys.stdout)
    values = _strings({"model": config.model, "data": config.data, "trainer": config.trainer})
    assert not [kv for kv in values if "${" in kv[1]], "unresolved placeholder"
    # no output still points at runs/...: only another run's outputs, read as inputs
    outside = [k for k, v in values if v.startswith("runs") and k not in INPUTS_FROM_OTHER_RUNS]
    assert not outside, outside
    checkpoints = [c for c in config.trainer.callbacks or []
                   if c.class_path.endswith(("ModelCheckpoint", "RunCheckpoint"))]
    assert checkpoints, "every shipped config keeps a last.ckpt to resume from"
    for callback in checkpoints:
        assert callback.init_args.dirpath == str(root / "version_0" / "checkpoints")
    loggers = config.trainer.logger if isinstance(config.trainer.logger, list) else []
    for logger in loggers:
        assert logger.init_args.save_dir == str(root) and logger.init_args.name == ""
    if path.stem in ("bert_mlm", "gpt_corpus"):  # their tokenizer is an output
        assert config.data.init_args.tokenizer_path == str(root / "tokenizer.json")
    if path.stem == "bert_mlm":
        assert config.model.init_args.save_dir == str(root / "encoder")


def test_a_bad_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).parents[2] / "configs" / "caption_scenes.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path), "--print_config",
              "--model.init_args.model.init_args.config.encoder.stem", "cnv"])
    assert exit_info.value.code not in (0, None)


FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


@pytest.mark.slow  # two short fits and a test: about 10 s
@pytest.mark.skipif(not FASHION_MNIST.is_file(), reason="needs Debian dataset-fashion-mnist")
def test_a_moved_run_writes_only_under_its_root_and_resumes_from_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The main job's config, a few batches: one --trainer.default_root_dir moves checkpoints,
    logs and the figure; nothing lands in the working directory; ``--ckpt_path last`` resumes."""
    config = Path(__file__).parents[2] / "configs" / "vit_fashion_mnist.yaml"
    cwd, root = tmp_path / "cwd", tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # where the config's runs/vit_fashion_mnist would have gone
    tiny = ["--trainer.default_root_dir", str(root), "--trainer.accelerator", "cpu",
            "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
            "--trainer.limit_test_batches", "1", "--data.init_args.batch_size", "16",
            "--data.init_args.val_size", "64"]
    main(["fit", "--config", str(config), *tiny, "--trainer.max_epochs", "1"])
    assert list(cwd.iterdir()) == []
    out = capsys.readouterr().out  # not a terminal: no bar frames, one plain line per epoch
    assert "\r" not in out and [ln for ln in out.splitlines() if ln.startswith("epoch 1/1 ")]
    names = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert "version_0/checkpoints/last.ckpt" in names
    assert any(n.startswith("version_0/checkpoints/best-") for n in names)
    assert {"version_0/metrics.csv", "version_0/config.yaml",
            "version_0/confusion_matrix.png"} <= names
    assert any(n.startswith("version_0/events.out.tfevents") for n in names)
    # resume: only the second epoch runs, from the first run's last.ckpt under the new root
    main(["fit", "--config", str(config), *tiny, "--trainer.max_epochs", "2",
          "--ckpt_path", "last", "--test_after_fit", "false"])
    epochs = [ln.split()[1] for ln in capsys.readouterr().out.splitlines()
              if ln.startswith("epoch ")]
    assert epochs == ["2/2"]
    assert list(cwd.iterdir()) == []
    # ... continuing the run it resumes, in that run's checkpoint folder
    ckpt = torch.load(root / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4  # 2 batches in each of the 2 epochs
    # the resumed run logs in its own version, TensorBoard and CSV together
    assert (root / "version_1" / "metrics.csv").is_file()
    assert list((root / "version_1").glob("events.out.tfevents*"))


# --- the CLI's trainer defaults: a config says only what differs ----------

_DEFAULTED = ("ModelCheckpoint", "RunCheckpoint", "LearningRateMonitor", "TensorBoardLogger",
              "CSVLogger")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_no_shipped_config_repeats_the_default_loggers_or_checkpoint(path: Path) -> None:
    trainer = yaml.safe_load(path.read_text())["trainer"]
    named = [item["class_path"] for key in ("logger", "callbacks")
             for item in (trainer.get(key) or []) if isinstance(item, dict)]
    repeated = [c for c in named if c.rsplit(".", 1)[-1] in _DEFAULTED]
    assert not repeated, f"{path.name} repeats the CLI's defaults: {repeated}"


def _checkpoint(config: Namespace) -> Namespace:
    found = [c for c in config.trainer.callbacks
             if isinstance(c, Namespace)
             and c.class_path.endswith((".ModelCheckpoint", ".RunCheckpoint"))]
    assert len(found) == 1, found
    return found[0].init_args


@pytest.mark.parametrize(("stem", "extra", "monitor", "mode"), [
    ("vit_fashion_mnist", [], "val/acc_macro", "max"),        # ClassificationTask's metric
    ("igpt_fashion_mnist", [], "val/bpd", "min"),             # lower bits per dim is better
    ("caption_scenes", [], "val/scene_match", "max"),         # the config's one key
    ("finetune_clip", [], "val/loss", "min"),                 # a loss: mode follows the name
    ("vit_fashion_mnist", ["--monitor", "val/loss"], "val/loss", "min"),
    ("vit_fashion_mnist", ["--monitor", "val/top5", "--monitor_mode", "min"], "val/top5", "min"),
])
def test_the_default_checkpoint_ranks_by_the_task_or_the_config(
        stem: str, extra: list[str], monitor: str, mode: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = Path(__file__).parents[2] / "configs" / f"{stem}.yaml"
    config = _parse(["fit", "--config", str(path), "--trainer.default_root_dir",
                     str(tmp_path), *extra], monkeypatch)
    args = _checkpoint(config)
    assert (args.monitor, args.mode, args.save_last) == (monitor, mode, True)
    # last.ckpt at every epoch end, ties to the lower val/loss (tests/cli/test_checkpoints.py)
    assert [c.class_path for c in config.trainer.callbacks if isinstance(c, Namespace)
            and c.class_path.endswith("Checkpoint")] == ["multimodal.cli.callbacks.RunCheckpoint"]
    assert args.dirpath == str(tmp_path / "version_0" / "checkpoints")
    assert args.filename == f"best-{{epoch}}-{{{monitor}:.4f}}"
    loggers = [lg.class_path.rsplit(".", 1)[-1] for lg in config.trainer.logger]
    assert loggers == ["TensorBoardLogger", "CSVLogger"]
    versions = {lg.init_args.version for lg in config.trainer.logger}
    assert len(versions) == 1 and None not in versions  # one version_N for both
    assert [c for c in config.trainer.callbacks
            if c.class_path.endswith(".LearningRateMonitor")]


def test_no_logger_means_no_lr_monitor_and_a_config_checkpoint_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = Path(__file__).parents[2] / "configs" / "vit_fashion_mnist.yaml"
    own = ('{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
           '"init_args": {"monitor": "val/loss", "mode": "min", "every_n_epochs": 2}}')
    config = _parse(["fit", "--config", str(path), "--trainer.default_root_dir", str(tmp_path),
                     "--trainer.logger", "false", "--trainer.callbacks", f"[{own}]"],
                    monkeypatch)
    assert config.trainer.logger is False
    assert not [c for c in config.trainer.callbacks
                if c.class_path.endswith(".LearningRateMonitor")]
    args = _checkpoint(config)  # the config's own, not a second one
    assert (args.monitor, args.every_n_epochs) == ("val/loss", 2)
    # no logger: the run still takes the next free version_N for its checkpoints
    assert args.dirpath == str(tmp_path / "version_0" / "checkpoints")


# 74 lines (configs/clip_scenes.yaml) before the defaults moved into the CLI
LONGEST_BEFORE = 74


def test_the_longest_config_is_at_most_half_its_former_length() -> None:
    lengths = {p.name: len(p.read_text().splitlines()) for p in CONFIGS}
    longest = max(lengths, key=lengths.__getitem__)
    assert lengths[longest] <= LONGEST_BEFORE // 2, (longest, lengths[longest])


# --- named models: a config's model is a preset plus overrides ------------

# the preset each config trains; a variant (in VARIANTS) changes a few fields in overrides
PRESET_OF_CONFIG = {
    "audio_folder": "audio_spoken_words", "audio_sonic_pi": "audio_sonic_pi",
    "audio_spoken_words": "audio_spoken_words", "speaker_id": "audio_spoken_words",
    "bert_mlm": "bert_tiny",
    "caption_emoji": "captioner_emoji", "caption_manifest": "captioner_emoji",
    "caption_scenes": "captioner_scenes", "clip_emoji": "clip_emoji",
    "clip_scenes": "clip_scenes", "gpt_corpus": "gpt_tiny", "gpt_textfiles": "gpt_tiny",
    "igpt_fashion_mnist": "igpt_fashion_mnist",
    "igpt_fashion_mnist_gpu": "igpt_fashion_mnist_gpu", "igpt_mnist5k": "igpt_mnist5k",
    "rnn_numbers": "rnn_numbers", "rnn_numbers_bottleneck": "rnn_numbers",
    "seq2seq_numbers": "seq2seq_numbers", "seq2seq_pairs": "seq2seq_numbers",
    "tts_voices": "tts_voices", "vit_base_fsdp": "vit_base_patch16_224",
    "vit_fashion_mnist": "vit_fashion_mnist", "vit_fashion_mnist_conv": "vit_fashion_mnist",
    "vit_fashion_mnist_ddp": "vit_fashion_mnist",
    "vit_fashion_mnist_long": "vit_fashion_mnist_long", "vit_imagefolder": "vit_imagefolder"}
VARIANTS = {"speaker_id", "rnn_numbers_bottleneck", "vit_base_fsdp", "vit_fashion_mnist_conv"}
WITH_PRESET = [p for p in CONFIGS if p.stem in PRESET_OF_CONFIG]
# configs whose task is no ModelTask: Word2Vec builds its two tables from the data's
# vocabulary (no preset) and steps them itself (no optimizer block; alpha / min_alpha)
OWN_STEP = {"word2vec"}

# what the data fixes: the keys of the data modules' model_sizes, and the class count
DATA_SIZES = {"image_size", "in_channels", "n_mels", "vocab_size", "max_len",
              "source_vocab_size", "target_vocab_size", "max_source_len", "max_target_len",
              "codebook_size", "num_codebooks", "num_classes"}


def _keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_names_its_model_and_repeats_no_size_of_the_data(path: Path) -> None:
    init = yaml.safe_load(path.read_text())["model"]["init_args"]
    if path.stem in OWN_STEP:
        assert not _keys(init) & DATA_SIZES, f"{path.name}: sizes come from the data section"
        return
    assert "model" not in init, f"{path.name} spells out its model: name a preset"
    assert ("preset" in init) != ("pretrained" in init), path.name
    if "preset" in init:
        assert init["preset"] == PRESET_OF_CONFIG[path.stem], path.stem
        assert bool(init.get("overrides")) == (path.stem in VARIANTS), path.stem
    repeated = _keys(init) & DATA_SIZES
    assert not repeated, f"{path.name}: {sorted(repeated)} come from the data section"


def _own_data(stem: str, root: Path) -> list[str]:
    """Command-line arguments that point a config made for the user's own files at a few
    made-up ones (the classes / vocabulary of the shipped path are not on this machine)."""
    import numpy as np
    from PIL import Image

    def image(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((16, 16, 3), len(path.name) * 20, np.uint8)).save(path)

    if stem == "vit_imagefolder":
        for cls in ("cat", "dog"):
            for i in range(2):
                image(root / cls / f"{i}.png")
        return ["--data.init_args.train", str(root)]
    if stem == "caption_manifest":
        for i in range(4):
            image(root / f"{i}.png")
        rows = "".join(f"{i}.png,a picture of {i} things\n" for i in range(4))
        (root / "captions.csv").write_text("image,caption\n" + rows)
        return ["--data.init_args.train", str(root / "captions.csv")]
    if stem == "audio_folder":
        import soundfile as sf

        for cls in ("en", "fr"):
            (root / cls).mkdir(parents=True)
            for i in range(2):
                sf.write(str(root / cls / f"{i}.wav"), np.zeros(8000, np.float32), 16000)
        return ["--data.init_args.train", str(root)]
    if stem == "speaker_id":  # the speakers manifest of `bash data/get.sh tts` (not in `all`)
        import soundfile as sf

        (root / "wav").mkdir(parents=True)
        rows = []
        for voice in ("en", "fr"):
            for i in range(2):
                sf.write(str(root / "wav" / f"{voice}{i}.wav"), np.zeros(8000, np.float32), 16000)
                rows.append(f"wav/{voice}{i}.wav,{voice}\n")
        (root / "speakers.csv").write_text("path,label\n" + "".join(rows))
        return ["--data.init_args.train", str(root / "speakers.csv")]
    if stem == "gpt_textfiles":
        root.mkdir(parents=True)
        (root / "a.txt").write_text("In the beginning there was text.\n" * 50)
        return ["--data.init_args.train", str(root)]
    if stem == "bert_source_cls":  # its encoder comes from a bert_mlm run
        return ["--model.init_args.pretrained", "null", "--model.init_args.preset", "bert_tiny"]
    return []


class _Built(Exception):
    """Raised in place of making the trainer: carries the task and the data module."""


def _flat_fields(config: object, prefix: str = "") -> dict[str, object]:
    import dataclasses

    out: dict[str, object] = {}
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            out.update(_flat_fields(value, f"{prefix}{field.name}."))
        else:
            out[f"{prefix}{field.name}"] = value
    return out


# fields a task sets itself: a masked-LM task's encoder has an MLM head, a classifier's not
TASK_FIELDS = {"mlm_head"}


@pytest.mark.parametrize("path", WITH_PRESET, ids=lambda p: p.stem)
def test_a_config_model_is_its_preset_with_its_overrides_and_the_data_sizes(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model the CLI builds from a config is ``create_model(preset, **overrides)`` except
    for the fields the data fixes, each equal to the data module's value (its
    ``model_sizes``; its class count for a classifier's ``num_classes``)."""
    import multimodal as mm

    def stop(cli: MultimodalCLI, **kwargs: object) -> None:
        raise _Built(cli.model, cli.datamodule)

    monkeypatch.setattr(MultimodalCLI, "instantiate_trainer", stop)
    init = yaml.safe_load(path.read_text())["model"]["init_args"]
    with pytest.raises(_Built) as info:
        main(["fit", "--config", str(path), "--trainer.default_root_dir", str(tmp_path / "run"),
              *_own_data(path.stem, tmp_path / "data")])
    task, datamodule = info.value.args
    # the task trains with the config's optimizer block, the rest its own defaults
    block = {k: tuple(v) if k == "betas" else v for k, v in init["optimizer"].items()}
    assert dataclasses.asdict(task.optimizer_config) == \
        {**dataclasses.asdict(type(task).optimizer_defaults), **block}
    config = task.model.config
    sizes = dict(datamodule.model_sizes)
    if "num_classes" in task.hparams and getattr(datamodule, "class_names", None):
        sizes["num_classes"] = len(datamodule.class_names)
    # a flat config takes the sizes as keywords (a nested one holds them in its parts)
    keywords = set(inspect.signature(type(config)).parameters)
    with torch.device("meta"):
        reference = mm.create_model(init["preset"], **(init.get("overrides") or {}),
                                    **{k: v for k, v in sizes.items() if k in keywords})
    assert type(task.model) is type(reference)
    built, wanted = _flat_fields(config), _flat_fields(reference.config)
    for key, value in built.items():
        name = key.rsplit(".", 1)[-1]
        if name in sizes:
            assert value == sizes[name], (key, value, sizes[name])
        elif name not in TASK_FIELDS:
            assert value == wanted[key], (key, value, wanted[key])
    fixed = [k for k in datamodule.model_sizes
             if k in keywords or any(f.rsplit(".", 1)[-1] == k for f in built)]
    assert fixed, "the data fixes none of the model's sizes"
    for name in fixed:
        if name in keywords:  # the config reads it back (a field or an alias property)
            assert getattr(config, name) == sizes[name], name


def test_an_override_that_disagrees_with_the_data_is_an_error() -> None:
    from multimodal.tasks.presets import preset_config

    _, config = preset_config("captioner_scenes", {"decoder": {"depth": 3}},
                              {"image_size": 48, "vocab_size": 40})
    assert (config.encoder.image_size, config.decoder.vocab_size) == (48, 40)
    assert (config.decoder.depth, config.decoder.dim) == (3, 96)  # nested: only that field
    with pytest.raises(ValueError, match=r"encoder.image_size: overrides 32, data 48"):
        preset_config("captioner_scenes", {"encoder": {"image_size": 32}}, {"image_size": 48})
    with pytest.raises(ValueError, match="has no field 'depht'"):
        preset_config("vit_fashion_mnist", {"depht": 2})


def test_preset_and_model_together_is_an_error() -> None:
    import multimodal as mm
    from multimodal.tasks import ClassificationTask

    with pytest.raises(ValueError, match="one of model, preset or pretrained"):
        ClassificationTask(mm.create_model("vit_fashion_mnist"), preset="vit_fashion_mnist")
    with pytest.raises(ValueError, match="builds a CLIP, not a"):
        ClassificationTask(preset="clip_scenes")


FLAT_OPTIMIZER_KEYS = ("lr", "weight_decay", "betas", "warmup_fraction", "min_lr_ratio")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_gives_its_optimizer_as_one_block(path: Path) -> None:
    """``model.init_args.optimizer: {...}`` and no flat key; the block resolves over the
    task's own defaults (an unknown key or a value of the wrong type fails here)."""
    import importlib

    from multimodal.tasks.optim import OptimizerConfig

    model = yaml.safe_load(path.read_text())["model"]
    init = model["init_args"]
    assert not set(FLAT_OPTIMIZER_KEYS) & set(init), "flat optimiser keys: use optimizer:"
    if path.stem in OWN_STEP:
        assert "optimizer" not in init
        return
    module, name = model["class_path"].rsplit(".", 1)
    task = getattr(importlib.import_module(module), name)
    resolved = OptimizerConfig.of(init["optimizer"], task.optimizer_defaults)
    for key, value in init["optimizer"].items():
        assert getattr(resolved, key) == (tuple(value) if key == "betas" else value)


GPT = Path(__file__).parents[2] / "configs" / "gpt_corpus.yaml"  # optimizer: 4 of the 5 keys


def test_the_optimizer_block_from_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested key replaces one key of the config's block, a JSON block replaces the
    block (the keys it leaves out: the task's defaults); the flat option of earlier
    releases is one error naming the new spelling (tests/cli/test_errors.py)."""
    from multimodal.tasks import LanguageModelTask
    from multimodal.tasks.optim import OptimizerConfig

    config_block = yaml.safe_load(GPT.read_text())["model"]["init_args"]["optimizer"]
    assert config_block == {"lr": 0.002, "weight_decay": 0.1, "warmup_fraction": 0.05,
                            "min_lr_ratio": 0.1}

    def block(*args: str) -> dict:
        init = _parse(["fit", "--config", str(GPT), *args], monkeypatch).model.init_args
        assert not set(FLAT_OPTIMIZER_KEYS) & set(vars(init))
        return dict(init.optimizer)

    assert block("--model.init_args.optimizer.lr", "1e-4") == {**config_block, "lr": 1e-4}
    assert block("--model.init_args.optimizer.betas", "[0.8, 0.9]") == \
        {**config_block, "betas": [0.8, 0.9]}
    assert block("--model.init_args.optimizer", '{"lr": 1e-4}') == {"lr": 1e-4}
    assert OptimizerConfig.of({"lr": 1e-4}, LanguageModelTask.optimizer_defaults) == \
        OptimizerConfig(lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), warmup_fraction=0.05,
                        min_lr_ratio=0.1)
    with pytest.raises(SystemExit):
        block("--model.init_args.lr", "1e-4")

