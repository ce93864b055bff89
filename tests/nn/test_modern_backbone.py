"""Modern backbone switches against their formulas, written out here by hand.

RMSNorm ``x / sqrt(mean(x^2) + eps) * w``; SwiGLU / GeGLU ``fc2(act(gate x) * up x)``;
quick_gelu ``x sigmoid(1.702 x)``; LayerScale ``X + gamma * branch``; q/k norm; grouped-query
attention (query head h reads key/value head h // group); rotary embeddings as complex
rotations ``(a + ib) e^{i p theta_j}``, ``theta_j = base^(-2j / w)``, 1-D and 2-D axial.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from multimodal.nn import Attention, Block, Transformer, TransformerConfig
from multimodal.nn.position import apply_rotary, grid_positions, rotary_angles


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


def test_switches_reach_model_configs():
    """A backbone switch is a TransformerConfig field, so every model config accepts it."""
    import multimodal as mm

    model = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=50, max_len=16, dim=16, depth=1,
                                                heads=4, kv_heads=2, norm_type="rmsnorm",
                                                mlp_type="glu", activation="silu"))
    blk = model.transformer.blocks[0]
    assert isinstance(blk.norm1, nn.Module) and blk.attn.kv_heads == 2
    assert hasattr(blk.mlp, "gate")


# -- ViT: register tokens, attention pooling, 2-D rotary ---------------------------------
def _vit(**kw):
    import multimodal as mm

    base = dict(image_size=16, patch_size=4, dim=32, depth=2, heads=4, num_classes=0)
    return mm.ViT(mm.ViTConfig(**{**base, **kw})).eval()


def test_vit_register_tokens_follow_class_token_without_positions():
    torch.manual_seed(5)
    vit = _vit(registers=3)
    assert vit.num_prefix_tokens == 4 and vit.pos_embed.shape == (1, 1 + 16, 32)
    images = torch.randn(2, 3, 16, 16)
    patches = vit.patch_embed(images)
    want = torch.cat([(vit.cls_token + vit.pos_embed[:, :1]).expand(2, -1, -1),
                      vit.reg_token.expand(2, -1, -1), patches + vit.pos_embed[:, 1:]], 1)
    torch.testing.assert_close(vit.embed(images), want)
    feats = vit.forward_features(images)
    assert feats.shape == (2, 20, 32)
    torch.testing.assert_close(vit.forward_head(feats), feats[:, 0])
    mean_vit = _vit(registers=3, pool="mean")
    f = mean_vit.forward_features(images)
    torch.testing.assert_close(mean_vit.forward_head(f), f[:, 4:].mean(1))  # patches only


def test_vit_attention_pooling_formula():
    """MAP: ``z = softmax(q k^T / sqrt(d)) v W_o`` with q from the probe, ``y = z + MLP(LN z)``."""
    torch.manual_seed(6)
    vit = _vit(pool="map")
    pool = vit.attn_pool
    x = torch.randn(2, 17, 32).double()
    a = pool.attn
    q = pool.probe.double() @ a.q.weight.double().T + a.q.bias.double()
    kv = x @ a.kv.weight.double().T + a.kv.bias.double()
    k, v = kv[..., :32], kv[..., 32:]
    heads = []
    for h in range(4):
        r = slice(8 * h, 8 * h + 8)
        s = q[..., r] @ k[..., r].transpose(-2, -1) / math.sqrt(8)
        heads.append(torch.softmax(s, -1) @ v[..., r])
    z = torch.cat(heads, -1) @ a.proj.weight.double().T + a.proj.bias.double()
    n = pool.norm
    h1 = _ln(z, n.weight.double(), n.bias.double(), n.eps) @ pool.mlp.fc1.weight.double().T \
        + pool.mlp.fc1.bias.double()
    h1 = 0.5 * h1 * (1 + torch.erf(h1 / math.sqrt(2)))
    want = (z + h1 @ pool.mlp.fc2.weight.double().T + pool.mlp.fc2.bias.double())[:, 0]
    close(vit.pool(x.float()), want)


def test_vit_2d_rope_gets_grid_positions():
    """A rope='2d' ViT rotates by (row, column): moving the image content moves features."""
    torch.manual_seed(7)
    vit = _vit(pos_embed="none", rope="2d", registers=1)
    assert vit.pos_embed is None
    images = torch.randn(1, 3, 16, 16)
    x = vit.embed(images)
    want = vit.transformer(x, positions=grid_positions(4, 4, prefix=2))
    torch.testing.assert_close(vit.forward_features(images), want)
    assert not torch.allclose(want, vit.transformer(x, positions=grid_positions(4, 4, 2) * 2))
