"""Whisper (Radford et al., 2022): speech recognition as an encoder-decoder on the shared
backbone.

The encoder is an :class:`~multimodal.models.audio.AudioClassifier` without head
(``mode="conv"``: two convolutions, the second of stride 2, over the 80 (or 128) bin
log-mel of a 30 s window, learned positions, pre-norm blocks, final LayerNorm); the
decoder a :class:`~multimodal.models.text.TextDecoder` with ``cross_attention=True``:
learned positions (448), causal self-attention, cross-attention to the encoder's 1500
tokens, GELU MLP, final LayerNorm, the output projection tied to the token embedding.
Neither is a fork: both are configs of the one :class:`~multimodal.nn.block.Transformer`.

Decoding goes through the package's one loop, :func:`multimodal.generation.generate`
(greedy, beam search, sampling; KV cache: self-attention keys/values appended per step,
cross-attention keys/values projected once from the encoder output), with Whisper's
token rules as its ``logits_processor`` (:class:`WhisperLogitsProcessor`).

Whisper's special-token rules (the decoder's prompt and its constraints)
-----------------------------------------------------------------------
The decoder starts from a prompt of special tokens, :meth:`Whisper.prompt`::

    <|startoftranscript|> [<|lang|> <|transcribe|>|<|translate|>] <|notimestamps|>

- ``<|startoftranscript|>`` (``sot_token_id``) always opens the transcript.
- A multilingual model (vocabulary of 51865 tokens or more, Whisper's own rule) then
  takes a language token ``<|en|>``, ``<|de|>``, ... (``first_language_token_id + i``
  for ``languages[i]``) and a task token. With ``language=None`` the language is
  detected: one decoder step on ``<|startoftranscript|>`` and the most likely language
  token wins (:meth:`Whisper.detect_language`). English-only models (``.en``) take
  neither language nor task.
- ``<|notimestamps|>`` asks for text only (this package decodes without timestamps).
- ``suppress_tokens`` (the model's list: non-speech symbols and the special tokens that
  must never be generated) get ``-inf`` at every step; ``begin_suppress_tokens`` (the
  space ``" "`` and ``<|endoftext|>``) get ``-inf`` at the first generated position only,
  so a transcript never starts empty or with a blank. In beam search the rules apply to
  the log-probabilities (as transformers does: the kept tokens are not renormalised).
- ``<|endoftext|>`` (``eot_token_id``) ends the transcript.

Input: a 16 kHz waveform (``generate(waveform=...)``; longer than 30 s is cut, shorter
is padded with silence to 30 s, as Whisper's feature extractor does) or features
(``(B, 3000, n_mels)``, already ``(L + 4) / 4`` normalised, see
:mod:`multimodal.tokenizers.audio_frontends`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from multimodal.generation import generate
from multimodal.models.api import DecoderHeadMixin
from multimodal.models.audio import AudioClassifier, AudioClassifierConfig
from multimodal.models.text import TextDecoder, TextDecoderConfig
from multimodal.registry import register_model
from multimodal.weights import PretrainedMixin

__all__ = ["WHISPER_LANGUAGES", "Whisper", "WhisperConfig", "WhisperLogitsProcessor"]

#: Whisper's language codes in the order of their tokens (``<|en|>`` first)
WHISPER_LANGUAGES: tuple[str, ...] = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv",
    "it", "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no",
    "th", "ur", "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr",
    "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw",
    "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu",
    "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
)


def _default_encoder() -> AudioClassifierConfig:
    """Whisper tiny's encoder (80 mels, 30 s = 3000 frames -> 1500 tokens, width 384)."""
    return AudioClassifierConfig(
        num_classes=0, pool="mean", mode="conv", n_mels=80, pos_embed="learned",
        pos_frames=3000, max_frames=3000, frontend="whisper", dim=384, depth=4, heads=6,
        mlp_dim=1536, norm_eps=1e-5, activation="gelu", qkv_bias=True)


def _default_decoder() -> TextDecoderConfig:
    """Whisper tiny.en's decoder (51864 tokens, 448 positions)."""
    return TextDecoderConfig(vocab_size=51864, max_len=448, dim=384, depth=4, heads=6,
                             mlp_dim=1536, norm_eps=1e-5, activation="gelu",
                             pos_embed="learned", tie_embeddings=True)


