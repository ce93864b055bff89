"""KV cache: incremental decoding reproduces the full forward; overflow; beam reordering."""

from __future__ import annotations

import copy

import pytest
import torch

from multimodal.nn import KVCache, LayerCache, Transformer, TransformerConfig


def decoder(norm: str = "pre", cross: bool = False) -> Transformer:
    cfg = TransformerConfig(dim=8, depth=2, heads=2, mlp_dim=16, norm=norm, causal=True,
                            cross_attention=cross, memory_dim=6 if cross else None)
    return Transformer(cfg).eval()


def decode_in_chunks(model, x, mem, chunks, key_padding_mask=None):
    """Feed ``x`` through ``model`` in pieces of the given sizes, sharing one cache."""
    cache = model.make_cache(x.shape[1])
    outs, start = [], 0
    for size in chunks:
        end = start + size
        kpm = key_padding_mask[:, :end] if key_padding_mask is not None else None
        # memory only on the first step: later steps use the cached cross keys/values
        outs.append(model(x[:, start:end], mem if start == 0 else None,
                          key_padding_mask=kpm, cache=cache))
        start = end
    assert cache.length == x.shape[1]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("chunks", [[1] * 6, [3, 1, 1, 1], [2, 2, 1, 1]])
def test_incremental_decoding_matches_full_forward(norm: str, cross: bool, chunks) -> None:
    model = decoder(norm, cross)
    x = torch.randn(2, 6, 8)
    mem = torch.randn(2, 4, 6) if cross else None
    with torch.no_grad():
        full = model(x, mem)
        steps = decode_in_chunks(model, x, mem, chunks)
    torch.testing.assert_close(steps, full)


def test_incremental_decoding_with_left_padding() -> None:
    model = decoder(cross=True)
    x, mem = torch.randn(2, 6, 8), torch.randn(2, 4, 6)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :2] = True  # sample 1 is left-padded by two tokens
    with torch.no_grad():
        full = model(x, mem, key_padding_mask=pad)
        steps = decode_in_chunks(model, x, mem, [3, 1, 1, 1], key_padding_mask=pad)
        alone = model(x[1:, 2:], mem[1:])  # sample 1 without its padding
    assert not full.isnan().any()
    torch.testing.assert_close(steps, full)
    torch.testing.assert_close(full[1:, 2:], alone)


