"""``mm.synthesize`` / ``multimodal speak``: text-to-speech with a trained
:class:`~multimodal.models.codec_lm.CodecLM` (its checkpoint, or what
:func:`multimodal.load` returned for it).

``synthesize(model_or_ckpt, text, prompt)`` turns text into a mono waveform in the voice of
the prompt (a few seconds of speech):

1. text -> phoneme ids (the :class:`~multimodal.tokenizers.phonemes.PhonemeTokenizer` the
   model was trained with);
2. prompt waveform -> codec tokens ``(Q, Tp)`` (:class:`~multimodal.tokenizers.codec.MelRVQCodec`;
   other sample rates are resampled, channels averaged), cut to the first
   ``max_prompt_frames`` frames as in training;
3. the AR model samples codebook 1 until its end-of-speech token (temperature / top-k /
   top-p, seeded), the NAR model fills codebooks 2..Q greedily;
4. the codec decodes the ``(Q, T)`` tokens to a waveform (Griffin-Lim).

A checkpoint written by :class:`~multimodal.tasks.tts.TTSTask` carries everything this needs
(the model config and weights, the phoneme tokenizer, the codec's codebooks):
``checkpoint["tts"]`` is a plain dict (:func:`multimodal.checkpoints.bundle_state`), read with
``torch.load(weights_only=True)``.

Documented behaviour on bad input (``ValueError`` naming the problem, never an error from
inside a kernel):

* empty text, or text without a letter or digit -> ``ValueError``;
* text whose phonemes are all unknown to the tokenizer (word breaks aside) -> ``ValueError``;
* letters in a script the phonemiser's espeak-ng voice does not read (``"你好世界"`` for
  ``en-us``, which espeak-ng would speak as "Chinese letter" four times) -> ``ValueError``
  when no letter of the text is readable, a ``UserWarning`` naming them otherwise;
* text partly unknown to the model's phoneme tokenizer (``[UNK]`` ids) -> a
  ``UserWarning`` with the count; entirely unknown -> ``ValueError``;
* ``temperature < 0`` (or NaN) -> ``ValueError`` (``0`` is greedy decoding);
* a prompt that is silent, shorter than ``min_prompt_seconds`` (0.5 s), NaN / inf, or not
  a 1-D / 2-D waveform -> ``ValueError``; a missing prompt file -> ``FileNotFoundError``;
* a checkpoint path that is not a checkpoint (a text file, a Git LFS pointer, an HTML
  page) -> ``ValueError`` "... is not a checkpoint file: ..." naming it
  (:func:`multimodal.load`);
* a prompt at another sample rate is resampled; a stereo (multi-channel) prompt is averaged
  to mono, in either layout, ``(channels, samples)`` or soundfile's ``(samples, channels)``
  (the shorter side is the channels); integer PCM (int16 from ``scipy.io.wavfile``, any
  width) is rescaled to [-1, 1) (:mod:`multimodal.tokenizers.waveform`), a NumPy array is
  taken like a tensor;
* the AR model may not end the speech before ``MIN_SPEECH_SECONDS`` (0.1 s, at least 3
  frames): its end-of-speech token is masked until then, so the codec always has frames to
  decode;
* text longer than the model's context is **split into sentences** (at ``. ! ? ; :`` and
  line breaks), synthesised one group of sentences at a time and joined with
  ``pause_seconds`` of silence; a single sentence that alone does not fit the context is a
  ``ValueError`` that gives the limit in phonemes.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from multimodal.checkpoints import TTSBundle
from multimodal.moved import old_names
from multimodal.pipelines._loaders import is_source, tts
from multimodal.tokenizers.phonemes import (
    CLAUSE_BREAK,
    WORD_BREAK,
    PhonemeTokenizer,
    letter_script,
    unreadable_letters,
)
from multimodal.tokenizers.text import UNK_ID
from multimodal.tokenizers.waveform import as_mono

__all__ = ["check_readable", "encode_prompt", "load_prompt", "split_sentences", "synthesize"]

MIN_SPEECH_SECONDS = 0.1
"""The AR model may not end the speech before this (EOS is masked until then)."""
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")

__getattr__ = old_names(__name__, {
    "load_tts": (lambda: tts, "multimodal.synthesize(multimodal.load(path), text, prompt)")})


def _as_bundle(model_or_ckpt: Any) -> TTSBundle:
    if isinstance(model_or_ckpt, TTSBundle):
        return model_or_ckpt
    if is_source(model_or_ckpt):  # a path, or what mm.load returned
        return tts(model_or_ckpt)
    bundle = getattr(model_or_ckpt, "bundle", None)  # a TTSTask
    if callable(bundle):
        return bundle()
    raise TypeError("model_or_ckpt must be a checkpoint path, what multimodal.load returned, "
                    "a TTSTask or a TTSBundle, got "
                    f"{type(model_or_ckpt).__name__}")


def load_prompt(prompt: Tensor | np.ndarray | str | Path,
                sample_rate: int | None) -> tuple[Tensor, int | None]:
    """A prompt waveform and its rate; a path is read with soundfile (any format it reads).
    A tensor or NumPy array of any dtype: integer PCM is rescaled when it is encoded
    (:func:`encode_prompt`)."""
    if isinstance(prompt, (str, Path)):
        import soundfile as sf

        path = Path(prompt)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {path} does not exist")
        try:
            data, rate = sf.read(str(path), dtype="float32", always_2d=True)
        except RuntimeError as err:
            raise ValueError(f"prompt file {path} is not readable audio: {err}") from None
        return torch.from_numpy(data.T.copy()), int(rate)
    if not isinstance(prompt, (Tensor, np.ndarray)):
        raise TypeError(f"prompt must be a waveform tensor or an audio file path, got "
                        f"{type(prompt).__name__}")
    return prompt, sample_rate


def encode_prompt(bundle: TTSBundle, waveform: Tensor | np.ndarray, sample_rate: int | None,
                  min_seconds: float) -> Tensor:
    """Codec tokens ``(Q, Tp)`` of the prompt, first ``max_prompt_frames`` frames. The
    prompt is brought to float mono by :func:`~multimodal.tokenizers.waveform.as_mono`
    (integer PCM rescaled, ``(channels, samples)`` or soundfile's ``(samples, channels)``)."""
    mono = as_mono(waveform, "prompt")
    rate = sample_rate or bundle.codec.sample_rate
    seconds = mono.shape[-1] / rate
    if seconds < min_seconds:
        raise ValueError(f"prompt too short: {seconds:.2f} s, need at least {min_seconds:g} s "
                         "of the voice to imitate")
    try:
        tokens = bundle.codec.encode(mono, rate)
    except ValueError as err:
        raise ValueError(f"prompt: {err}") from None
    return tokens[:, : bundle.max_prompt_frames]


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split after ``. ! ? ; :`` followed by space, and at line
    breaks; pieces without a letter or digit are dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if re.search(r"[^\W_]", s)]


