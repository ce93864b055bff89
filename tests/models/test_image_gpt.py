"""ImageGPT: cached vs uncached sampling, likelihood vs the sampling loop, completion,
class conditioning, bits/dim, errors, save/load."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import multimodal
from multimodal.generation import process_logits
from multimodal.models.image_gpt import ImageGPT, ImageGPTConfig, bits_per_dim


def small(num_classes: int = 0, image_size: int | tuple[int, int] = (4, 5),
          vocab: int = 16) -> ImageGPT:
    torch.manual_seed(0)
    return ImageGPT(ImageGPTConfig(image_size=image_size, vocab_size=vocab, dim=32, depth=2,
                                   heads=4, mlp_dim=64, num_classes=num_classes)).eval()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kw", [{}, {"top_k": 5, "temperature": 0.7}, {"top_p": 0.8}])
def test_cached_and_uncached_sampling_give_the_same_tokens(kw: dict) -> None:
    model = small()
    a = model.generate(num_images=3, do_sample=True, generator=gen(1), **kw)
    b = model.generate(num_images=3, do_sample=True, generator=gen(1), use_cache=False, **kw)
    assert a.shape == (3, 4, 5)
    assert a.dtype == torch.long
    assert torch.equal(a, b)
    assert not torch.equal(a, model.generate(num_images=3, do_sample=True, generator=gen(2),
                                             **kw))


def test_log_likelihood_equals_sum_of_step_log_probs_of_the_cached_loop() -> None:
    model = small(num_classes=3)
    labels = torch.tensor([0, 2])
    images = model.generate(num_images=2, do_sample=True, generator=gen(0), class_label=labels)
    tokens = images.flatten(1)
    # step through with the KV cache, one pixel per call
    cache = model.make_cache()
    total = torch.zeros(2)
    with torch.no_grad():
        logits = model(tokens[:, :0], cache=cache, class_label=labels)[:, -1]
        for n in range(tokens.shape[1]):
            total += F.log_softmax(logits, -1).gather(1, tokens[:, n : n + 1]).squeeze(1)
            logits = model(tokens[:, n : n + 1], cache=cache)[:, -1]
    with torch.no_grad():
        ll = model.log_likelihood(images, class_label=labels)
    assert ll.shape == (2,)
    torch.testing.assert_close(ll, total, rtol=1e-5, atol=1e-4)
    # a (B, N) sequence is the same as (B, H, W)
    torch.testing.assert_close(model.log_likelihood(tokens, class_label=labels).detach(), ll)


def test_log_likelihood_is_a_normalised_distribution() -> None:
    # 1x2 images over 3 levels: the probabilities of all 9 images sum to 1
    model = small(image_size=(1, 2), vocab=3)
    every = torch.cartesian_prod(torch.arange(3), torch.arange(3))
    with torch.no_grad():
        total = model.log_likelihood(every).exp().sum()
    torch.testing.assert_close(total, torch.tensor(1.0), rtol=0, atol=1e-5)


def test_completion_keeps_the_prompt_pixels() -> None:
    model = small()
    full = torch.randint(0, 16, (2, 4, 5))
    top = full[:, :2]  # first two rows
    out = model.generate(prompt=top, do_sample=True, generator=gen(0))
    assert out.shape == (2, 4, 5)
    assert torch.equal(out[:, :2], top)
    # a flat prompt of k pixels (not whole rows)
    out = model.generate(prompt=full.flatten(1)[:, :7], do_sample=True, generator=gen(0))
    assert torch.equal(out.flatten(1)[:, :7], full.flatten(1)[:, :7])
    # a whole image as prompt is returned unchanged
    assert torch.equal(model.generate(prompt=full), full)


def test_greedy_completion_is_the_argmax_chain() -> None:
    model = small()
    prompt = torch.randint(0, 16, (1, 6))
    out = model.generate(prompt=prompt, do_sample=False).flatten(1)
    with torch.no_grad():
        logits = model(out[:, :-1])  # logits[:, n] predict pixel n
    assert torch.equal(logits[:, 6:].argmax(-1), out[:, 6:])


def test_generate_samples_by_default_and_greedy_stops_at_max_new_tokens() -> None:
    """An image generator samples unless told otherwise: two generators give two different
    batches, one generator the same batch twice. ``do_sample=False``: the argmax chain from
    the start token (the same every call); max_new_tokens short of the image: the raster
    prefix of that chain."""
    model = small()
    a, b = model.generate(num_images=2, generator=gen(0)), model.generate(num_images=2,
                                                                          generator=gen(1))
    assert not torch.equal(a, b) and torch.equal(a, model.generate(num_images=2,
                                                                   generator=gen(0)))
    whole = model.generate(num_images=2, do_sample=False)
    assert whole.shape == (2, 4, 5)
    assert torch.equal(whole, model.generate(num_images=2, do_sample=False))
    tokens = whole.flatten(1)
    with torch.no_grad():
        logits = model(tokens[:, :-1])  # row n: the logits of pixel n
    assert torch.equal(logits.argmax(-1), tokens)
    part = model.generate(num_images=2, max_new_tokens=7, do_sample=False)
    assert torch.equal(part, tokens[:, :7])
    prompt = tokens[:, :3]
    assert torch.equal(model.generate(prompt, 4, do_sample=False), tokens[:, :7])
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(prompt, 18)


def test_class_conditioning_changes_logits_and_generate_runs() -> None:
    model = small(num_classes=4)
    x = torch.randint(0, 16, (1, 8))
    with torch.no_grad():
        l0 = model(x, class_label=torch.tensor([0]))
        l1 = model(x, class_label=torch.tensor([1]))
        l0_again = model(x, class_label=0)
    assert not torch.allclose(l0, l1)
    torch.testing.assert_close(l0, l0_again)
    out = model.generate(num_images=4, class_label=torch.tensor([0, 1, 2, 3]), do_sample=True,
                         generator=gen(0))
    assert out.shape == (4, 4, 5)
    # the default labels are 0, 1, 2, ... and the sample is reproducible
    same = model.generate(num_images=4, do_sample=True, generator=gen(0))
    assert torch.equal(out, same)
    with pytest.raises(ValueError, match="class_label"):
        model(x)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        model(x, class_label=torch.tensor([4]))
    with pytest.raises(ValueError, match="unconditional"):
        small()(x, class_label=torch.tensor([0]))


def test_bits_per_dim_of_a_uniform_model_is_log2_k() -> None:
    for k in (2, 16, 256):
        model = small(vocab=k)
        with torch.no_grad():
            model.lm_head.weight.zero_()  # all logits equal: p(x_n | x_<n) = 1 / K
        images = torch.randint(0, k, (3, 4, 5))
        with torch.no_grad():
            ll = model.log_likelihood(images)
        torch.testing.assert_close(ll, torch.full((3,), -20 * math.log(k)))
        bpd = bits_per_dim(-ll.mean() / 20)
        torch.testing.assert_close(bpd, torch.tensor(math.log2(k)))  # up to 8: float32 rtol


def test_bad_input_errors() -> None:
    model = small()
    with pytest.raises(ValueError, match="longer than the image"):
        model.generate(prompt=torch.zeros(1, 21, dtype=torch.long))
    with pytest.raises(ValueError, match=r"outside \[0, 16\)"):
        model.generate(prompt=torch.full((1, 3), 16))
    with pytest.raises(ValueError, match=r"outside \[0, 16\)"):
        model.log_likelihood(torch.full((1, 4, 5), -1))
    with pytest.raises(ValueError, match="top_p"):
        model.generate(num_images=1, top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(num_images=1, top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(num_images=1, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(num_images=1, top_k=0)
    with pytest.raises(ValueError, match="whole images"):
        model.log_likelihood(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(num_images, rows, 5\)"):
        model.generate(prompt=torch.zeros(1, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 3))


def test_save_and_load_pretrained(tmp_path) -> None:
    model = small(num_classes=2)
    model.save_pretrained(tmp_path / "igpt")
    loaded = multimodal.from_pretrained(tmp_path / "igpt")
    assert isinstance(loaded, ImageGPT)
    assert loaded.config == model.config
    x = torch.randint(0, 16, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, class_label=torch.tensor([0, 1])),
                                   model(x, class_label=torch.tensor([0, 1])))
    assert ImageGPT.from_pretrained(tmp_path / "igpt").config.image_size == (4, 5)


def test_sampling_follows_processed_distribution() -> None:
    # the first pixel is drawn from softmax(process_logits(logits of the start token))
    model = small(image_size=(1, 1), vocab=4)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = torch.tensor([0.0, 1.0, 2.0, 3.0])
        model.start_token.zero_()
        model.pos_embed.weight.zero_()
        model.transformer.norm.bias.fill_(1.0)
        model.transformer.norm.weight.zero_()  # final features = all ones
    logits = model.lm_head.weight.sum(1).detach()
    probs = process_logits(logits, temperature=0.5, top_k=3).softmax(-1)
    draws = model.generate(num_images=4000, temperature=0.5, top_k=3, do_sample=True,
                           generator=gen(0))
    freq = torch.bincount(draws.flatten(), minlength=4).float() / 4000
    assert freq[0] == 0  # cut by top_k
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.03)


def test_preset_builds() -> None:
    model = multimodal.create_model("igpt_fashion_mnist", depth=1)
    assert isinstance(model, ImageGPT)
    assert model.config.vocab_size == 16  # configs/igpt_fashion_mnist.yaml: 4-bit grey


def test_samples_can_be_trained_on() -> None:
    model = small()
    images = model.generate(num_images=2, do_sample=True, generator=gen(0))
    model.train()
    loss = -model.log_likelihood(images).mean()
    loss.backward()
    assert model.tok_embed.weight.grad is not None


@pytest.mark.slow  # imports lightning and scikit-learn: ~10 s on the shared CPU
def test_pixel_data_and_task_loss_is_mean_nll_per_pixel() -> None:
    pytest.importorskip("sklearn")
    from multimodal.data.pixels import PixelDataModule
    from multimodal.data.sources.digits import load_digits
    from multimodal.tasks.autoregressive import AutoregressiveImageTask

    dm = PixelDataModule("digits", batch_size=8)
    dm.setup("fit")
    images, labels = next(iter(dm.val_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (8, 1, 8, 8)  # raw, not normalised
    raw = load_digits().images[dm.split_indices["val"][:8]]
    assert torch.equal(images[:, 0], raw)
    model = small(num_classes=10, image_size=8, vocab=16)
    task = AutoregressiveImageTask(model)
    with torch.no_grad():
        nll = task._nll((images, labels))
        tokens = task.tokens(images)
        ll = model.log_likelihood(tokens, class_label=labels)
    assert torch.equal(tokens, images.flatten(1).long() * 16 // 256)
    torch.testing.assert_close(nll, -ll.mean() / 64)
    assert task.model_description()["model_config"]["vocab_size"] == 16


def test_fit_writes_sample_grids_and_completes_prompts_from_across_val(tmp_path) -> None:
    pytest.importorskip("sklearn")
    import lightning as L

    from multimodal.data.pixels import PixelDataModule
    from multimodal.tasks.autoregressive import AutoregressiveImageTask

    dm = PixelDataModule("digits", batch_size=8)
    task = AutoregressiveImageTask(small(num_classes=10, image_size=8, vocab=16),
                                   num_samples=4)
    trainer = L.Trainer(max_steps=2, limit_val_batches=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(task, dm)
    assert (tmp_path / "samples.png").is_file()
    assert (tmp_path / "samples_completion.png").is_file()
    # prompts: evenly spaced over the whole validation split, not its first batch
    val = dm.val_dataloader().dataset
    images, labels = task._prompt_images(4)
    picks = torch.linspace(0, len(val) - 1, 4).round().long()
    assert torch.equal(images, torch.stack([val[int(i)][0] for i in picks]))
    assert labels.tolist() == [int(val[int(i)][1]) for i in picks]
    # a completion keeps the prompt's top half (quantised) and fills the rest
    done = task.sample_images(4, prompt_rows=4)
    assert done.shape == (4, 1, 8, 8) and done.dtype == torch.uint8
    expected_top = task.tokenizer.decode(task.tokens(images).view(4, 8, 8))[:, :4]
    assert torch.equal(done[:, 0, :4], expected_top)


def test_pixel_figures(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from multimodal.plots.pixels import plot_completions, plot_samples

    images = torch.randint(0, 256, (2, 3, 1, 8, 8), dtype=torch.uint8)
    path = plot_samples(images, tmp_path / "s.png", ["a", "b"])
    assert path.is_file() and path.stat().st_size > 0
    done = plot_completions(images[0], images[1], 4, tmp_path / "c.png")
    assert done.is_file()
    with pytest.raises(ValueError, match="rows, cols"):
        plot_samples(images[0], tmp_path / "bad.png")
    with pytest.raises(ValueError, match="originals and completions"):
        plot_completions(images[0], images[1][:2], 4, tmp_path / "bad.png")


@pytest.mark.parametrize("pattern", ["sliding", "strided"])
def test_sparse_attention_samples_the_same_with_and_without_the_cache(pattern: str) -> None:
    torch.manual_seed(0)
    model = ImageGPT(ImageGPTConfig(image_size=(4, 5), vocab_size=16, dim=32, depth=2, heads=4,
                                    mlp_dim=64, attention_pattern=pattern,
                                    attention_window=3)).eval()
    a = model.generate(num_images=3, do_sample=True, generator=gen(1))
    assert torch.equal(a, model.generate(num_images=3, do_sample=True, generator=gen(1),
                                         use_cache=False))


def test_sliding_window_limits_what_a_pixel_sees() -> None:
    """One layer, window w: the output at sequence position p (start token = 0, pixel i at
    i + 1) reads positions p - w + 1 .. p, so changing pixel 0 changes positions 1 .. w
    and nothing after them, unlike full attention with the same weights."""
    window = 3
    cfg = dict(image_size=(4, 5), vocab_size=16, dim=32, depth=1, heads=4, mlp_dim=64)
    torch.manual_seed(0)
    local = ImageGPT(ImageGPTConfig(**cfg, attention_pattern="sliding",
                                    attention_window=window)).eval()
    full = ImageGPT(ImageGPTConfig(**cfg)).eval()
    full.load_state_dict(local.state_dict())
    x = torch.randint(0, 16, (2, 19), generator=gen(0))
    y = x.clone()
    y[:, 0] = (x[:, 0] + 1) % 16
    with torch.no_grad():
        changed_local = (local(x) - local(y)).abs().amax(dim=(0, 2)) > 1e-6
        changed_full = (full(x) - full(y)).abs().amax(dim=(0, 2)) > 1e-6
    assert changed_local.tolist() == [False] + [True] * window + [False] * (19 - window)
    assert changed_full.tolist() == [False] + [True] * 19


def test_sampling_gives_the_tokens_of_a_plain_full_forward_loop() -> None:
    """The decoding loop (cache, preallocated buffers, checks hoisted out of the steps)
    draws the same tokens as the naive loop written here: a full forward of everything so
    far, softmax of the last logits, one multinomial draw from the same generator."""
    torch.manual_seed(0)
    model = small(image_size=(3, 3), vocab=16).eval()
    ours = model.generate(num_images=3, do_sample=True, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    ids = torch.zeros(3, 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(9):
            probs = model(ids)[:, -1].float().softmax(dim=-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], dim=1)
    assert torch.equal(ours.flatten(1), ids)


def test_bad_pixel_ids_raise_clear_errors_at_every_entry_point() -> None:
    model = small(image_size=(2, 2), vocab=16).eval()
    with pytest.raises(ValueError, match=r"outside \[0, 16\)"):
        model(torch.tensor([[1, 16]]))  # full forward: values checked
    with pytest.raises(ValueError, match=r"outside \[0, 16\)"):
        model.generate(prompt=torch.tensor([[3, -1]]))
    cache = model.make_cache()
    model(torch.tensor([[1, 2]]), cache=cache)  # prefill
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 16\)"):
        model(torch.tensor([[16]]), cache=cache)  # cached step: the embedding's bound check
