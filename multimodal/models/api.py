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

from torch import Tensor

__all__ = ["MODALITIES", "DecoderHeadMixin", "Model"]

# what a model reads: one modality, or the two of an encoder-decoder ("source-target")
MODALITIES = ("image", "text", "audio", "image-text", "text-text")


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


class DecoderHeadMixin:
    """``pool`` / ``forward_head`` / ``num_features`` of an encoder-decoder, whose features
    are those of its :class:`~multimodal.models.text.TextDecoder` at ``self.decoder``: the
    last real target token, next-token logits (B, T, vocab)."""

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
