"""Sparse attention masks against their definitions, and their use inside the backbone."""

from __future__ import annotations

import pytest
import torch

from multimodal.nn import Transformer, TransformerConfig
from multimodal.nn.attention import causal_mask
from multimodal.nn.masks import sliding_window_mask, strided_mask


def _loop_mask(n: int, m: int, allowed) -> torch.Tensor:
    """Reference: query i sits at absolute position p = i + (m - n)."""
    out = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        p = i + (m - n)
        for j in range(m):
            out[i, j] = allowed(p, j)
    return out


@pytest.mark.parametrize(("n", "m"), [(7, 7), (3, 10), (1, 9), (10, 10)])
@pytest.mark.parametrize("window", [1, 2, 3, 5, 16])
def test_sliding_window_matches_definition(n, m, window):
    causal = _loop_mask(n, m, lambda p, j: p - window < j <= p)
    assert torch.equal(sliding_window_mask(n, m, window), causal)
    both = _loop_mask(n, m, lambda p, j: abs(p - j) <= window // 2)
    assert torch.equal(sliding_window_mask(n, m, window, causal=False), both)


@pytest.mark.parametrize(("n", "m"), [(9, 9), (4, 13), (1, 12)])
@pytest.mark.parametrize("stride", [1, 2, 3, 4])
def test_strided_matches_definition(n, m, stride):
    ref = _loop_mask(n, m, lambda p, j: j <= p and ((p - j) < stride or (p - j) % stride == 0))
    assert torch.equal(strided_mask(n, m, stride), ref)
    sym = _loop_mask(n, m, lambda p, j: abs(p - j) < stride or abs(p - j) % stride == 0)
    assert torch.equal(strided_mask(n, m, stride, causal=False), sym)


def test_hand_written_cases():
    # window 2 over 4 tokens: each token sees itself and its predecessor.
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]).bool()
    assert torch.equal(sliding_window_mask(4, 4, 2), expected)
    # stride 2, last query (position 5) of 6 keys: distances 0,1 (local) and 2,4 (strided).
    assert strided_mask(1, 6, 2)[0].tolist() == [False, True, False, True, True, True]
    # a window as wide as the sequence is the causal mask
    assert torch.equal(sliding_window_mask(3, 8, 8), causal_mask(3, 8))


def test_bad_arguments():
    with pytest.raises(ValueError, match="window must be a positive int"):
        sliding_window_mask(4, 4, 0)
    with pytest.raises(ValueError, match="num_queries <= num_keys"):
        strided_mask(5, 4, 2)
    with pytest.raises(ValueError, match="attention_pattern must be one of"):
        Transformer(TransformerConfig(dim=16, depth=1, heads=2, attention_pattern="dilated"))


def _decoder(pattern: str, window: int, depth: int = 1) -> Transformer:
    cfg = TransformerConfig(dim=16, depth=depth, heads=2, causal=True,
                            attention_pattern=pattern, attention_window=window)
    return Transformer(cfg).eval()


def test_sliding_window_receptive_field():
    """One layer with window w: the output at positions >= n depends on no token before
    n - w + 1, but does depend on token n - w + 1 (and on far tokens with full attention)."""
    window, n, length = 3, 8, 12
    x = torch.randn(2, length, 16)
    far = x.clone()
    far[:, : n - window + 1] = torch.randn(2, n - window + 1, 16)  # all further back
    near = x.clone()
    near[:, n - window + 1] += torch.randn(2, 16)  # oldest key inside position n's window

    model = _decoder("sliding", window)
    with torch.no_grad():
        base, y_far, y_near = model(x), model(far), model(near)
    torch.testing.assert_close(y_far[:, n:], base[:, n:], atol=0, rtol=0)
    assert (y_near[:, n] - base[:, n]).abs().max() > 1e-3
    assert torch.equal(y_near[:, n + 1 :], base[:, n + 1 :])  # out of their windows

    full = _decoder("full", window)
    full.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (full(far)[:, n:] - full(x)[:, n:]).abs().max() > 1e-3


def test_pattern_equals_explicit_attn_mask_and_combines_with_it():
    model = _decoder("strided", 3, depth=2)
    plain = _decoder("full", 3, depth=2)
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 10, 16)
    extra = torch.rand(10, 10) > 0.3
    expected_mask = strided_mask(10, 10, 3) & extra
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x, attn_mask=strided_mask(10, 10, 3)))
        torch.testing.assert_close(model(x, attn_mask=extra), plain(x, attn_mask=expected_mask))
        _, maps = model(x, return_attention=True)
    for w in maps["self"]:  # weights vanish outside the pattern, rows still sum to one
        assert torch.all(w[..., ~strided_mask(10, 10, 3)] == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    with pytest.raises(ValueError, match="attn_mask must be a bool tensor"):
        model(x, attn_mask=torch.ones(9, 10, dtype=torch.bool))


@pytest.mark.parametrize(("pattern", "window"), [("sliding", 4), ("strided", 3)])
def test_cached_decoding_equals_full_forward(pattern, window):
    model = _decoder(pattern, window, depth=3)
    x = torch.randn(2, 14, 16)
    with torch.no_grad():
        full = model(x)
        cache = model.make_cache(14)
        steps = [model(x[:, :5], cache=cache)]  # prefill
        steps += [model(x[:, t : t + 1], cache=cache) for t in range(5, 11)]
        steps.append(model(x[:, 11:], cache=cache))  # a 3-token chunk
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_non_causal_encoder_window():
    cfg = TransformerConfig(dim=16, depth=1, heads=2, attention_pattern="sliding",
                            attention_window=4)
    model = Transformer(cfg).eval()
    x = torch.randn(1, 9, 16)
    moved = x.clone()
    # more than window // 2 = 2 away from position 4 on either side
    moved[:, 7:] += torch.randn(1, 2, 16)
    moved[:, :2] += torch.randn(1, 2, 16)
    inside = x.clone()
    inside[:, 6] += torch.randn(1, 16)  # 2 away: inside
    with torch.no_grad():
        assert torch.equal(model(moved)[:, 4], model(x)[:, 4])
        assert (model(inside)[:, 4] - model(x)[:, 4]).abs().max() > 1e-3