@dataclass
class WhisperConfig:
    """An encoder config, a decoder config and Whisper's special tokens (module docstring).

    ``decoder.cross_attention`` is always True and ``decoder.memory_dim`` the encoder
    width; ``encoder.num_classes`` is 0. Token ids default to those of the English-only
    vocabulary (tiny.en); :func:`multimodal.convert.ctranslate2.from_ctranslate2` and the
    transformers converter fill them in from the model's tokenizer / config.
    """

    encoder: AudioClassifierConfig = field(default_factory=_default_encoder)
    decoder: TextDecoderConfig = field(default_factory=_default_decoder)
    eot_token_id: int = 50256
    sot_token_id: int = 50257
    first_language_token_id: int = 50258
    languages: tuple[str, ...] = WHISPER_LANGUAGES
    translate_token_id: int = 50357
    transcribe_token_id: int = 50358
    no_timestamps_token_id: int = 50362
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = (220, 50256)
    multilingual: bool | None = None  # default: vocab_size >= 51865 (Whisper's rule)

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = AudioClassifierConfig(**self.encoder)
        if isinstance(self.decoder, dict):
            self.decoder = TextDecoderConfig(**self.decoder)
        enc, dec = self.encoder, self.decoder
        if enc.mode != "conv" or enc.frontend != "whisper":
            raise ValueError("a Whisper encoder has mode='conv' and frontend='whisper', got "
                             f"mode={enc.mode!r}, frontend={enc.frontend!r}")
        self.encoder = dataclasses.replace(enc, num_classes=0)
        self.decoder = dataclasses.replace(dec, cross_attention=True, memory_dim=enc.dim)
        self.languages = tuple(self.languages)
        self.suppress_tokens = tuple(int(t) for t in self.suppress_tokens)
        self.begin_suppress_tokens = tuple(int(t) for t in self.begin_suppress_tokens)
        if self.multilingual is None:
            self.multilingual = dec.vocab_size >= 51865
        ids = {n: getattr(self, n) for n in ("eot_token_id", "sot_token_id",
                                             "translate_token_id", "transcribe_token_id",
                                             "no_timestamps_token_id")}
        ids.update({f"suppress_tokens[{i}]": t for i, t in enumerate(self.suppress_tokens)})
        ids.update({f"begin_suppress_tokens[{i}]": t
                    for i, t in enumerate(self.begin_suppress_tokens)})
        for name, value in ids.items():
            if not 0 <= value < dec.vocab_size:
                raise ValueError(f"{name}={value} is outside the decoder vocabulary "
                                 f"[0, {dec.vocab_size})")


class WhisperLogitsProcessor:
    """Whisper's constraints on the next token (module docstring): ``suppress`` ids get
    ``-inf`` at every step, ``begin_suppress`` ids at the first generated position
    (sequences of ``prompt_len`` tokens). A ``logits_processor`` of
    :func:`multimodal.generation.generate`: ``(ids (B, N), scores (B, V)) -> scores``."""

    def __init__(self, suppress: tuple[int, ...], begin_suppress: tuple[int, ...],
                 prompt_len: int, vocab_size: int) -> None:
        self.prompt_len = prompt_len
        self.suppress = torch.tensor(sorted(set(suppress)), dtype=torch.long)
        self.begin = torch.tensor(sorted(set(begin_suppress)), dtype=torch.long)
        if (self.suppress >= vocab_size).any() or (self.begin >= vocab_size).any():
            raise ValueError(f"suppressed token ids must be < vocab_size={vocab_size}")

    def __call__(self, ids: Tensor, scores: Tensor) -> Tensor:
        drop = self.suppress
        if ids.shape[1] == self.prompt_len and self.begin.numel():
            drop = torch.cat([drop, self.begin])
        if drop.numel() == 0:
            return scores
        scores = scores.clone()
        scores[:, drop.to(scores.device)] = float("-inf")
        return scores


