"""Block and Transformer: the one layer stack every model in the package shares (its small
layers in :mod:`multimodal.nn.layers`, its one-token decoding step in :mod:`multimodal.nn.step`).

Two layer orders (reference notes, "Transformer layer"):

- post-norm (original Transformer, BERT): ``Z = LN(Y(X) + X)``, ``X~ = LN(MLP(Z) + Z)``
- pre-norm (GPT-2, ViT):                 ``Z = Y(LN(X)) + X``, ``X~ = MLP(LN(Z)) + Z``

where ``Y`` is multi-head self-attention. A decoder Block adds a cross-attention
sub-layer between the two, with its own residual and norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.utils.checkpoint import checkpoint

from multimodal.nn.attention import Attention
from multimodal.nn.cache import KVCache, LayerCache, StaticKVCache
from multimodal.nn.init import off_meta
from multimodal.nn.layers import (
    ACTIVATIONS,
    MLP,
    ActLayer,
    DropPath,
    GatedMLP,
    LayerScale,
    NormLayer,
    RMSNorm,
)
from multimodal.nn.masks import PATTERNS, pattern_mask
from multimodal.nn.position import rotary_angles
from multimodal.nn.step import StepPlan, block_step, plan_block, static_step


class Block(nn.Module):
    """Self-attention, optional cross-attention and MLP, each with a residual.

    Layers are passed in: ``norm_layer(dim)`` builds each norm, ``act_layer()`` the MLP
    activation, ``attn_layer(dim, heads, qkv_bias=, attn_dropout=, proj_dropout=[, cross=,
    memory_dim=])`` each attention and ``mlp_layer(dim, hidden_dim, act_layer, dropout)`` the
    MLP. ``norm="pre"`` or ``"post"`` picks the layer order (module docstring).
    ``layer_scale``: each residual branch is scaled by a learned per-channel ``gamma``
    (initialised to this value) before it is added: ``Z = X + gamma_1 * Y(LN(X))``.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_dim: int | None = None,
        *,
        norm: Literal["pre", "post"] = "pre",
        norm_layer: NormLayer = nn.LayerNorm,
        act_layer: ActLayer = nn.GELU,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        cross_attention: bool = False,
        memory_dim: int | None = None,
        attn_layer: Callable[..., nn.Module] = Attention,
        mlp_layer: Callable[..., nn.Module] = MLP,
        layer_scale: float | None = None,
    ) -> None:
        super().__init__()
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        self.norm_first = norm == "pre"
        attn = partial(attn_layer, dim, heads, qkv_bias=qkv_bias, attn_dropout=attn_dropout,
                       proj_dropout=dropout)
        self.norm1 = norm_layer(dim)
        self.attn = attn()
        self.norm_cross = norm_layer(dim) if cross_attention else None
        self.cross_attn = attn(cross=True, memory_dim=memory_dim) if cross_attention else None
        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(dim, mlp_dim or 4 * dim, act_layer, dropout)
        self.drop_path = DropPath(drop_path)
        scale = (lambda: LayerScale(dim, layer_scale)) if layer_scale is not None \
            else nn.Identity
        self.ls1, self.ls2 = scale(), scale()
        self.ls_cross = scale() if cross_attention else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        rope: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
        self_kw = dict(causal=causal, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                       cache=cache, need_weights=need_weights)
        if rope is not None:
            self_kw["rope"] = rope
        cross_kw = dict(key_padding_mask=memory_padding_mask, cache=cache,
                        need_weights=need_weights)
        w_cross = None
        if self.norm_first:
            y, w_self = self.attn(self.norm1(x), **self_kw)
            x = x + self.drop_path(self.ls1(y))
            if self.cross_attn is not None:
                y, w_cross = self.cross_attn(self.norm_cross(x), memory, **cross_kw)
                x = x + self.drop_path(self.ls_cross(y))
            x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))
        else:
            y, w_self = self.attn(x, **self_kw)
            x = self.norm1(x + self.drop_path(self.ls1(y)))
            if self.cross_attn is not None:
                y, w_cross = self.cross_attn(x, memory, **cross_kw)
                x = self.norm_cross(x + self.drop_path(self.ls_cross(y)))
            x = self.norm2(x + self.drop_path(self.ls2(self.mlp(x))))
        return x, (w_self, w_cross)

    def can_step(self) -> bool:
        """Whether :meth:`step` computes exactly what ``forward`` computes for one new token
        with a cache in eval mode: a pre-norm block without cross-attention whose attention,
        MLP and Linears are the plain classes (not LoRA-wrapped), full multi-head (no
        grouped-query, no q/k norm), no LayerScale, and no hooks on these modules."""
        attn, mlp = self.attn, self.mlp
        if not self.norm_first or self.cross_attn is not None or type(attn) is not Attention \
                or type(mlp) is not MLP or attn.kv_heads != attn.heads \
                or attn.q_norm is not None or type(self.ls1) is not nn.Identity \
                or type(self.ls2) is not nn.Identity:
            return False
        linears = (attn.qkv, attn.proj, mlp.fc1, mlp.fc2)
        if any(type(m) is not nn.Linear for m in linears):
            return False
        return not any(m._forward_hooks or m._forward_pre_hooks
                       for m in (self, attn, mlp, self.norm1, self.norm2, mlp.act, *linears))

    def step_plan(self) -> StepPlan:
        """What :func:`block_step` needs of this block (when :meth:`can_step`): the
        Linear weights as they are, (out, in) (no copy: the parameters themselves), the
        biases as (out, 1) columns, the norm parameters, the norm / activation as plain
        functions. Taken once per decoding cache by :class:`Transformer`, so a step reads
        no module attributes (at batch 4 on a CPU, ``nn.Module.__getattr__`` for ~30
        attributes per block cost ~8 % of the step)."""
        return plan_block(self)