def _budget(bundle: TTSBundle, prompt_frames: int) -> int:
    """Most phonemes one AR + NAR pass can take next to this prompt, reserving room for
    ``1.25 x frames_per_phoneme`` frames per phoneme (the AR's length cap and the context
    still bound the speech itself)."""
    cfg = bundle.model.config
    per = 1 + 1.25 * bundle.frames_per_phoneme
    ar = (cfg.ar.max_len - prompt_frames - 2) / per
    nar = (cfg.nar.max_len - prompt_frames) / per
    return int(min(ar, nar))


def check_readable(tok: PhonemeTokenizer, text: str) -> None:
    """Letters in a script the phonemiser's espeak-ng voice does not read (``"你好"`` for
    ``en-us``: espeak-ng says "Chinese letter" for each): a ``ValueError`` when no letter of
    the text is readable, else a warning naming them."""
    if tok.backend != "espeak":
        return  # characters outside the vocabulary are [UNK]: see the warning below
    bad = unreadable_letters(text, tok.voice)
    if not bad:
        return
    scripts = ", ".join(f"{script} ({letters[:12]!r})" for script, letters in bad.items())
    problem = (f"{scripts} letters of {text!r:.60} are not read by the phonemiser's voice "
               f"{tok.voice!r}: espeak-ng names each such character (\"Chinese letter\") "
               "instead of reading it")
    if not any(ch.isalpha() and letter_script(ch) not in bad for ch in text):
        raise ValueError(f"{problem}; nothing in the text can be spoken (the model was "
                         "trained on that voice's language)")
    warnings.warn(f"{problem}; they are spoken that way", UserWarning, stacklevel=4)


