"""Small Hugging Face layout folders with random weights, written by transformers'
``save_pretrained`` (as tests/convert/test_hf_folder.py does), for the ``pretrained: PATH``
tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)] + [
    "red", "green", "blue", "circle", "square", "big", "small", "a", "the", "is"]


def _save(model, folder: Path) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def vit_folder(folder: Path, image_size: int = 32) -> Path:
    import transformers as t

    torch.manual_seed(0)
    _save(t.ViTModel(t.ViTConfig(image_size=image_size, patch_size=8, **SMALL),
                     add_pooling_layer=False), folder)
    pre = {"image_processor_type": "ViTImageProcessor", "do_resize": True,
           "size": {"height": image_size, "width": image_size}, "resample": 2,
           "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
           "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    return folder


def word_tokenizer(folder: Path, vocab: list[str] = VOCAB) -> Path:
    """A WordPiece ``tokenizer.json`` (BERT's special tokens) over ``vocab``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def bert_folder(folder: Path, vocab_size: int = len(VOCAB)) -> Path:
    import transformers as t

    torch.manual_seed(0)
    _save(t.BertModel(t.BertConfig(vocab_size=vocab_size, max_position_embeddings=64,
                                   **SMALL)), folder)
    return word_tokenizer(folder)


def clip_folder(folder: Path) -> Path:
    import transformers as t

    torch.manual_seed(0)
    text = dict(vocab_size=len(VOCAB), max_position_embeddings=16, bos_token_id=2,
                eos_token_id=3, pad_token_id=0, **SMALL)
    vision = dict(image_size=32, patch_size=8, **SMALL)
    _save(t.CLIPModel(t.CLIPConfig(text_config=text, vision_config=vision,
                                   projection_dim=16)), folder)
    return folder


def llama_folder(folder: Path) -> Path:
    import transformers as t

    torch.manual_seed(0)
    return _save(t.LlamaForCausalLM(t.LlamaConfig(vocab_size=90, num_key_value_heads=2,
                                                  **SMALL)), folder)


def ast_folder(folder: Path) -> Path:
    import transformers as t

    torch.manual_seed(0)
    _save(t.ASTModel(t.ASTConfig(patch_size=8, frequency_stride=8, time_stride=8,
                                 max_length=96, num_mel_bins=32, **SMALL)), folder)
    t.ASTFeatureExtractor(num_mel_bins=32, max_length=96).save_pretrained(folder)
    return folder
