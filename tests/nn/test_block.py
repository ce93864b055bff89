"""Block and Transformer against the layer formulas, and the stack's structural properties.

pre-norm:  ``Z = Y(LN(X)) + X``,  ``X~ = MLP(LN(Z)) + Z``
post-norm: ``Z = LN(Y(X) + X)``,  ``X~ = LN(MLP(Z) + Z)``
computed here from the Block's own weights with F.layer_norm, F.gelu and a hand-written
multi-head attention.

The backbone switches, each written out by hand: RMSNorm ``x / sqrt(mean(x^2) + eps) * w``;
SwiGLU / GeGLU ``fc2(act(gate x) * up x)``; quick_gelu ``x sigmoid(1.702 x)``; LayerScale
``X + gamma * branch``; q/k norm; grouped-query attention (query head h reads key/value head
h // group); rotary embeddings as complex rotations ``(a + ib) e^{i p theta_j}``,
``theta_j = base^(-2j / w)``, 1-D and 2-D axial.
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
from multimodal.nn.position import apply_rotary, grid_positions, rotary_angles

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


# --- backbone switches against their formulas ------------------------------------------
def close(got, want):
    """float32 result against a float64 formula, at float32 tolerances."""
    torch.testing.assert_close(got, want.to(got.dtype))


def _ln(x, weight, bias, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * weight + bias


def _rms(x, weight, eps):
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * weight


def _sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def _rotate(x, pos, base=10000.0):
    """Rotate (..., N, d) by positions (N, S) as complex numbers, section by section."""
    n, axes = pos.shape
    d = x.shape[-1]
    w = d // axes
    out = torch.empty_like(x)
    for s in range(axes):
        sec = x[..., s * w:(s + 1) * w]
        z = torch.complex(sec[..., : w // 2], sec[..., w // 2:])
        theta = torch.tensor([base ** (-2 * j / w) for j in range(w // 2)], dtype=torch.float64)
        phase = torch.polar(torch.ones(n, w // 2, dtype=torch.float64),
                            pos[:, s, None].double() * theta)
        r = z * phase
        out[..., s * w:(s + 1) * w] = torch.cat([r.real, r.imag], -1)
    return out


def _attention(attn: Attention, x, *, causal=False, pos=None, base=10000.0):
    """Self-attention from ``attn``'s weights in float64, one query head at a time."""
    d, h, kvh = attn.head_dim, attn.heads, attn.kv_heads
    w = attn.qkv.weight.double()
    b = attn.qkv.bias.double() if attn.qkv.bias is not None else torch.zeros(w.shape[0]).double()
    x = x.double()
    q_all = x @ w[: h * d].T + b[: h * d]
    k_all = x @ w[h * d: (h + kvh) * d].T + b[h * d: (h + kvh) * d]
    v_all = x @ w[(h + kvh) * d:].T + b[(h + kvh) * d:]
    n = x.shape[-2]
    outs = []
    for head in range(h):
        kv = head // (h // kvh)
        q = q_all[..., head * d:(head + 1) * d]
        k = k_all[..., kv * d:(kv + 1) * d]
        v = v_all[..., kv * d:(kv + 1) * d]
        if attn.q_norm is not None:
            qn, kn = attn.q_norm, attn.k_norm
            q = _ln(q, qn.weight.double(), qn.bias.double(), qn.eps)
            k = _ln(k, kn.weight.double(), kn.bias.double(), kn.eps)
        if pos is not None:
            q, k = _rotate(q, pos, base), _rotate(k, pos, base)
        s = q @ k.transpose(-2, -1) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        outs.append(torch.softmax(s, -1) @ v)
    out = torch.cat(outs, -1) @ attn.proj.weight.double().T
    return out + attn.proj.bias.double() if attn.proj.bias is not None else out


def test_rmsnorm_formula():
    t = Transformer(TransformerConfig(dim=16, depth=1, heads=2, norm_type="rmsnorm",
                                      norm_eps=1e-5))
    norm = t.blocks[0].norm1
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 5, 16) * 3 + 1
    close(norm(x), _rms(x.double(), norm.weight.double(), 1e-5))


