"""ImageGPT (Chen et al., 2020): a causal transformer over the pixels of an image.

An image of H x W pixel tokens (grey levels or palette colours, see
:class:`multimodal.tokenizers.image.PixelTokenizer`) is read in raster order
``x_1 .. x_N`` (N = H W) and modelled autoregressively::

    p(x_1 .. x_N) = prod_n p(x_n | x_<n)

The sequence fed to the shared causal backbone is ``[s, x_1, .., x_{N-1}]`` where ``s``
is a start token: one learned vector (unconditional) or one vector per class
(class-conditional). Output position n holds the logits of ``x_{n+1}``.

``forward`` follows the decoder protocol of :mod:`multimodal.generation`, so sampling
(temperature, top-k, top-p, KV cache) is the package's one decoding loop.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.generation import check_sampling_args, generate, next_token
from multimodal.models.api import with_attention_maps
from multimodal.models.backbone import model_config
from multimodal.models.text import NextTokenHead, embed_tokens
from multimodal.nn.block import Transformer
from multimodal.nn.cache import KVCache
from multimodal.nn.embed import as_pair
from multimodal.nn.init import init_weights
from multimodal.nn.position import LearnedPositions
from multimodal.registry import register_model, register_preset
from multimodal.weights import PretrainedMixin

__all__ = ["ImageGPT", "ImageGPTConfig", "bits_per_dim"]


@model_config(dim=256, depth=8, heads=8, norm_eps=1e-5, activation="gelu",
              fixed={"causal": True, "norm": "pre"})
class ImageGPTConfig:
    """``image_size``: int or (H, W) pixels; ``vocab_size``: number of pixel tokens (grey
    levels or palette colours); ``num_classes``: 0 = unconditional, else one start token
    per class. ``backbone`` is causal and pre-norm; sparse self-attention
    (``attention_pattern`` "sliding" / "strided", see nn.masks) against the O(N^2) cost of
    long pixel sequences."""

    image_size: int | tuple[int, int] = 28
    vocab_size: int = 256
    num_classes: int = 0

    def __post_init__(self) -> None:
        h, w = as_pair(self.image_size)
        if h < 1 or w < 1:
            raise ValueError(f"image_size must be positive, got {self.image_size}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size (pixel tokens) must be >= 2, got {self.vocab_size}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0 = unconditional), "
                             f"got {self.num_classes}")

    @property
    def grid(self) -> tuple[int, int]:
        return as_pair(self.image_size)

    @property
    def num_pixels(self) -> int:
        h, w = self.grid
        return h * w


def bits_per_dim(nll_nats: Tensor | float) -> Tensor | float:
    """Mean negative log-likelihood per pixel in nats -> bits per dimension:
    ``bpd = NLL / ln 2`` (a uniform model over K levels scores ``log2 K``)."""
    return nll_nats / math.log(2.0)


@register_model
class ImageGPT(NextTokenHead, PretrainedMixin, nn.Module):
    """Causal transformer over pixel tokens in raster order.

    ``forward(input_ids, class_label=...)`` takes the first n pixel tokens (B, n) of each
    image. Without cache (or with an empty one) the start / class token is put in front
    and the logits (B, n + 1, vocab) predict pixels 1 .. n + 1; with a non-empty
    :class:`KVCache` the n tokens follow the cached ones and the logits (B, n, vocab)
    predict the n pixels after them. ``input_ids`` may be empty (B, 0): the logits of the
    first pixel.
    """

    config_class = ImageGPTConfig
    modality = "image"

    def __init__(self, config: ImageGPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.dim)
        # Row c: start token of class c (unconditional: the one start token, row 0).
        self.start_token = nn.Parameter(torch.zeros(max(config.num_classes, 1), config.dim))
        self.pos_embed = LearnedPositions(config.num_pixels + 1, config.dim)
        self.drop = nn.Dropout(config.dropout)
        self.transformer = Transformer(config.backbone)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.apply(init_weights)
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        nn.init.normal_(self.start_token, std=0.02)

    # -- decoder protocol ------------------------------------------------------------
    @property
    def max_len(self) -> int:
        """Pixel tokens per image (the start token is not counted)."""
        return self.config.num_pixels

    def make_cache(self, max_len: int | None = None) -> KVCache:
        """A KV cache for ``max_len`` pixel tokens (default: the whole image) + the start."""
        return self.transformer.make_cache((max_len or self.max_len) + 1)

    def _check_pixels(self, ids: Tensor, name: str = "input_ids", values: bool = True) -> None:
        """The dtype always; the values (one host sync) only with ``values``."""
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.long, torch.int32,
                                                            torch.int16, torch.uint8):
            got = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"{name} must be an integer tensor of pixel tokens, got {got}")
        if values and ids.numel():
            lo, hi = torch.aminmax(ids)
            lo, hi = int(lo), int(hi)
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(f"{name} holds pixel tokens outside [0, "
                                 f"{self.config.vocab_size}): min {lo}, max {hi}")

    def _class_tokens(self, class_label: Tensor | int | None, batch: int,
                      device: torch.device) -> Tensor:
        """(B, 1, dim) start tokens."""
        n = self.config.num_classes
        if n == 0:
            if class_label is not None:
                raise ValueError("class_label given, but this ImageGPT is unconditional "
                                 "(num_classes=0)")
            return self.start_token[None].expand(batch, -1, -1)
        if class_label is None:
            raise ValueError(f"this ImageGPT is class-conditional ({n} classes): pass "
                             "class_label, an int or a (batch,) tensor of labels")
        labels = torch.as_tensor(class_label, device=device)
        if labels.dim() == 0:
            labels = labels.expand(batch)
        if labels.shape != (batch,) or labels.is_floating_point():
            raise ValueError(f"class_label must be an int or an integer tensor of shape "
                             f"({batch},), got {tuple(labels.shape)} {labels.dtype}")
        if int(labels.min()) < 0 or int(labels.max()) >= n:
            raise ValueError(f"class_label must lie in [0, {n}), got min "
                             f"{int(labels.min())}, max {int(labels.max())}")
        return self.start_token[labels.long()][:, None]

    @property
    def num_features(self) -> int:
        return self.config.dim

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor | None, ...]:
        """The first ``min(16, pixels)`` random pixel tokens of ``batch_size`` images; for a
        class-conditional model also random class labels, as the positional ``class_label``
        (``(ids, None, None, labels)``: no attention mask, no cache)."""
        n = min(16, self.config.num_pixels)
        ids = torch.randint(0, self.config.vocab_size, (batch_size, n))
        if not self.config.num_classes:
            return (ids,)
        return ids, None, None, torch.randint(0, self.config.num_classes, (batch_size,))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        class_label: Tensor | int | None = None,
        return_attention: bool = False,
    ) -> Any:
        """Next-pixel logits; see the class docstring for the shapes.

        ``attention_mask`` is accepted for the decoding protocol; images have no padding,
        so it must be all ones (or None).
        """
        out = self.forward_features(input_ids, attention_mask, cache, class_label,
                                    return_attention)
        if return_attention:
            return self.forward_head(out[0]), out[1]
        return self.forward_head(out)

    def forward_features(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        class_label: Tensor | int | None = None,
        return_attention: bool = False,
    ) -> Any:
        """Hidden states after the final norm, one row per logit row of :meth:`forward`
        (the start / class token first when the cache is empty)."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids must be (batch, pixels) pixel tokens, got "
                             f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
        past = cache.length if cache is not None else 0
        # Values are checked once per sequence (full forward / prefill); a cached decoding
        # step checks the dtype only (no host sync per token), and a bad id there is
        # still caught by the embedding's own bound check (re-raised with a clear message).
        self._check_pixels(input_ids, values=past == 0)
        if attention_mask is not None and past == 0 and not bool(attention_mask.all()):
            raise ValueError("ImageGPT does not take padded prompts: every image prompt must "
                             "have the same number of pixels (attention_mask all ones)")
        b = input_ids.shape[0]
        x = embed_tokens(self.tok_embed, input_ids.long())
        if past == 0:
            x = torch.cat([self._class_tokens(class_label, b, x.device).to(x.dtype), x], dim=1)
        if past + x.shape[1] > self.config.num_pixels + 1:
            raise ValueError(f"{past + x.shape[1] - 1} pixel tokens exceed the image's "
                             f"{self.config.num_pixels}")
        x = self.drop(self.pos_embed(x, offset=past))
        out = self.transformer(x, cache=cache, return_attention=return_attention)
        return with_attention_maps(out, return_attention)

    # -- likelihood ------------------------------------------------------------------
    def _as_sequence(self, tokens: Tensor, name: str) -> Tensor:
        """(B, H, W) or (B, N) pixel tokens -> (B, N) in raster order."""
        h, w = self.config.grid
        if isinstance(tokens, Tensor) and tokens.dim() == 3:
            if tuple(tokens.shape[1:]) != (h, w):
                raise ValueError(f"{name} must be (batch, {h}, {w}) pixel tokens, got "
                                 f"{tuple(tokens.shape)}")
            tokens = tokens.flatten(1)
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            raise ValueError(f"{name} must be (batch, {h}, {w}) or (batch, pixels) tokens, "
                             f"got {getattr(tokens, 'shape', type(tokens).__name__)}")
        self._check_pixels(tokens, name)
        return tokens.long()

    def token_log_probs(self, images_tokens: Tensor,
                        class_label: Tensor | int | None = None) -> Tensor:
        """``log p(x_n | x_<n)`` for every pixel, (B, N), from one forward pass."""
        tokens = self._as_sequence(images_tokens, "images_tokens")
        if tokens.shape[1] != self.config.num_pixels:
            raise ValueError(f"expected whole images of {self.config.num_pixels} pixels, "
                             f"got {tokens.shape[1]}")
        logits = self(tokens[:, :-1], class_label=class_label)
        logp = F.log_softmax(logits.float(), dim=-1)
        return logp.gather(-1, tokens[..., None]).squeeze(-1)

    def log_likelihood(self, images_tokens: Tensor,
                       class_label: Tensor | int | None = None) -> Tensor:
        """Per-image ``log p(x) = sum_n log p(x_n | x_<n)`` in nats, (B,), one forward."""
        return self.token_log_probs(images_tokens, class_label).sum(dim=-1)

    # -- sampling --------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor | None = None,
        max_new_tokens: int | None = None,
        *,
        num_images: int = 4,
        class_label: Tensor | int | None = None,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        num_beams: int = 1,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        compile: bool = False,
        static_cache: bool | None = None,
    ) -> Tensor:
        """Complete images: pixel tokens (num_images, H, W), or ``(num_images, k + T)`` in
        raster order when ``max_new_tokens`` stops before the image is whole.

        ``prompt``: the first pixels of each image in raster order, (num_images, k) tokens
        or (num_images, rows, W) whole rows (e.g. the top half); they are kept and the rest
        is completed (no prompt: ``num_images`` images from nothing). ``max_new_tokens``:
        the rest of the image by default. ``class_label`` (conditional models): an int or
        (num_images,) labels; default ``arange(num_images) % num_classes``. Decoding is
        :func:`multimodal.generation.generate`'s with one default of its own: ImageGPT
        **samples** (``do_sample=True``, then ``temperature`` / ``top_k`` / ``top_p``),
        because greedy decoding of an unconditional model draws ``num_images`` copies of
        one image; ``do_sample=False`` decodes greedily. ``num_beams``,
        ``compile`` / ``static_cache`` as there (the first pixel of an empty prompt is
        drawn alone, greedily or sampled, before the loop).
        """
        check_sampling_args(temperature, top_k, top_p)
        h, w = self.config.grid
        device = self.start_token.device
        if prompt is not None:
            if isinstance(prompt, Tensor) and prompt.dim() == 3:
                if prompt.shape[2] != w:
                    raise ValueError(f"a prompt of whole rows must be (num_images, rows, {w}), "
                                     f"got {tuple(prompt.shape)}")
                prompt = prompt.flatten(1)
            if not isinstance(prompt, Tensor) or prompt.dim() != 2:
                raise ValueError("prompt must be (num_images, pixels) or (num_images, rows, "
                                 f"{w}) pixel tokens, got "
                                 f"{getattr(prompt, 'shape', type(prompt).__name__)}")
            if prompt.shape[1] > self.config.num_pixels:
                raise ValueError(f"prompt of {prompt.shape[1]} pixels is longer than the image "
                                 f"({h}x{w} = {self.config.num_pixels} pixels)")
            self._check_pixels(prompt, "prompt")
            num_images = prompt.shape[0]
            prompt = prompt.long().to(device)
        if not isinstance(num_images, int) or num_images < 1:
            raise ValueError(f"num_images must be a positive int, got {num_images!r}")
        given = 0 if prompt is None else prompt.shape[1]
        room = self.config.num_pixels - given
        if max_new_tokens is None:
            max_new_tokens = room
        if not isinstance(max_new_tokens, int) or not 0 <= max_new_tokens <= room:
            raise ValueError(f"max_new_tokens must be an int in [0, {room}] (the pixels left "
                             f"after a prompt of {given}), got {max_new_tokens!r}")
        if self.config.num_classes and class_label is None:
            class_label = torch.arange(num_images, device=device) % self.config.num_classes
        if class_label is not None:
            class_label = torch.as_tensor(class_label, device=device)
            if class_label.dim() == 0:
                class_label = class_label.expand(num_images)
        sampling = dict(do_sample=do_sample, temperature=temperature, top_k=top_k,
                        top_p=top_p, generator=generator)
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():  # lighter per-step dispatch than no_grad
                if prompt is None:
                    prompt = torch.zeros(num_images, 0, dtype=torch.long, device=device)
                if prompt.shape[1] == 0 and max_new_tokens > 0:
                    # The decoding loop needs one given token: draw the first pixel here.
                    logits = self(prompt, class_label=class_label)[:, -1]
                    prompt = next_token(logits, **sampling)[:, None]
                    max_new_tokens -= 1
                out = generate(self, prompt, max_new_tokens, num_beams=num_beams,
                               use_cache=use_cache, class_label=class_label,
                               compile=compile, static_cache=static_cache, **sampling) \
                    if max_new_tokens > 0 else prompt
        finally:
            self.train(was_training)
        out = out.clone()  # clone: a normal tensor, usable in autograd
        return out.view(num_images, h, w) if out.shape[1] == self.config.num_pixels else out


