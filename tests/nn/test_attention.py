"""Attention against its formula: parameter-free, SDPA vs explicit, masks, multi-head, cross.

Every expectation is computed here from ``softmax(Q K^T / sqrt(d_k)) V`` (float64, softmax
written as exp / sum), never by calling the code under test a second way.
"""

from __future__ import annotations

import math

import pytest
import torch

from multimodal.nn import Attention, scaled_dot_product_attention, simple_self_attention

# The modules compute in float32; results are compared with a float64 reference, so the
# tolerances are torch.testing's float32 defaults: rtol (about ten float32 ulps) scales with
# the values' magnitude, atol covers values near zero.
ATOL = 1e-5
RTOL = 1.3e-6


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``a_nm = exp(s_nm) / sum_k exp(s_nk)``, ``s = q k^T / sqrt(d)``, over allowed keys only.

    A row with no allowed key gets zero weights. Float64 throughout.
    """
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    if allowed is not None:
        e = e * allowed.double()
    z = e.sum(dim=-1, keepdim=True)
    weights = torch.where(z > 0, e / z.clamp_min(1e-300), torch.zeros_like(e))
    return weights @ v, weights


def bottom_right_causal(n: int, m: int) -> torch.Tensor:
    """Query n (the last n of m positions) may see key j iff j <= n + (m - n_queries)."""
    return torch.tensor([[j <= i + (m - n) for j in range(m)] for i in range(n)])


# --- parameter-free self-attention ---------------------------------------------------


def test_simple_self_attention_matches_loops() -> None:
    x = torch.randn(5, 3, dtype=torch.float64)
    y, a = simple_self_attention(x)
    rows = x.tolist()
    for n in range(5):
        logits = [sum(p * r for p, r in zip(rows[n], rows[m], strict=True)) for m in range(5)]
        exps = [math.exp(s) for s in logits]
        total = sum(exps)
        for m in range(5):
            assert a[n, m].item() == pytest.approx(exps[m] / total, abs=1e-12)
        for d in range(3):
            want = sum(exps[m] / total * rows[m][d] for m in range(5))
            assert y[n, d].item() == pytest.approx(want, abs=1e-12)
    assert (a >= 0).all()
    torch.testing.assert_close(a.sum(-1), torch.ones(5, dtype=torch.float64))


def test_simple_self_attention_batched_rows_sum_to_one() -> None:
    x = torch.randn(2, 4, 6)
    y, a = simple_self_attention(x)
    assert y.shape == (2, 4, 6) and a.shape == (2, 4, 4)
    assert (a >= 0).all()
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 4))


# --- scaled_dot_product_attention ----------------------------------------------------


def _qkv(b: int = 2, h: int = 3, n: int = 5, m: int = 5, d: int = 4):
    return torch.randn(b, h, n, d), torch.randn(b, h, m, d), torch.randn(b, h, m, d)


def _masks(b: int, n: int, m: int) -> dict[str, torch.Tensor | None]:
    pad = torch.zeros(b, m, dtype=torch.bool)
    pad[0, -2:] = True  # last two keys of sample 0 are padding
    keep_keys = (~pad)[:, None, None, :]  # (B, 1, 1, M)
    causal = bottom_right_causal(n, m)
    return {
        "none": None,
        "causal": causal,
        "padding": keep_keys,
        "causal+padding": causal & keep_keys,
    }


@pytest.mark.parametrize("name", ["none", "causal", "padding", "causal+padding"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_sdpa_matches_formula_with_masks(name: str, need_weights: bool) -> None:
    q, k, v = _qkv()
    mask = _masks(2, 5, 5)[name]
    out, w = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    want_out, want_w = reference_attention(q, k, v, mask)
    torch.testing.assert_close(out.double(), want_out, atol=ATOL, rtol=RTOL)
    if need_weights:
        assert w is not None and w.shape == (2, 3, 5, 5)
        torch.testing.assert_close(w.double(), want_w, atol=ATOL, rtol=RTOL)
        if mask is not None:
            assert (w.masked_select(~mask.expand_as(w)) == 0).all()
    else:
        assert w is None


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("n", [5, 2])
def test_sdpa_causal_flag_is_bottom_right_in_both_paths(need_weights: bool, n: int) -> None:
    q, k, v = _qkv(n=n, m=5)
    out, _ = scaled_dot_product_attention(q, k, v, causal=True, need_weights=need_weights)
    want, _ = reference_attention(q, k, v, bottom_right_causal(n, 5))
    torch.testing.assert_close(out.double(), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("need_weights", [False, True])
def test_sdpa_causal_flag_combines_with_mask(need_weights: bool) -> None:
    q, k, v = _qkv()
    keep = _masks(2, 5, 5)["padding"]
    out, _ = scaled_dot_product_attention(q, k, v, keep, causal=True, need_weights=need_weights)
    want, _ = reference_attention(q, k, v, keep & bottom_right_causal(5, 5))
    torch.testing.assert_close(out.double(), want, atol=ATOL, rtol=RTOL)


def test_sdpa_scale_is_one_over_sqrt_dk() -> None:
    # One query, two keys, values one-hot: output = softmax weights = sigmoid(s0 - s1).
    d = 16
    q = torch.ones(1, 1, 1, d)
    k = torch.stack([torch.ones(d), torch.zeros(d)])[None, None]
    v = torch.eye(2)[None, None]
    out, _ = scaled_dot_product_attention(q, k, v)
    p = 1.0 / (1.0 + math.exp(-d / math.sqrt(d)))
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([p, 1 - p]), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_row_gives_zero_not_nan(need_weights: bool) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv())
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[1, :, 2, :] = False  # query 2 of sample 1 may attend nothing
    out, w = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    assert not out.isnan().any()
    assert (out[1, :, 2] == 0).all()
    want, _ = reference_attention(q.detach(), k.detach(), v.detach(), mask)
    torch.testing.assert_close(out.detach().double(), want, atol=ATOL, rtol=RTOL)
    if need_weights:
        assert w is not None and (w[1, :, 2] == 0).all() and not w.isnan().any()
    (out * torch.randn_like(out)).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert (q.grad[1, :, 2] == 0).all()  # the empty row depends on nothing


def test_sdpa_rejects_non_bool_mask() -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"bool.*torch\.float32"):
        scaled_dot_product_attention(q, k, v, torch.zeros(5, 5))


# --- multi-head Attention module -----------------------------------------------------


def _heads_by_hand(x, mem, wq, bq, wk, bk, wv, bv, wo, bo, heads, allowed=None):
    """``Concat_h[Attn(x Wq_h, mem Wk_h, mem Wv_h)] Wo`` with a Python loop over heads.

    ``allowed``: (B, N, M) bool or None.
    """
    dim = wq.shape[0]
    d = dim // heads
    outs = []
    for h in range(heads):
        rows = slice(h * d, (h + 1) * d)
        qh = x @ wq[rows].T + bq[rows]
        kh = mem @ wk[rows].T + bk[rows]
        vh = mem @ wv[rows].T + bv[rows]
        outs.append(reference_attention(qh, kh, vh, allowed)[0])
    return torch.cat(outs, dim=-1) @ wo.T.double() + bo.double()


def _self_weights(attn: Attention):
    w, b, dim = attn.qkv.weight.detach(), attn.qkv.bias.detach(), attn.dim
    return (w[:dim], b[:dim], w[dim : 2 * dim], b[dim : 2 * dim], w[2 * dim :], b[2 * dim :],
            attn.proj.weight.detach(), attn.proj.bias.detach())


@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_self_attention_matches_per_head_loop(need_weights: bool) -> None:
    attn = Attention(12, 3).eval()
    x = torch.randn(2, 6, 12)
    with torch.no_grad():
        y, w = attn(x, need_weights=need_weights)
    want = _heads_by_hand(x, x, *_self_weights(attn), heads=3)
    torch.testing.assert_close(y.double(), want, atol=ATOL, rtol=RTOL)
    if need_weights:
        assert w is not None and w.shape == (2, 3, 6, 6)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 6))


def test_multihead_self_attention_with_causal_and_padding() -> None:
    attn = Attention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    allowed = bottom_right_causal(5, 5)[None] & ~pad[:, None, :]
    with torch.no_grad():
        y, _ = attn(x, causal=True, key_padding_mask=pad)
        y_w, _ = attn(x, causal=True, key_padding_mask=pad, need_weights=True)
    want = _heads_by_hand(x, x, *_self_weights(attn), heads=2, allowed=allowed)
    torch.testing.assert_close(y.double(), want, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(y_w.double(), want, atol=ATOL, rtol=RTOL)


def test_multihead_self_attention_with_custom_attn_mask() -> None:
    attn = Attention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    window = torch.tensor([[abs(i - j) <= 1 for j in range(5)] for i in range(5)])
    with torch.no_grad():
        y, _ = attn(x, causal=True, attn_mask=window)
    want = _heads_by_hand(x, x, *_self_weights(attn), heads=2,
                          allowed=window & bottom_right_causal(5, 5))
    torch.testing.assert_close(y.double(), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("need_weights", [False, True])
def test_cross_attention_matches_per_head_loop(need_weights: bool) -> None:
    dim, mem_dim, heads = 12, 7, 4
    attn = Attention(dim, heads, cross=True, memory_dim=mem_dim).eval()
    x, mem = torch.randn(2, 3, dim), torch.randn(2, 9, mem_dim)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    with torch.no_grad():
        y, w = attn(x, mem, key_padding_mask=pad, need_weights=need_weights)
    wkv, bkv = attn.kv.weight.detach(), attn.kv.bias.detach()
    want = _heads_by_hand(
        x, mem, attn.q.weight.detach(), attn.q.bias.detach(),
        wkv[:dim], bkv[:dim], wkv[dim:], bkv[dim:],
        attn.proj.weight.detach(), attn.proj.bias.detach(),
        heads=heads, allowed=~pad[:, None, :],
    )
    torch.testing.assert_close(y.double(), want, atol=ATOL, rtol=RTOL)
    if need_weights:
        assert w is not None and w.shape == (2, heads, 3, 9)
        assert (w[1, :, :, 6:] == 0).all()


def test_attention_without_bias() -> None:
    attn = Attention(8, 2, qkv_bias=False).eval()
    assert attn.qkv.bias is None
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        y, _ = attn(x)
    wq, wk, wv = attn.qkv.weight.detach().split(8)
    zero = torch.zeros(8)
    want = _heads_by_hand(x, x, wq, zero, wk, zero, wv, zero, attn.proj.weight.detach(),
                          attn.proj.bias.detach(), heads=2)
    torch.testing.assert_close(y.double(), want, atol=ATOL, rtol=RTOL)


def test_attention_bad_inputs_raise_value_error() -> None:
    with pytest.raises(ValueError, match=r"dim \(10\).*heads \(3\)"):
        Attention(10, 3)
    attn = Attention(8, 2)
    with pytest.raises(ValueError, match=r"\(batch, tokens, 8\).*\(2, 4, 6\)"):
        attn(torch.randn(2, 4, 6))
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 5\)"):
        attn(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool.*torch\.float32"):
        attn(x, key_padding_mask=torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\(4, 4\).*\(4, 3\)"):
        attn(x, attn_mask=torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool.*torch\.float32"):
        attn(x, attn_mask=torch.ones(4, 4))
    with pytest.raises(ValueError, match="memory"):
        attn(x, torch.randn(2, 3, 8))
    cross = Attention(8, 2, cross=True, memory_dim=5)
    with pytest.raises(ValueError, match="needs a memory"):
        cross(x)
    with pytest.raises(ValueError, match=r"\(batch, tokens, 5\).*\(2, 3, 8\)"):
        cross(x, torch.randn(2, 3, 8))


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_decoding_step_matches_per_head_formula(kv_heads: int) -> None:
    """A decoding step (one query a head, keys from the cache) with grouped-query attention:
    output and attention weights equal softmax(q_h k_{g(h)}^T / sqrt(d)) v_{g(h)} computed
    head by head, with g(h) = h // (heads / kv_heads)."""
    from multimodal.nn import LayerCache

    torch.manual_seed(0)
    heads, dim, b, t = 6, 24, 2, 5
    attn = Attention(dim, heads, kv_heads=kv_heads).eval()
    x = torch.randn(b, t, dim)
    cache = LayerCache(t)
    with torch.no_grad():
        attn(x[:, :-1], cache=cache, causal=True)
        out, weights = attn(x[:, -1:], cache=cache, need_weights=True)
        d, kv_dim = dim // heads, kv_heads * (dim // heads)
        q, k, v = attn.qkv(x).split([dim, kv_dim, kv_dim], dim=-1)
        q = q[:, -1].reshape(b, heads, d)
        k, v = k.reshape(b, t, kv_heads, d), v.reshape(b, t, kv_heads, d)
        group = heads // kv_heads
        rows, maps = [], []
        for h in range(heads):
            w = torch.softmax(torch.einsum("bd,btd->bt", q[:, h], k[:, :, h // group])
                              / math.sqrt(d), -1)
            maps.append(w)
            rows.append(torch.einsum("bt,btd->bd", w, v[:, :, h // group]))
        want = attn.proj(torch.cat(rows, -1))[:, None]
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights[:, :, 0], torch.stack(maps, 1), atol=1e-6, rtol=1e-5)