def test_cache_overflow_raises() -> None:
    model = decoder()
    cache = model.make_cache(4)
    with torch.no_grad():
        model(torch.randn(1, 3, 8), cache=cache)
        with pytest.raises(ValueError, match=r"5 tokens.*cache \(4\)"):
            model(torch.randn(1, 2, 8), cache=cache)
    layer = LayerCache(max_len=2)
    layer.append(torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))
    with pytest.raises(ValueError, match=r"overflow.*max_len 2"):
        layer.append(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    with pytest.raises(ValueError, match="max_len"):
        KVCache(2, 0)
    with pytest.raises(ValueError, match="cache has 3 layers"):
        model(torch.randn(1, 1, 8), cache=KVCache(3, 4))


def test_layer_cache_append_returns_everything_so_far() -> None:
    layer = LayerCache(max_len=5)
    k1, v1 = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    k2, v2 = torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4)
    layer.append(k1, v1)
    k, v = layer.append(k2, v2)
    assert layer.length == 4
    torch.testing.assert_close(k, torch.cat([k1, k2], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(v, torch.cat([v1, v2], dim=2), rtol=0, atol=0)


def test_reorder_selects_batch_rows() -> None:
    model = decoder(cross=True)
    x, mem = torch.randn(3, 5, 8), torch.randn(3, 4, 6)
    index = torch.tensor([2, 0, 0])
    with torch.no_grad():
        cache = model.make_cache(5)
        model(x[:, :4], mem, cache=cache)
        k_before = cache[1].k[:, :, :4].clone()
        cross_before = cache[0].cross_kv[1].clone()
        cache.reorder(index)
        torch.testing.assert_close(cache[1].k[:, :, :4], k_before[[2, 0, 0]], rtol=0, atol=0)
        torch.testing.assert_close(cache[0].cross_kv[1], cross_before[[2, 0, 0]],
                                   rtol=0, atol=0)
        # The next step continues the reordered rows' histories.
        step = model(x[index, 4:], cache=cache)
        full = model(x[index], mem[index])
    torch.testing.assert_close(step, full[:, 4:])


# ---- the one-token decoding step (Block.step) -----------------------------------------

def _plain_decoder(**overrides) -> Transformer:
    cfg = dict(dim=32, depth=3, heads=4, mlp_dim=64, causal=True)
    return Transformer(TransformerConfig(**{**cfg, **overrides})).eval()


def _steps(model: Transformer, x: torch.Tensor, prefill: int) -> torch.Tensor:
    """Prefill ``prefill`` tokens, then one token per call; the outputs of the steps."""
    cache = model.make_cache(x.shape[1])
    with torch.no_grad():
        model(x[:, :prefill], cache=cache)
        return torch.cat([model(x[:, t : t + 1], cache=cache)
                          for t in range(prefill, x.shape[1])], dim=1)


def _count_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from multimodal.nn import block
    calls: list[int] = []
    original = block.block_step

    def counted(x, plan, cache):
        calls.append(1)
        return original(x, plan, cache)

    monkeypatch.setattr(block, "block_step", counted)
    return calls


def test_one_token_step_matches_the_general_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = _plain_decoder()
    x = torch.randn(3, 9, 32)
    calls = _count_steps(monkeypatch)
    fast = _steps(model, x, prefill=4)
    assert len(calls) == 5 * 3  # 5 steps x 3 blocks took the lean path
    # a no-op hook on one block sends every step down the general (module) path
    handle = model.blocks[1].register_forward_pre_hook(lambda module, args: None)
    general = _steps(model, x, prefill=4)
    handle.remove()
    assert len(calls) == 5 * 3
    # the same operations, GEMMs as W x^T (addmm) instead of F.linear's x W^T: fp32
    # rounding
    torch.testing.assert_close(fast, general, rtol=1e-6, atol=1e-6)
    # and both are the full forward's last rows up to rounding
    with torch.no_grad():
        torch.testing.assert_close(fast, model(x)[:, 4:])


@pytest.mark.parametrize("change", ["training", "gqa", "qk_norm", "post_norm", "layer_scale",
                                    "rope", "sliding", "lora"])
def test_one_token_step_is_not_taken_where_it_would_differ(
        change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from multimodal.nn.lora import apply_lora

    overrides = {"gqa": {"kv_heads": 2}, "qk_norm": {"qk_norm": True},
                 "post_norm": {"norm": "post"}, "layer_scale": {"layer_scale": 0.5},
                 "rope": {"rope": "1d"},
                 "sliding": {"attention_pattern": "sliding", "attention_window": 3}}
    torch.manual_seed(0)
    model = _plain_decoder(**overrides.get(change, {}))
    if change == "training":
        model.train()
    if change == "lora":
        apply_lora(model, rank=2)
        for name, p in model.named_parameters():  # a non-zero adapter changes the output
            if "lora_b" in name.lower():
                torch.nn.init.normal_(p)
    calls = _count_steps(monkeypatch)
    x = torch.randn(2, 6, 32)
    out = _steps(model, x, prefill=3)
    assert calls == []
    with torch.no_grad():
        torch.testing.assert_close(out, model(x)[:, 3:])


def test_step_plans_are_taken_once_per_cache() -> None:
    """A cache takes the blocks' step plans on its first one-token step and keeps them: the
    plans hold views of the parameters (no weight copies), so a weight changed in place
    while that cache is decoded is seen at once; the steps still equal the full forward."""
    torch.manual_seed(0)
    model = _plain_decoder()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        cache = model.make_cache(5)
        model(x[:, :3], cache=cache)
        model(x[:, 3:4], cache=cache)
        plans = cache.step_plans
        assert plans is not None and len(plans) == 3
        fc2 = model.blocks[0].mlp.fc2.weight
        assert plans[0].fc2_weight.data_ptr() == fc2.data_ptr()  # a view, not a copy
        fc2.mul_(2.0)
        general_cache = copy.deepcopy(cache)
        general_cache.step_owner = None  # plans are re-taken: the hook sends it the general way
        last = model(x[:, 4:5], cache=cache)
        assert cache.step_plans is plans  # taken once for this cache
        handle = model.blocks[2].register_forward_pre_hook(lambda module, args: None)
        general = model(x[:, 4:5], cache=general_cache)
        handle.remove()
        assert general_cache.step_plans is None
        torch.testing.assert_close(last, general)  # the changed weight is used by both
