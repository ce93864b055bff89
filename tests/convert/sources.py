"""Helpers shared by the converter tests: randomised parameters that make a mix-up of
weights visible, random images, and a fixed word tokenizer for zero-shot prompts."""

import torch
from torch import nn


def randomise_layer_norms(model: nn.Module) -> nn.Module:
    """LayerNorms start at (1, 0); random affine parameters make a mix-up visible."""
    for m in model.modules():
        if isinstance(m, nn.LayerNorm) and m.weight is not None:
            with torch.no_grad():
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
    return model.eval()


def random_images(size: int = 32, batch: int = 2) -> torch.Tensor:
    """(batch, 3, size, size) standard normal pixels."""
    return torch.randn(batch, 3, size, size)


def perturb_norms(model: nn.Module) -> nn.Module:
    """Norms (RMSNorm too), layer scales start at (1, 0) or a constant: noise of 0.2 makes a
    mix-up visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or "lambda" in name or "gamma" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def perturb_norms_and_biases(model: nn.Module) -> nn.Module:
    """Norms start at (1, 0) and biases at 0: random values make a mix-up visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias") or "probe" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


# the word -> id table of ``Words``, the prompts' tokenizer in the zero-shot tests
WORDS = {"a": 5, "photo": 6, "of": 7, "dog": 9, "cat": 10, "red": 11, "car": 12, "sketch": 13,
         "blurry": 14}


class Words:
    """A tokenizer of our API over a fixed word -> id table (BOS 97, EOS 98, PAD 0)."""

    vocab_size = 99

    def encode_many(self, texts, add_cls=False, add_eos=False):
        return [[97] + [WORDS[w] for w in t.split()] + [98] * add_eos for t in texts]

    def pad(self, seqs, length=None):
        n = length or max(map(len, seqs))
        ids = torch.tensor([s + [0] * (n - len(s)) for s in seqs])
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}
