"""``multimodal plot``: the figures of a trained checkpoint (drawn by :mod:`multimodal.plots`).

    multimodal plot attention CKPT [--out docs/figures] [--name captions] [--split test]
    multimodal plot pixels    CKPT [--out docs/figures] [--name igpt] [--per_class 8]

``attention``: a CaptioningTask checkpoint's captions under their images
(``<name>_captions.png``) and its decoder's cross-attention over one image, one panel per
generated token (``<name>_attention.png``). ``pixels``: an ImageGPT checkpoint's samples
(one row per class, or a grid; ``<name>_samples.png``) and completions of test images from
their top half (``<name>_completion.png``). The data module is rebuilt from the
checkpoint's arguments (:func:`multimodal.load`), so the images are of the split named,
never trained on for ``test``. torch is imported when a figure is drawn, not for ``--help``.
"""

from __future__ import annotations

from pathlib import Path

from multimodal.cli.errors import UsageError
from multimodal.cli.flags import VerbParser, add_alias, parse

__all__ = ["attention_main", "main", "pixels_main"]

FIGURES = ("attention", "pixels")


def main(args: list[str]) -> int:
    """``multimodal plot FIGURE CKPT ...``."""
    if not args or args[0] in ("-h", "--help"):
        print(f"usage: multimodal plot {{{','.join(FIGURES)}}} CHECKPOINT [options]\n\n"
              "  attention  captions and cross-attention of a CaptioningTask checkpoint\n"
              "  pixels     samples and completions of an ImageGPT checkpoint\n\n"
              "multimodal plot FIGURE --help: that figure's options")
        return 0
    figure, rest = args[0], args[1:]
    if figure == "attention":
        return attention_main(rest)
    if figure == "pixels":
        return pixels_main(rest)
    raise UsageError(f"unknown figure {figure!r}; one of {', '.join(FIGURES)}", "FIGURE")


def attention_main(args: list[str]) -> int:
    """``multimodal plot attention``: captions and cross-attention of a CaptioningTask
    checkpoint."""
    parser = VerbParser(prog="multimodal plot attention",
                        description="Captions under their images and the decoder's "
                                    "cross-attention per generated token, from a "
                                    "CaptioningTask checkpoint.")
    parser.add_argument("checkpoint")
    parser.add_argument("--out", default="docs/figures")
    parser.add_argument("--name", default="captions")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num", type=int, default=8)
    parser.add_argument("--index", type=int, default=0, help="image for the attention figure")
    ns = parse(parser, args)
    import torch

    from multimodal.data.captions import CaptionDataModule
    from multimodal.loading import load
    from multimodal.models.captioner import Captioner, cut_at_eos, decode_captions
    from multimodal.plots.attention import plot_captions, plot_cross_attention

    torch.set_num_threads(1)
    loaded = load(ns.checkpoint)
    model, tok = loaded.model, loaded.tokenizer
    if not isinstance(model, Captioner) or tok is None:
        raise ValueError(f"{ns.checkpoint} holds no captioner with its tokenizer: expected a "
                         "CaptioningTask checkpoint")
    dm = CaptionDataModule(**loaded.data_arguments)
    dm.setup()
    dataset = dm.split_dataset(ns.split)
    take = list(range(min(ns.num, len(dataset))))
    images = torch.stack([dataset[i][0] for i in take])
    refs = [dataset[i][1] for i in take]
    with torch.no_grad():
        ids = model.generate(images)
        maps = model.cross_attention_maps(images, ids)
    captions = decode_captions(ids, tok, model.config.eos_token_id)
    out = Path(ns.out)
    shown = dm.denormalize(images)
    print(plot_captions(shown, captions, out / f"{ns.name}_captions.png", refs))
    row = cut_at_eos(ids[ns.index : ns.index + 1], model.config.eos_token_id)[0][1:]
    words = [tok.id_to_token(i) if i < tok.vocab_size else "[UNK]" for i in row] + ["[EOS]"]
    words = words[: maps.shape[1]]
    print(plot_cross_attention(shown[ns.index], words, maps[ns.index, : len(words)],
                               out / f"{ns.name}_attention.png"))
    return 0


def pixels_main(args: list[str]) -> int:
    """``multimodal plot pixels``: samples and completions of an ImageGPT checkpoint."""
    parser = VerbParser(prog="multimodal plot pixels",
                        description="Class-conditional samples and completions of test "
                                    "images from their top half, from an ImageGPT "
                                    "checkpoint.")
    parser.add_argument("checkpoint")
    parser.add_argument("--out", default="docs/figures")
    parser.add_argument("--name", default="igpt")
    parser.add_argument("--per_class", type=int, default=8, help="samples per class")
    parser.add_argument("--num", type=int, default=10, help="test images to complete")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    add_alias(parser, "--per-class", "--per_class")
    ns = parse(parser, args)
    import torch

    from multimodal.data.pixels import PixelDataModule
    from multimodal.loading import load
    from multimodal.models.image_gpt import ImageGPT
    from multimodal.plots.pixels import plot_completions, plot_samples
    from multimodal.tasks.autoregressive import evenly_spaced_items
    from multimodal.tokenizers.image import PixelTokenizer

    torch.set_num_threads(ns.threads)
    loaded = load(ns.checkpoint)
    model = loaded.model
    if not isinstance(model, ImageGPT):
        raise ValueError(f"{ns.checkpoint} holds a {type(model).__name__}, not an ImageGPT")
    cfg = model.config
    tokenizer = PixelTokenizer(levels=cfg.vocab_size)
    gen = torch.Generator().manual_seed(ns.seed)
    out = Path(ns.out)
    k = cfg.num_classes
    if k:
        labels = torch.arange(k).repeat_interleave(ns.per_class)
        tokens = model.generate(num_images=len(labels), do_sample=True,
                                temperature=ns.temperature, generator=gen, class_label=labels)
        images = tokenizer.decode(tokens)[:, None].view(k, ns.per_class, 1, *cfg.grid)
        names = [str(i) for i in range(k)]
    else:
        tokens = model.generate(num_images=4 * ns.per_class, do_sample=True,
                                temperature=ns.temperature, generator=gen)
        images = tokenizer.decode(tokens)[:, None].view(4, ns.per_class, 1, *cfg.grid)
        names = None
    print(plot_samples(images, out / f"{ns.name}_samples.png", names))

    dm = PixelDataModule(**loaded.data_arguments)
    dm.setup("test")
    originals, labels = evenly_spaced_items(dm.split_dataset("test"), ns.num)
    half = cfg.grid[0] // 2
    tokens = tokenizer.encode(originals, flatten=True)
    done = model.generate(prompt=tokens[:, : half * cfg.grid[1]], do_sample=True,
                          temperature=ns.temperature, generator=gen,
                          class_label=labels if k else None)
    quantised = tokenizer.decode(tokens.view(-1, *cfg.grid))
    print(plot_completions(quantised[:, None], tokenizer.decode(done)[:, None], half,
                           out / f"{ns.name}_completion.png"))
    return 0
