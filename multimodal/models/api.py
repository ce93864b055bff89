"""The one model API (docs/models.md): the verbs every model of the package has.

timm's idea, extended to text, audio and encoder-decoders:

``forward_features(*inputs)``
    the last hidden states ``(B, N, num_features)``, after the final norm
    (encoder-decoders: the decoder's; ViT / audio: prefix tokens included).
``pool(features)``
    one vector per input ``(B, num_features)``: class token or mean (ViT, audio), ``[CLS]``
    through the pooler if any (TextEncoder), the last real token (decoders). Models whose
    inputs pad take their mask as a keyword (``attention_mask``, 1 = token;
    AudioClassifier: ``padding_mask``, True = padding); without one every token counts.
``forward_head(features, pre_logits=False)``
    the head's output: class logits (ViT, AudioClassifier, a TextEncoder with
    ``num_classes``), next-token logits ``(B, N, vocab)`` (decoders), masked-LM logits (a
    TextEncoder with only its MLM head); ``pre_logits=True`` gives ``pool(features)``;
    a model without a head returns the pooled features.
``model(*inputs)``
    ``forward_head(forward_features(*inputs))`` — except the TextEncoder, whose call returns
    ``forward_features`` (hidden states, as ``BertModel`` does).
``generate(...)``
    where the model decodes (TextDecoder, ImageGPT, Captioner, Seq2Seq).
``example_inputs(batch_size)``
    a tuple of valid random inputs, ``model(*model.example_inputs())`` runs.
``config`` / ``config_class`` / ``num_features`` / ``modality`` / ``num_params()`` /
``save_pretrained(path)`` / ``from_pretrained(path)``.

:class:`Model` states the contract as a ``typing.Protocol``; ``tests/test_model_api.py`` runs
it over every registered model class and preset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from multimodal.generation import generate
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID

__all__ = ["MODALITIES", "ClassifierHeadMixin", "DecoderHeadMixin", "Model", "linear_head"]

# what a model reads: one modality, the two of an encoder-decoder ("source-target": image
# in, text out for the Captioner; audio in, text out for Whisper), or two read side by side
# by a dual encoder ("image+text": CLIP / SigLIP, one embedding space for both)
MODALITIES = ("image", "text", "audio", "image+text", "image-text", "text-text", "text-audio",
              "audio-text")


@runtime_checkable
class Model(Protocol):
    """The verbs every model of the package has (module docstring)."""

    config: Any
    config_class: ClassVar[type]
    modality: ClassVar[str]

    @property
    def num_features(self) -> int: ...

    def forward_features(self, *inputs: Any, **kwargs: Any) -> Any: ...

    def pool(self, features: Tensor, *args: Any, **kwargs: Any) -> Tensor: ...

    def forward_head(self, features: Tensor, *args: Any, pre_logits: bool = False,
                     **kwargs: Any) -> Tensor: ...

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]: ...

    def num_params(self, trainable_only: bool = False) -> int: ...

    def save_pretrained(self, path: str | Path) -> Path: ...


def linear_head(dim: int, num_classes: int, generator: torch.Generator | None = None,
                *, empty: Any = None) -> Any:
    """A fresh classifier ``Linear(dim, num_classes)``: weights ~ truncated N(0, 0.02^2)
    (as every model's ``init_weights``), zero bias; ``empty`` (``nn.Identity()`` or None)
    when ``num_classes == 0``. ``generator`` makes the draw reproducible (every rank of a
    distributed run draws the same head)."""
    if num_classes < 0:
        raise ValueError(f"num_classes must be >= 0 (0: no head), got {num_classes}")
    if num_classes == 0:
        return empty
    head = torch.nn.Linear(dim, num_classes)
    with torch.no_grad():
        draw = torch.randn(num_classes, dim, generator=generator)
        head.weight.copy_(draw.clamp_(-2.0, 2.0) * 0.02)  # N(0, 1) truncated at +-2 std
        head.bias.zero_()
    return head


class ClassifierHeadMixin:
    """timm's ``reset_classifier``: a new head of ``num_classes`` outputs (0: none, the
    model then returns pooled features), ``config.num_classes`` updated to match, so the
    model saves and reloads with its new shape. The head sits at ``self.head`` (and DeiT's
    ``self.head_dist``); its input width is ``num_features``."""

    config: Any
    _EMPTY_HEAD: ClassVar[str] = "identity"  # what num_classes=0 leaves: "identity" / "none"

    def reset_classifier(self, num_classes: int,
                         generator: torch.Generator | None = None) -> None:
        dim = self.num_features  # type: ignore[attr-defined]
        empty = torch.nn.Identity() if self._EMPTY_HEAD == "identity" else None
        ref = next(iter(self.parameters()))  # type: ignore[attr-defined]
        head = linear_head(dim, num_classes, generator, empty=empty)
        self.head = head.to(ref.device) if head is not None else None
        if getattr(self.config, "distill_token", False) and hasattr(self, "head_dist"):
            dist = linear_head(dim, num_classes, generator)
            self.head_dist = dist.to(ref.device) if dist is not None else None
        self.config.num_classes = int(num_classes)


class DecoderHeadMixin:
    """``pool`` / ``forward_head`` / ``num_features`` / ``generate`` of an encoder-decoder,
    whose features are those of its decoder at ``self.decoder``: the last real target
    token, next-token logits (B, T, vocab). A model supplies :meth:`decoding_inputs`."""

    decoder: Any

    @property
    def num_features(self) -> int:
        return self.decoder.num_features

    def pool(self, features: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The last real target token's features (B, decoder.dim)."""
        return self.decoder.pool(features, attention_mask)

    def forward_head(self, features: Tensor, pre_logits: bool = False,
                     attention_mask: Tensor | None = None) -> Tensor:
        """Next-token logits (B, T, vocab) (``pre_logits``: :meth:`pool`)."""
        return self.decoder.forward_head(features, pre_logits, attention_mask)

    def decoding_inputs(self, source_ids: Tensor,
                        source_mask: Tensor | None = None) -> dict[str, Any]:
        """What the decoder needs from the source at every step (``memory``,
        ``memory_padding_mask``, ...), passed to the decoder through ``generate``."""
        raise NotImplementedError

    @torch.no_grad()
    def generate(self, source_ids: Tensor, source_mask: Tensor | None = None,
                 max_new_tokens: int | None = None, *, bos_token_id: int = BOS_ID,
                 eos_token_id: int | None = EOS_ID, pad_token_id: int = PAD_ID,
                 **kwargs: Any) -> Tensor:
        """Decode a target for each source, starting from ``[BOS]``; returns
        (B, 1 + generated) ids, ``[PAD]`` after ``[EOS]``; at most ``max_target_len - 1``
        new tokens by default. Other keyword arguments (``num_beams``, ``do_sample``,
        ``top_p``, ``use_cache`` ...) go to :func:`multimodal.generation.generate`."""
        was_training = self.training  # type: ignore[attr-defined]
        self.eval()  # type: ignore[attr-defined]
        try:
            source = self.decoding_inputs(source_ids, source_mask)
            start = source_ids.new_full((source_ids.shape[0], 1), bos_token_id)
            steps = max_new_tokens if max_new_tokens is not None \
                else self.config.max_target_len - 1  # type: ignore[attr-defined]
            return generate(self.decoder, start, steps, eos_token_id=eos_token_id,
                            pad_token_id=pad_token_id, **source, **kwargs)
        finally:
            self.train(was_training)  # type: ignore[attr-defined]