def _chunks(bundle: TTSBundle, text: str, limit: int) -> list[list[int]]:
    """Phoneme ids of ``text`` in groups of whole sentences of at most ``limit`` phonemes."""
    tok = bundle.tokenizer
    check_readable(tok, text)
    whole = tok.encode(text)
    breaks = {tok.token_to_id(WORD_BREAK), tok.token_to_id(CLAUSE_BREAK), UNK_ID}
    if all(i in breaks for i in whole):
        raise ValueError(f"text {text!r:.60} has no phoneme the model knows "
                         f"({tok.last_unknown_count} of its {len(whole)} tokens are unknown to "
                         "its tokenizer)")
    if tok.last_unknown_count:
        unknown = tok.last_unknown_count
        warnings.warn(f"{unknown} of the {len(whole)} phoneme tokens of {text!r:.60} are "
                      "unknown to the model's tokenizer and are spoken as [UNK] (whatever the "
                      "model learnt for it); the rest is synthesised", UserWarning,
                      stacklevel=3)
    if len(whole) <= limit:
        return [whole]
    space = tok.token_to_id(" ")
    joint = [space] if space is not None else []  # between sentences of one group
    groups: list[list[int]] = []
    for sentence in split_sentences(text):
        ids = tok.encode(sentence)
        if len(ids) > limit:
            raise ValueError(f"sentence {sentence!r:.60} is {len(ids)} phonemes; with this "
                             f"prompt the model's context takes at most {limit}: split it")
        if groups and len(groups[-1]) + len(joint) + len(ids) <= limit:
            groups[-1] = groups[-1] + joint + ids
        else:
            groups.append(ids)
    return groups


@torch.no_grad()
def synthesize(
    model_or_ckpt: Any,
    text: str,
    prompt: Tensor | str | Path,
    prompt_sample_rate: int | None = None,
    *,
    temperature: float = 1.0,
    top_k: int | None = 5,
    top_p: float | None = None,
    seed: int | None = 0,
    min_prompt_seconds: float = 0.5,
    pause_seconds: float = 0.15,
    stats: dict | None = None,
) -> tuple[Tensor, int]:
    """Speech for ``text`` in the voice of ``prompt``: ``(waveform (N,), sample_rate)``.

    ``model_or_ckpt``: a TTSTask checkpoint path, what ``mm.load`` returned for one, a
    :class:`~multimodal.tasks.tts.TTSTask` or a :class:`TTSBundle`. ``prompt``: a waveform
    tensor (rate ``prompt_sample_rate``, default the codec's; any dtype, integer PCM
    rescaled; (channels, samples) or (samples, channels); or a NumPy array) or an audio
    file. ``temperature`` (``0``: greedy; negative: ``ValueError``), ``top_k``, ``top_p``
    and ``seed`` set the AR sampling (the default, temperature 1 with top-k 5,
    was the most intelligible of greedy, temperature 0.7, 1.0 and top-k 5 on 40 words
    after 4 epochs of configs/tts_voices.yaml; greedy decoding repeats itself). ``stats``,
    when a dict, receives ``ar_seconds``, ``nar_seconds``, ``decode_seconds``, ``audio_seconds`` and
    ``ar_tokens`` (summed over sentence groups). Bad input: see the module doc.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"temperature must be >= 0 (0: greedy decoding), got {temperature!r}")
    bundle = _as_bundle(model_or_ckpt)
    model = bundle.model.eval()
    wave, rate = load_prompt(prompt, prompt_sample_rate)
    prompt_codes = encode_prompt(bundle, wave, rate, min_prompt_seconds)
    limit = _budget(bundle, prompt_codes.shape[1])
    if limit < 1:
        raise ValueError(f"the prompt ({prompt_codes.shape[1]} frames) leaves no room in the "
                         "model's context")
    groups = _chunks(bundle, text, limit)
    sampling: dict[str, Any] = {"do_sample": bool(temperature and temperature > 0)}
    if sampling["do_sample"]:
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        sampling.update(temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
    # no EOS before 0.1 s (and 3 frames): Griffin-Lim cannot invert a clip of 1-2 frames
    min_frames = max(3, math.ceil(MIN_SPEECH_SECONDS * bundle.frame_rate))
    totals = {"ar_seconds": 0.0, "nar_seconds": 0.0, "decode_seconds": 0.0, "ar_tokens": 0}
    pieces = []
    pause = torch.zeros(int(pause_seconds * bundle.codec.sample_rate))
    for ids in groups:
        phonemes = torch.tensor(ids, dtype=torch.long)
        cap = int(3 * bundle.frames_per_phoneme * len(ids)) + 10
        cap = min(cap, bundle.model.config.nar.max_len - len(ids) - prompt_codes.shape[1])
        part: dict[str, Any] = {}
        codes = model.synthesize_codes(phonemes, prompt_codes, max_new_tokens=cap,
                                       min_new_tokens=min_frames, stats=part, **sampling)
        start = time.perf_counter()
        audio = bundle.codec.decode(codes)
        totals["decode_seconds"] += time.perf_counter() - start
        for key in ("ar_seconds", "nar_seconds", "ar_tokens"):
            totals[key] += part[key]
        if pieces:
            pieces.append(pause)
        pieces.append(audio.float())
    out = torch.cat(pieces)
    if stats is not None:
        stats.update(totals, audio_seconds=out.numel() / bundle.codec.sample_rate)
    return out, bundle.codec.sample_rate