# Layer variants chosen by name in TransformerConfig (``norm_type``, ``mlp_type``,
# ``attention_type``): a new variant is one entry here (and a value of the Literal), never a
# fork of Block or Transformer. Signatures: norm ``(dim, eps=)``; MLP and attention as
# Block calls them (its docstring).
NORM_LAYERS: dict[str, Callable[..., nn.Module]] = {"layernorm": nn.LayerNorm,
                                                   "rmsnorm": RMSNorm}
# "glu": GatedMLP, SwiGLU with activation "silu", GeGLU with "gelu" / "gelu_tanh"
MLP_LAYERS: dict[str, Callable[..., nn.Module]] = {"mlp": MLP, "glu": GatedMLP}
ATTENTION_LAYERS: dict[str, Callable[..., nn.Module]] = {"mha": Attention}


@dataclass
class TransformerConfig:
    """Width, depth and layer choices of the shared backbone; every model config nests
    one as ``backbone``."""

    dim: int = 192
    depth: int = 12
    heads: int = 3
    mlp_dim: int | None = None  # default 4 * dim
    norm: Literal["pre", "post"] = "pre"
    norm_eps: float = 1e-6
    activation: Literal["gelu", "gelu_tanh", "relu", "silu", "quick_gelu"] = "gelu"
    qkv_bias: bool = True
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0  # stochastic depth, linearly increasing to this value
    causal: bool = False
    cross_attention: bool = False
    memory_dim: int | None = None  # width of the cross-attention memory (default dim)
    final_norm: bool | None = None  # default: True for pre-norm, False for post-norm
    checkpoint_activations: bool = False  # recompute each Block in backward (saves memory)
    # Sparse self-attention (multimodal.nn.masks): "sliding" = local window of
    # attention_window keys, "strided" = Child et al. (2019) with stride attention_window.
    attention_pattern: Literal["full", "sliding", "strided"] = "full"
    attention_window: int = 256
    # layer variants, by name (NORM_LAYERS, MLP_LAYERS, ATTENTION_LAYERS)
    norm_type: Literal["layernorm", "rmsnorm"] = "layernorm"
    mlp_type: Literal["mlp", "glu"] = "mlp"
    attention_type: Literal["mha"] = "mha"
    # modern encoder / decoder switches
    proj_bias: bool = True  # bias of the attention output projection
    mlp_bias: bool = True  # biases of the MLP's Linears
    kv_heads: int | None = None  # grouped-query attention (1: multi-query); default heads
    qk_norm: bool = False  # norm (norm_type, width dim / heads) on each head's q and k
    layer_scale: float | None = None  # LayerScale init value; None: no LayerScale
    # rotary position embedding inside attention: "1d" over token index (text; positions
    # continue after the cache), "2d" axial over (row, column) of a patch grid
    rope: Literal["none", "1d", "2d"] = "none"
    rope_base: float = 10000.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Transformer(nn.Module):
    """A stack of :class:`Block` plus a final norm; an encoder or a (cross-attending) decoder.

    Input tokens (B, N, dim) already carry their positions: positions belong to the
    tokenizer/model, so the stack itself is permutation-equivariant when not causal.
    """

    def __init__(self, config: TransformerConfig, norm_layer: NormLayer | None = None) -> None:
        super().__init__()
        if config.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, "
                             f"got {config.activation!r}")
        if config.attention_pattern not in PATTERNS:
            raise ValueError(f"attention_pattern must be one of {PATTERNS}, "
                             f"got {config.attention_pattern!r}")
        if config.attention_pattern != "full" and config.attention_window < 1:
            raise ValueError(f"attention_window must be >= 1, got {config.attention_window}")
        for kind, name, table in (("norm_type", config.norm_type, NORM_LAYERS),
                                  ("mlp_type", config.mlp_type, MLP_LAYERS),
                                  ("attention_type", config.attention_type, ATTENTION_LAYERS)):
            if name not in table:
                raise ValueError(f"{kind} must be one of {sorted(table)}, got {name!r}")
        if config.rope not in ("none", "1d", "2d"):
            raise ValueError(f"rope must be 'none', '1d' or '2d', got {config.rope!r}")
        self.config = config
        norm_layer = norm_layer or partial(NORM_LAYERS[config.norm_type], eps=config.norm_eps)
        attn_layer = partial(ATTENTION_LAYERS[config.attention_type],
                             proj_bias=config.proj_bias, kv_heads=config.kv_heads,
                             qk_norm_layer=norm_layer if config.qk_norm else None)
        mlp_layer = partial(MLP_LAYERS[config.mlp_type], bias=config.mlp_bias)
        with off_meta():
            rates = torch.linspace(0, config.drop_path, config.depth).tolist()
        self.blocks = nn.ModuleList(
            Block(
                config.dim, config.heads, config.mlp_dim,
                norm=config.norm, norm_layer=norm_layer,
                act_layer=ACTIVATIONS[config.activation], qkv_bias=config.qkv_bias,
                dropout=config.dropout, attn_dropout=config.attn_dropout, drop_path=rate,
                cross_attention=config.cross_attention, memory_dim=config.memory_dim,
                attn_layer=attn_layer, mlp_layer=mlp_layer, layer_scale=config.layer_scale,
            )
            for rate in rates
        )
        final = config.final_norm if config.final_norm is not None else config.norm == "pre"
        self.norm = norm_layer(config.dim) if final else nn.Identity()

    def _can_step(self) -> bool:
        """Whether a one-token cached step may take :func:`block_step` (a plain config, no
        global module hooks, every block :meth:`~Block.can_step`)."""
        cfg = self.config
        if cfg.rope != "none" or cfg.attention_pattern != "full" \
                or _module._global_forward_hooks or _module._global_forward_pre_hooks:
            return False
        return all(block.can_step() for block in self.blocks)

    def _step_plans(self, cache: KVCache) -> list[StepPlan] | None:
        """The blocks' :meth:`~Block.step_plan` for one-token steps on ``cache``, or None
        where a step must take the general path. Taken on the cache's first one-token step
        and kept with it (the blocks' checks and attribute reads cost ~8 % of a step at
        batch 4 on a CPU): hooks, LoRA, replaced modules and changed weights while one
        cache is being decoded are not seen before the next cache (train mode and global
        hooks are checked every step)."""
        if _module._global_forward_hooks or _module._global_forward_pre_hooks:
            return None
        if cache.step_owner is not self:
            cache.step_plans = ([block.step_plan() for block in self.blocks]
                                if self._can_step() else None)
            cache.step_owner = self
        return cache.step_plans

    def _can_static_step(self, cache: StaticKVCache) -> bool:
        """Whether :func:`static_step` serves a one-token step on ``cache``: full
        attention (no sparse pattern), the package's :class:`Attention` in every block, and
        the cross-attention keys / values already projected (at prefill)."""
        if self.config.attention_pattern != "full" or len(cache) != len(self.blocks):
            return False
        for block, layer in zip(self.blocks, cache.layers, strict=True):
            if type(block.attn) is not Attention or layer.k is None:
                return False
            if block.cross_attn is not None and (type(block.cross_attn) is not Attention
                                                 or layer.cross_kv is None):
                return False
        return True

    def _static_step(self, x: Tensor, cache: StaticKVCache, key_padding_mask: Tensor | None,
                     memory_padding_mask: Tensor | None, positions: Tensor | None) -> Tensor:
        """One token on a static cache: the eager checks and the rotary angles here, the
        fixed-shape rest in ``cache.step_fn`` (compiled) or :func:`static_step`."""
        b, t = x.shape[0], cache.length
        if key_padding_mask is not None and (key_padding_mask.shape != (b, t + 1)
                                             or key_padding_mask.dtype != torch.bool):
            raise ValueError(f"key_padding_mask must be a bool tensor of shape {(b, t + 1)}, "
                             f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
        rope = self._rope_angles(x, positions, cache)
        assert cache.position is not None and cache.valid is not None
        cache.position.fill_(t)
        cache.mark(t, 1, b, x.device, key_padding_mask)
        layers = cache.layers
        step = cache.step_fn or static_step
        valid = cache.valid[:, : t + 1] if cache.prefix else cache.valid
        out = step(self, x, tuple(layer.k for layer in layers),
                   tuple(layer.v for layer in layers),
                   tuple(layer.cross_kv for layer in layers), cache.position, valid,
                   rope, memory_padding_mask, cache.padded or not cache.prefix)
        cache.advance()
        return out

    def make_cache(self, max_len: int) -> KVCache:
        """An empty :class:`KVCache` for up to ``max_len`` tokens."""
        return KVCache(len(self.blocks), max_len)

    def _check_inputs(
        self, x: Tensor, memory: Tensor | None, key_padding_mask: Tensor | None,
        memory_padding_mask: Tensor | None, cache: KVCache | None,
    ) -> None:
        dim = self.config.dim
        if x.dim() != 3 or x.shape[-1] != dim:
            raise ValueError(f"expected tokens of shape (batch, tokens, {dim}), "
                             f"got {tuple(x.shape)}")
        b, n, _ = x.shape
        past = cache.length if cache is not None else 0
        if key_padding_mask is not None:
            want = (b, past + n)
            if key_padding_mask.shape != want or key_padding_mask.dtype != torch.bool:
                raise ValueError(f"key_padding_mask must be a bool tensor of shape {want}, "
                                 f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
        if cache is not None:
            if len(cache) != len(self.blocks):
                raise ValueError(f"cache has {len(cache)} layers, the model {len(self.blocks)}")
            if past + n > cache.max_len:
                raise ValueError(f"sequence of {past + n} tokens is longer than the cache "
                                 f"({cache.max_len})")
        if self.config.cross_attention:
            first_step = cache is None or cache[0].cross_kv is None
            if memory is None and first_step:
                raise ValueError("this Transformer has cross-attention: pass memory "
                                 "(the encoder output, shape (batch, tokens, memory_dim))")
            if memory is not None:
                mdim = self.config.memory_dim or dim
                if memory.dim() != 3 or memory.shape[0] != b or memory.shape[-1] != mdim:
                    raise ValueError(f"memory must be ({b}, tokens, {mdim}), "
                                     f"got {tuple(memory.shape)}")
                if memory_padding_mask is not None and (
                    memory_padding_mask.shape != memory.shape[:2]
                ):
                    raise ValueError(f"memory_padding_mask must be {tuple(memory.shape[:2])}, "
                                     f"got {tuple(memory_padding_mask.shape)}")
        elif memory is not None:
            raise ValueError("memory given, but this Transformer has no cross-attention")

    def _with_pattern(
        self, attn_mask: Tensor | None, n: int, cache: KVCache | None, device: torch.device
    ) -> Tensor | None:
        """``attn_mask`` AND the config's sparse pattern over (n new, past + n) keys."""
        cfg = self.config
        if cfg.attention_pattern == "full":
            return attn_mask
        past = cache.length if cache is not None else 0
        pattern = pattern_mask(cfg.attention_pattern, n, past + n, cfg.attention_window,
                               cfg.causal, device)
        if attn_mask is None:
            return pattern
        if attn_mask.dtype != torch.bool or attn_mask.shape[-2:] != pattern.shape:
            raise ValueError(f"attn_mask must be a bool tensor (True = may attend) ending in "
                             f"(queries, keys) = {tuple(pattern.shape)}, "
                             f"got {attn_mask.dtype} {tuple(attn_mask.shape)}")
        return attn_mask & pattern

    def _rope_angles(self, x: Tensor, positions: Tensor | None,
                     cache: KVCache | None) -> Tensor | None:
        """Rotary angles (B or 1, 1, N, axes, head_dim / 2 axes) of the new tokens."""
        cfg = self.config
        b, n = x.shape[:2]
        if cfg.rope == "none":
            if positions is not None:
                raise ValueError("positions were given but this Transformer has rope='none'")
            return None
        axes = 1 if cfg.rope == "1d" else 2
        if positions is None:
            if axes == 2:
                raise ValueError("rope='2d' needs positions: (tokens, 2) (row, column) of "
                                 "each token, e.g. nn.position.grid_positions(h, w, prefix)")
            past = cache.length if cache is not None else 0
            positions = torch.arange(past, past + n, device=x.device)
        if axes == 1:
            positions = positions[..., None]
        if positions.dim() == 2:
            positions = positions[None]
        if positions.dim() != 3 or positions.shape[1:] != (n, axes) \
                or positions.shape[0] not in (1, b):
            want = f"({n},) or ({b}, {n})" if axes == 1 else f"({n}, 2) or ({b}, {n}, 2)"
            raise ValueError(f"positions for rope={cfg.rope!r} must be {want}, "
                             f"got {tuple(positions.shape)}")
        return rotary_angles(positions, cfg.dim // cfg.heads, cfg.rope_base)[:, None]

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
        return_attention: bool = False,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, dict[str, list[Tensor]]]:
        """Transform tokens ``x`` (B, N, dim).

        ``key_padding_mask`` (B, past + N) and ``memory_padding_mask`` (B, M) are True at
        padding. ``attn_mask`` (N, M) or (B, N, M) is True where attention is allowed
        (e.g. a sliding window), combined with the causal mask and with the config's
        ``attention_pattern`` (built here for the new tokens against past + new keys, so a
        cache sees the same pattern as a full forward). With ``cache`` the new
        tokens follow the cached ones. ``return_attention=True`` also returns
        ``{"self": [...], "cross": [...]}``, one (B, heads, N, keys) map per layer.

        ``positions`` (rotary configs only): each new token's position, (N,) or (B, N) for
        ``rope="1d"`` (default: ``past, ..., past + N - 1``), (N, 2) or (B, N, 2) (row,
        column; see :func:`~multimodal.nn.position.grid_positions`) for ``rope="2d"``.
        """
        if isinstance(cache, StaticKVCache):
            if x.dim() == 3 and x.shape[1] == 1 and not self.training \
                    and not return_attention and attn_mask is None and cache.valid is not None \
                    and 0 < cache.length < cache.max_len and self._can_static_step(cache) \
                    and x.shape[0] == cache.valid.shape[0] and x.shape[2] == self.config.dim:
                return self._static_step(x, cache, key_padding_mask, memory_padding_mask,
                                         positions)
            self._check_inputs(x, memory, key_padding_mask, memory_padding_mask, cache)
            cache.mark(cache.length, x.shape[1], x.shape[0], x.device, key_padding_mask)
        elif cache is not None and x.dim() == 3 and x.shape[1] == 1 and not self.training \
                and not return_attention and memory is None and key_padding_mask is None \
                and attn_mask is None and positions is None and cache.length < cache.max_len \
                and len(cache) == len(self.blocks) and x.shape[2] == self.config.dim:
            plans = self._step_plans(cache)
            if plans is not None:
                # one decoding step: the lean path, bit-identical to the loop below
                b = x.shape[0]
                x = x.reshape(b, x.shape[2])
                for plan, layer_cache in zip(plans, cache.layers, strict=True):
                    x = block_step(x, plan, layer_cache)
                return self.norm(x.view(b, 1, x.shape[1]))
        self._check_inputs(x, memory, key_padding_mask, memory_padding_mask, cache)
        attn_mask = self._with_pattern(attn_mask, x.shape[1], cache, x.device)
        rope = self._rope_angles(x, positions, cache)
        maps: dict[str, list[Tensor]] = {"self": [], "cross": []}
        for i, block in enumerate(self.blocks):
            kw = dict(causal=self.config.causal, key_padding_mask=key_padding_mask,
                      memory_padding_mask=memory_padding_mask, attn_mask=attn_mask,
                      cache=cache[i] if cache is not None else None,
                      need_weights=return_attention, rope=rope)
            if self.config.checkpoint_activations and self.training and cache is None:
                x, (w_self, w_cross) = checkpoint(
                    partial(block, **kw), x, memory, use_reentrant=False
                )
            else:
                x, (w_self, w_cross) = block(x, memory, **kw)
            if return_attention:
                maps["self"].append(w_self)
                if w_cross is not None:
                    maps["cross"].append(w_cross)
        x = self.norm(x)
        return (x, maps) if return_attention else x
