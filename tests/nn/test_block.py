"""Block and Transformer against the layer formulas, and the stack's structural properties.

pre-norm:  ``Z = Y(LN(X)) + X``,  ``X~ = MLP(LN(Z)) + Z``
post-norm: ``Z = LN(Y(X) + X)``,  ``X~ = LN(MLP(Z) + Z)``
computed here from the Block's own weights with F.layer_norm, F.gelu and a hand-written
multi-head attention.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multimodal.nn import (
    Attention,
    Block,
    LearnedPositions,
    SinusoidalPositions,
    Transformer,
    TransformerConfig,
)

# float32 results against a float64 formula: torch.testing's float32 defaults (rtol scales
# with magnitude, about ten float32 ulps; atol covers values near zero).
ATOL = 1e-5
RTOL = 1.3e-6


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed=None) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` written as exp / sum; ``allowed`` (N, M) bool or None."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    if allowed is not None:
        e = e * allowed
    return e / e.sum(dim=-1, keepdim=True) @ v


def mha(attn: Attention, x: torch.Tensor, mem: torch.Tensor | None = None, causal=False):
    """Multi-head attention from ``attn``'s weights, one head at a time (float64)."""
    dim, heads = attn.dim, attn.heads
    d = dim // heads
    if mem is None:
        w, b = attn.qkv.weight.double(), attn.qkv.bias.double()
        wq, bq, wk, bk, wv, bv = w[:dim], b[:dim], w[dim:2 * dim], b[dim:2 * dim], w[2 * dim:], \
            b[2 * dim:]
        mem = x
    else:
        wq, bq = attn.q.weight.double(), attn.q.bias.double()
        w, b = attn.kv.weight.double(), attn.kv.bias.double()
        wk, bk, wv, bv = w[:dim], b[:dim], w[dim:], b[dim:]
    n, m = x.shape[-2], mem.shape[-2]
    allowed = torch.tensor([[j <= i for j in range(m)] for i in range(n)]) if causal else None
    heads_out = []
    for h in range(heads):
        r = slice(h * d, (h + 1) * d)
        heads_out.append(attend(x @ wq[r].T + bq[r], mem @ wk[r].T + bk[r],
                                mem @ wv[r].T + bv[r], allowed))
    return torch.cat(heads_out, -1) @ attn.proj.weight.double().T + attn.proj.bias.double()


def ln(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight.double(), norm.bias.double(),
                        norm.eps)