@pytest.mark.parametrize("act, ref", [
    ("silu", lambda g: g * _sigmoid(g)),
    ("gelu", lambda g: 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))),
])
def test_gated_mlp_formula(act, ref):
    t = Transformer(TransformerConfig(dim=12, depth=1, heads=2, mlp_type="glu", mlp_dim=20,
                                      activation=act, mlp_bias=False))
    mlp = t.blocks[0].mlp
    assert mlp.gate.bias is None and mlp.fc2.bias is None
    x = torch.randn(3, 4, 12)
    g = x.double() @ mlp.gate.weight.double().T
    u = x.double() @ mlp.up.weight.double().T
    want = (ref(g) * u) @ mlp.fc2.weight.double().T
    close(mlp(x), want)


def test_quick_gelu_formula():
    t = Transformer(TransformerConfig(dim=8, depth=1, heads=2, activation="quick_gelu"))
    x = torch.linspace(-6, 6, 101)
    close(t.blocks[0].mlp.act(x), x.double() / (1 + torch.exp(-1.702 * x.double())))


def test_layer_scale_block_formula():
    """Pre-norm with LayerScale: ``Z = X + g1 * Y(LN X)``, ``out = Z + g2 * MLP(LN Z)``."""
    torch.manual_seed(0)
    block = Block(16, 4, 32, layer_scale=0.1)
    with torch.no_grad():
        block.ls1.gamma.uniform_(-1, 1)
        block.ls2.gamma.uniform_(-1, 1)
    x = torch.randn(2, 6, 16)
    xd = x.double()
    n1, n2 = block.norm1, block.norm2
    z = xd + block.ls1.gamma.double() * _attention(
        block.attn, _ln(xd, n1.weight.double(), n1.bias.double(), n1.eps))
    h = _ln(z, n2.weight.double(), n2.bias.double(), n2.eps)
    m = block.mlp
    hid = h @ m.fc1.weight.double().T + m.fc1.bias.double()
    hid = 0.5 * hid * (1 + torch.erf(hid / math.sqrt(2)))
    want = z + block.ls2.gamma.double() * (hid @ m.fc2.weight.double().T + m.fc2.bias.double())
    close(block(x)[0], want)
    assert torch.equal(Block(16, 4, layer_scale=1e-5).ls1.gamma, torch.full((16,), 1e-5))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_query_attention_formula(kv_heads, need_weights):
    torch.manual_seed(kv_heads)
    attn = Attention(32, 4, kv_heads=kv_heads, proj_bias=False)
    assert attn.qkv.weight.shape == (32 + 2 * kv_heads * 8, 32) and attn.proj.bias is None
    x = torch.randn(2, 7, 32)
    got, _ = attn(x, causal=True, need_weights=need_weights)
    close(got, _attention(attn, x, causal=True))


def test_qk_norm_formula():
    torch.manual_seed(1)
    t = Transformer(TransformerConfig(dim=24, depth=1, heads=3, qk_norm=True, norm_eps=1e-6))
    attn = t.blocks[0].attn
    assert attn.q_norm.weight.shape == (8,)
    with torch.no_grad():
        for p in (attn.q_norm.weight, attn.q_norm.bias, attn.k_norm.weight, attn.k_norm.bias):
            p.normal_()
    x = torch.randn(2, 5, 24) * 4
    close(attn(x)[0], _attention(attn, x))


def test_rotary_1d_formula_and_relative_positions():
    x = torch.randn(2, 3, 6, 8)
    pos = torch.arange(6)[:, None]
    got = apply_rotary(x, rotary_angles(pos, 8)[None, None])
    close(got, _rotate(x.double(), pos))
    # rotated q.k depends on the position difference only
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(pq, pk):
        rq = apply_rotary(q, rotary_angles(torch.tensor([[pq]]), 8)[None, None])
        rk = apply_rotary(k, rotary_angles(torch.tensor([[pk]]), 8)[None, None])
        return (rq * rk).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100))
    assert not torch.allclose(score(7, 3), score(3, 7))