@register_model
class Whisper(DecoderHeadMixin, PretrainedMixin, nn.Module):
    """Log-mel features (B, 3000, n_mels) + token ids (B, T) -> next-token logits
    (B, T, vocab); ``generate`` transcribes (module docstring). The model API's features
    are the decoder's hidden states (``pool``: the last token's, ``forward_head``: the
    logits)."""

    config_class = WhisperConfig
    modality = "audio-text"

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = AudioClassifier(config.encoder)
        self.decoder = TextDecoder(config.decoder)

    @property
    def max_len(self) -> int:
        """Longest token sequence (prompt included) the decoder reads (448)."""
        return self.decoder.max_len

    # -- encoder ----------------------------------------------------------------------
    def features(self, waveform: Any, sample_rate: int | None = None) -> Tensor:
        """Normalised log-mel ``(B, 3000, n_mels)`` of waveforms (one clip ``(T,)``, a
        batch ``(B, T)`` or a list of clips), each padded with silence (or cut) to 30 s."""
        feats, _ = self.encoder.features_from_waveform(waveform, sample_rate=sample_rate)
        return feats

    def encode(self, features: Tensor | None = None, *, waveform: Any = None,
               sample_rate: int | None = None) -> Tensor:
        """The encoder output (B, 1500, dim) of features or waveforms (exactly one)."""
        if (features is None) == (waveform is None):
            raise ValueError("give exactly one of features=(B, frames, n_mels) or waveform=")
        if waveform is not None:
            features = self.features(waveform, sample_rate)
        frames = self.config.encoder.max_frames
        if features.dim() == 3 and features.shape[1] != frames:
            raise ValueError(f"Whisper reads windows of exactly {frames} frames (30 s), got "
                             f"features of shape {tuple(features.shape)}; pad with zeros "
                             "or pass waveform=")
        # the front end computes in float32; the layers may run in another dtype (bf16)
        weight = self.encoder.embed.conv1.weight
        if weight.is_floating_point() and features.is_floating_point():
            features = features.to(weight.dtype)
        return self.encoder.forward_features(features)

    def to_compute_dtype(self, dtype: torch.dtype) -> Whisper:
        """Cast the layers (not the log-mel front end, which stays float32) to ``dtype``,
        e.g. ``torch.bfloat16`` on a CPU with native bf16; returns ``self``."""
        self.encoder.embed.to(dtype)
        self.encoder.transformer.to(dtype)
        if self.encoder.pos_table is not None:
            self.encoder.pos_table.data = self.encoder.pos_table.data.to(dtype)
        self.decoder.to(dtype)
        return self

    # -- teacher forcing --------------------------------------------------------------
    def forward(self, features: Tensor, input_ids: Tensor) -> Tensor:
        """Next-token logits (B, T, vocab)."""
        return self.forward_head(self.forward_features(features, input_ids))

    def forward_features(self, features: Tensor, input_ids: Tensor, *,
                         return_attention: bool = False) -> Any:
        """The decoder's hidden states (B, T, dim) after its final norm.

        ``return_attention=True`` returns ``(hidden, AttentionMaps)``: ``self_attn`` and
        ``cross_attn``, one ``(B, heads, T, keys)`` map of attention probabilities per decoder
        layer; ``cross_attn[l][b, h, t]`` is where token ``t`` looked among the 1500 encoder frames
        (20 ms each) in layer ``l``, head ``h`` (transformers' ``cross_attentions``).
        Teacher-force the ids ``generate`` returned to see where each word was heard."""
        return self.decoder.forward_features(input_ids, memory=self.encode(features),
                                             return_attention=return_attention)

    def decoding_inputs(self, features: Tensor, source_mask: Tensor | None = None
                        ) -> dict[str, Any]:
        """The encoder output the decoder cross-attends to."""
        return {"memory": self.encode(features)}

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random features of one 30 s window and the English prompt."""
        feats = torch.randn(batch_size, self.config.encoder.max_frames,
                            self.config.encoder.n_mels)
        ids = torch.tensor([self.prompt("en" if self.config.multilingual else None)])
        return feats, ids.repeat(batch_size, 1)

    # -- special tokens ---------------------------------------------------------------
    def language_token(self, language: str) -> int:
        cfg = self.config
        if language not in cfg.languages:
            raise ValueError(f"unknown language {language!r}; Whisper knows "
                             f"{', '.join(cfg.languages)}")
        return cfg.first_language_token_id + cfg.languages.index(language)

    def prompt(self, language: str | None = None, task: str = "transcribe") -> list[int]:
        """The decoder prompt (module docstring): ``[sot, lang, task, notimestamps]`` for
        a multilingual model, ``[sot, notimestamps]`` for an English-only one."""
        cfg = self.config
        if task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {task!r}")
        if not cfg.multilingual:
            if language not in (None, "en") or task != "transcribe":
                raise ValueError("this Whisper is English-only: it transcribes English "
                                 f"(got language={language!r}, task={task!r})")
            return [cfg.sot_token_id, cfg.no_timestamps_token_id]
        if language is None:
            raise ValueError("a multilingual Whisper's prompt needs a language (or let "
                             "generate detect it: language=None there)")
        task_id = cfg.transcribe_token_id if task == "transcribe" else cfg.translate_token_id
        return [cfg.sot_token_id, self.language_token(language), task_id,
                cfg.no_timestamps_token_id]

    @torch.no_grad()
    def detect_language(self, memory: Tensor) -> list[str]:
        """The most likely language of each clip: the decoder's scores after
        ``<|startoftranscript|>``, over the language tokens only."""
        cfg = self.config
        sot = torch.full((memory.shape[0], 1), cfg.sot_token_id, dtype=torch.long,
                         device=memory.device)
        logits = self.decoder(sot, memory=memory)[:, -1]
        first = cfg.first_language_token_id
        best = logits[:, first : first + len(cfg.languages)].argmax(dim=-1)
        return [cfg.languages[i] for i in best.tolist()]

    # -- decoding -----------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        features: Tensor | None = None,
        max_new_tokens: int | None = None,
        *,
        waveform: Any = None,
        sample_rate: int | None = None,
        language: str | None = None,
        task: str = "transcribe",
        num_beams: int = 1,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        compile: bool = False,
        static_cache: bool | None = None,
    ) -> Tensor:
        """Token ids (B, P + T): the prompt (:meth:`prompt`), the transcript, then
        ``<|endoftext|>`` (rows that end early are padded with it). One 30 s window per
        row; the encoder runs once per call. ``max_new_tokens`` defaults to the rest of
        the decoder's 448 positions. Beam search stops as transformers' does by default
        (``early_stopping=False``: see :func:`multimodal.generation.generate`).
        ``compile`` / ``static_cache``: the decoder steps through a static KV cache of
        the decoder's whole context (``max_len`` positions: one shape, so one compiled
        step serves every call with the same batch size), compiled with
        ``torch.compile`` (or eager), see :func:`multimodal.generation.generate`; the same
        tokens."""
        cfg = self.config
        was_training = self.training
        self.eval()
        try:
            memory = self.encode(features, waveform=waveform, sample_rate=sample_rate)
            batch = memory.shape[0]
            if cfg.multilingual and language is None:
                langs = self.detect_language(memory)
            else:
                langs = [language] * batch
            prompts = [self.prompt(lang, task) for lang in langs]
            start = torch.tensor(prompts, dtype=torch.long, device=memory.device)
            steps = self.max_len - start.shape[1] if max_new_tokens is None else max_new_tokens
            static = compile if static_cache is None else static_cache
            rules = WhisperLogitsProcessor(cfg.suppress_tokens, cfg.begin_suppress_tokens,
                                           start.shape[1], cfg.decoder.vocab_size)
            return generate(self.decoder, start, steps, do_sample=do_sample,
                            temperature=temperature, top_k=top_k, top_p=top_p,
                            num_beams=num_beams, length_penalty=length_penalty,
                            eos_token_id=cfg.eot_token_id, pad_token_id=cfg.eot_token_id,
                            generator=generator, use_cache=use_cache,
                            logits_processor=rules, early_stopping=early_stopping,
                            compile=compile, static_cache=static_cache,
                            cache_len=self.max_len if use_cache and static else None,
                            memory=memory)
        finally:
            self.train(was_training)

    def text_tokens(self, ids: Tensor) -> list[list[int]]:
        """Each row of :meth:`generate`'s output without its prompt, cut at the first
        ``<|endoftext|>``, special tokens (ids >= ``<|endoftext|>``) dropped."""
        eot = self.config.eot_token_id
        rows = []
        for row in ids.tolist():
            start = 0
            while start < len(row) and row[start] > eot:  # the prompt: special tokens
                start += 1
            text = row[start:]
            text = text[: text.index(eot)] if eot in text else text
            rows.append([t for t in text if t < eot])
        return rows