def mlp(block: Block, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    h = F.gelu(x @ block.mlp.fc1.weight.double().T + block.mlp.fc1.bias.double(),
               approximate=approximate)
    return h @ block.mlp.fc2.weight.double().T + block.mlp.fc2.bias.double()


def randomize_norms(module: nn.Module) -> None:
    """Non-trivial LayerNorm weights so that a swapped or missing norm shows."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)


def block_by_hand(block: Block, x, mem=None, causal=False, approximate="none"):
    x = x.double()
    mem = mem.double() if mem is not None else None
    with torch.no_grad():
        if block.norm_first:
            z = mha(block.attn, ln(x, block.norm1), causal=causal) + x
            if block.cross_attn is not None:
                z = mha(block.cross_attn, ln(z, block.norm_cross), mem) + z
            return mlp(block, ln(z, block.norm2), approximate) + z
        z = ln(mha(block.attn, x, causal=causal) + x, block.norm1)
        if block.cross_attn is not None:
            z = ln(mha(block.cross_attn, z, mem) + z, block.norm_cross)
        return ln(mlp(block, z, approximate) + z, block.norm2)


# --- Block = formula -----------------------------------------------------------------


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("causal", [False, True])
def test_block_matches_layer_formula(norm: str, causal: bool) -> None:
    block = Block(12, 3, 20, norm=norm, norm_layer=lambda d: nn.LayerNorm(d, eps=1e-6)).eval()
    randomize_norms(block)
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        y, _ = block(x, causal=causal)
    torch.testing.assert_close(y.double(), block_by_hand(block, x, causal=causal),
                               atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_with_cross_attention_matches_formula(norm: str) -> None:
    block = Block(8, 2, 16, norm=norm, cross_attention=True, memory_dim=6).eval()
    randomize_norms(block)
    x, mem = torch.randn(2, 4, 8), torch.randn(2, 7, 6)
    with torch.no_grad():
        y, (w_self, w_cross) = block(x, mem, causal=True, need_weights=True)
    torch.testing.assert_close(y.double(), block_by_hand(block, x, mem, causal=True),
                               atol=ATOL, rtol=RTOL)
    assert w_self.shape == (2, 2, 4, 4) and w_cross.shape == (2, 2, 4, 7)


def test_gelu_tanh_activation_uses_tanh_approximation() -> None:
    cfg = TransformerConfig(dim=8, depth=1, heads=2, mlp_dim=16, activation="gelu_tanh")
    model = Transformer(cfg).eval()
    block = model.blocks[0]
    randomize_norms(block)
    # Large pre-activations make the two GELUs differ clearly.
    with torch.no_grad():
        block.mlp.fc1.weight.mul_(8.0)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        y, _ = block(x)
    tanh = block_by_hand(block, x, approximate="tanh")
    exact = block_by_hand(block, x, approximate="none")
    torch.testing.assert_close(y.double(), tanh, atol=ATOL, rtol=RTOL)
    assert (y.double() - exact).abs().max() > 1e-4


def test_transformer_stack_is_blocks_then_final_norm() -> None:
    cfg = TransformerConfig(dim=8, depth=2, heads=2, mlp_dim=16, norm_eps=1e-6)
    model = Transformer(cfg).eval()
    randomize_norms(model)
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        y = model(x)
    want = block_by_hand(model.blocks[1], block_by_hand(model.blocks[0], x).float())
    torch.testing.assert_close(y.double(), ln(want, model.norm), atol=ATOL, rtol=RTOL)
    assert model.norm.eps == 1e-6 and model.blocks[0].norm1.eps == 1e-6
    post = Transformer(TransformerConfig(dim=8, depth=1, heads=2, norm="post"))
    assert isinstance(post.norm, nn.Identity)


# --- structural properties -----------------------------------------------------------


def tiny(**kw) -> Transformer:
    cfg = TransformerConfig(**{"dim": 8, "depth": 2, "heads": 2, "mlp_dim": 16, **kw})
    return Transformer(cfg).eval()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_is_permutation_equivariant(norm: str) -> None:
    model = tiny(norm=norm)
    x = torch.randn(2, 6, 8)
    perm = torch.randperm(6)
    with torch.no_grad():
        torch.testing.assert_close(model(x[:, perm]), model(x)[:, perm], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_positions_break_permutation_equivariance(positions: str) -> None:
    pos = SinusoidalPositions(16, 8) if positions == "sinusoidal" else LearnedPositions(16, 8, 1.0)
    model = nn.Sequential(pos, tiny()).eval()
    x = torch.randn(2, 6, 8)
    perm = torch.tensor([1, 0, 2, 3, 5, 4])
    with torch.no_grad():
        diff = (model(x[:, perm]) - model(x)[:, perm]).abs().max()
    assert diff > 1e-3


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_causal_output_ignores_future_tokens(norm: str) -> None:
    x = torch.randn(2, 6, 8)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(2, 2, 8)  # change tokens 4 and 5
    decoder, encoder = tiny(norm=norm, causal=True), tiny(norm=norm)
    with torch.no_grad():
        y, y2 = decoder(x), decoder(x2)
        torch.testing.assert_close(y[:, :4], y2[:, :4], atol=ATOL, rtol=RTOL)
        assert (y[:, 4:] - y2[:, 4:]).abs().max() > 1e-3
        e, e2 = encoder(x), encoder(x2)
    assert (e[:, :4] - e2[:, :4]).abs().max() > 1e-3


def test_key_padding_hides_padded_tokens() -> None:
    model = tiny()
    x = torch.randn(1, 5, 8)
    x2 = x.clone()
    x2[:, 3:] = torch.randn(1, 2, 8)
    pad = torch.tensor([[False, False, False, True, True]])
    with torch.no_grad():
        y, y2 = model(x, key_padding_mask=pad), model(x2, key_padding_mask=pad)
        short = model(x[:, :3])
    torch.testing.assert_close(y[:, :3], y2[:, :3], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(y[:, :3], short, atol=ATOL, rtol=RTOL)


def test_return_attention_maps() -> None:
    model = tiny(cross_attention=True, memory_dim=4, causal=True)
    x, mem = torch.randn(2, 5, 8), torch.randn(2, 3, 4)
    with torch.no_grad():
        y, maps = model(x, mem, return_attention=True)
        torch.testing.assert_close(y, model(x, mem), atol=ATOL, rtol=RTOL)
    assert len(maps["self"]) == 2 and len(maps["cross"]) == 2
    assert maps["self"][0].shape == (2, 2, 5, 5) and maps["cross"][0].shape == (2, 2, 5, 3)
    assert (maps["self"][1].triu(1) == 0).all()


# --- gradients -----------------------------------------------------------------------


def test_gradients_reach_every_parameter() -> None:
    model = tiny(cross_attention=True, memory_dim=6, causal=True).train()
    x, mem = torch.randn(2, 5, 8), torch.randn(2, 4, 6)
    y = model(x, mem)
    (y * torch.randn_like(y)).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().max() > 0, name


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_checkpoint_activations_gives_same_gradients(norm: str) -> None:
    plain = tiny(norm=norm, cross_attention=True, causal=True).train()
    ckpt = copy.deepcopy(plain)
    ckpt.config.checkpoint_activations = True
    x, mem = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    target = torch.randn(2, 5, 8)
    for model in (plain, ckpt):
        ((model(x, mem) - target) ** 2).mean().backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5, msg=name)


# --- bad input -----------------------------------------------------------------------


def test_bad_input_raises_value_error_naming_expected_and_given() -> None:
    enc = tiny()
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"\(batch, tokens, 8\).*\(2, 5, 6\)"):
        enc(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"\(2, 5\).*\(2, 4\)"):
        enc(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool.*torch\.int64"):
        enc(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(5, 5\).*\(5, 4\)"):
        enc(x, attn_mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool.*torch\.float32"):
        enc(x, attn_mask=torch.ones(5, 5))
    with pytest.raises(ValueError, match="no cross-attention"):
        enc(x, torch.randn(2, 3, 8))
    dec = tiny(cross_attention=True, memory_dim=6, causal=True)
    with pytest.raises(ValueError, match="pass memory"):
        dec(x)
    with pytest.raises(ValueError, match=r"\(2, tokens, 6\).*\(2, 3, 8\)"):
        dec(x, torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        dec(x, torch.randn(2, 3, 6), memory_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="activation"):
        Transformer(TransformerConfig(activation="swish"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'pre' or 'post'"):
        Block(8, 2, norm="middle")  # type: ignore[arg-type]


# --- torch.compile -------------------------------------------------------------------


@pytest.mark.slow
def test_torch_compile_matches_eager_on_cpu() -> None:
    model = tiny(causal=True, cross_attention=True)
    x, mem = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    compiled = torch.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, mem), model(x, mem), atol=1e-5, rtol=1e-5)