def test_rotary_2d_axial_formula():
    pos = grid_positions(2, 3, prefix=1)
    assert pos.tolist() == [[0, 0], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    x = torch.randn(1, 2, 7, 16)
    got = apply_rotary(x, rotary_angles(pos, 16, base=100.0)[None, None])
    close(got, _rotate(x.double(), pos, base=100.0))
    torch.testing.assert_close(got[:, :, :2], x[:, :, :2])  # (0, 0): no rotation


def test_transformer_with_2d_rope_matches_formula():
    torch.manual_seed(2)
    t = Transformer(TransformerConfig(dim=32, depth=1, heads=2, rope="2d", rope_base=50.0,
                                      final_norm=False))
    block = t.blocks[0]
    pos = grid_positions(2, 2, prefix=1)
    x = torch.randn(2, 5, 32)
    n1, n2 = block.norm1, block.norm2
    xd = x.double()
    z = xd + _attention(block.attn, _ln(xd, n1.weight.double(), n1.bias.double(), n1.eps),
                        pos=pos, base=50.0)
    h = _ln(z, n2.weight.double(), n2.bias.double(), n2.eps)
    hid = h @ block.mlp.fc1.weight.double().T + block.mlp.fc1.bias.double()
    hid = 0.5 * hid * (1 + torch.erf(hid / math.sqrt(2)))
    want = z + hid @ block.mlp.fc2.weight.double().T + block.mlp.fc2.bias.double()
    close(t(x, positions=pos), want)
    with pytest.raises(ValueError, match="rope='2d' needs positions"):
        t(x)
    with pytest.raises(ValueError, match="positions for rope='2d' must be"):
        t(x, positions=grid_positions(2, 3))


LLAMA_LIKE = dict(dim=32, depth=2, heads=4, causal=True, norm_type="rmsnorm", mlp_type="glu",
                  activation="silu", qkv_bias=False, proj_bias=False, mlp_bias=False, rope="1d")


@pytest.mark.parametrize("extra", [
    dict(), dict(kv_heads=2), dict(kv_heads=1), dict(kv_heads=2, qk_norm=True, layer_scale=0.5),
    dict(mlp_type="mlp", norm_type="layernorm", kv_heads=2, activation="gelu_tanh"),
])
def test_cached_decoding_equals_full_forward(extra):
    torch.manual_seed(3)
    cfg = TransformerConfig(**{**LLAMA_LIKE, **extra})
    t = Transformer(cfg).eval()
    x = torch.randn(2, 9, 32)
    full = t(x)
    cache = t.make_cache(16)
    steps = [t(x[:, :5], cache=cache)] + [t(x[:, i:i + 1], cache=cache) for i in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full)
    assert cache[0].k.shape == (2, cfg.kv_heads or cfg.heads, 16, 8)  # only the kv heads


def test_rope_1d_explicit_positions_and_padding_shift():
    """Left-padded batches: explicit positions make a padded row equal the unpadded one."""
    torch.manual_seed(4)
    t = Transformer(TransformerConfig(**LLAMA_LIKE, kv_heads=2)).eval()
    x = torch.randn(1, 4, 32)
    padded = torch.cat([torch.randn(1, 2, 32), x], 1)
    pad = torch.tensor([[True, True, False, False, False, False]])
    pos = torch.tensor([[0, 0, 0, 1, 2, 3]])
    out = t(padded, key_padding_mask=pad, positions=pos)
    torch.testing.assert_close(out[:, 2:], t(x))


def test_bad_switches():
    with pytest.raises(ValueError, match=r"multiple of kv_heads \(3\)"):
        Transformer(TransformerConfig(dim=16, depth=1, heads=4, kv_heads=3))
    with pytest.raises(ValueError, match="head_dim divisible by 4"):
        Transformer(TransformerConfig(dim=12, depth=1, heads=2, rope="2d"))(
            torch.randn(1, 4, 12), positions=grid_positions(2, 2))
    with pytest.raises(ValueError, match="rope='none'"):
        Transformer(TransformerConfig(dim=16, depth=1, heads=2))(
            torch.randn(1, 4, 16), positions=torch.arange(4))
    with pytest.raises(ValueError, match="rope must be"):
        Transformer(TransformerConfig(dim=16, depth=1, heads=2, rope="3d"))
    with pytest.raises(ValueError, match="norm_type must be one of"):
        Transformer(TransformerConfig(dim=16, depth=1, heads=2, norm_type="batchnorm"))