@register_preset("igpt_fashion_mnist")
def igpt_fashion_mnist(**overrides: Any) -> ImageGPT:
    """The CPU model of configs/igpt_fashion_mnist.yaml: 14x14 grey images quantised to 16
    levels, 4 layers of width 128, unconditional."""
    return ImageGPT(ImageGPTConfig(**{"image_size": 14, "vocab_size": 16, "dim": 128,
                                      "depth": 4, "heads": 4, "mlp_dim": 512,
                                      "num_classes": 0, **overrides}))


@register_preset("igpt_mnist5k")
def igpt_mnist5k(**overrides: Any) -> ImageGPT:
    """The model of configs/igpt_mnist5k.yaml: :func:`igpt_fashion_mnist` conditioned on the
    10 digit classes (a class token starts every image)."""
    return igpt_fashion_mnist(**{"num_classes": 10, **overrides})


@register_preset("igpt_s_32")
def igpt_s_32(**overrides: Any) -> ImageGPT:
    """32x32 images with a 512-colour palette, 8 layers of width 256 (a small iGPT)."""
    return ImageGPT(ImageGPTConfig(**{"image_size": 32, "vocab_size": 512, "dim": 256,
                                      "depth": 8, "heads": 8, **overrides}))


@register_preset("igpt_fashion_mnist_gpu")
def igpt_fashion_mnist_gpu(**overrides: Any) -> ImageGPT:
    """The GPU model of configs/igpt_fashion_mnist_gpu.yaml: 28x28 grey images at all 256
    levels, 8 layers of width 256, conditioned on the 10 classes, dropout 0.1."""
    return ImageGPT(ImageGPTConfig(**{"image_size": 28, "vocab_size": 256, "dim": 256,
                                      "depth": 8, "heads": 8, "mlp_dim": 1024,
                                      "num_classes": 10, "dropout": 0.1, **overrides}))
