"""The converters' front door (``multimodal.convert``): dispatch by library, unsupported
models named with what is supported, and missing / unconverted / mis-shaped keys listed.
Every source model is built with random weights from a small config: nothing is downloaded.
"""

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal import convert
from tests.convert.test_hf_text import bert_config
from tests.convert.test_timm_vit import small_timm
from tests.convert.test_torchvision_vit import small_torchvision

transformers = pytest.importorskip("transformers")


def test_unsupported_models_name_what_is_supported():
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        convert.from_hf(transformers.BertForQuestionAnswering(bert_config()))
    with pytest.raises(ValueError, match="VisionTransformer"):
        convert.from_torchvision(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="timm"):
        convert.from_timm(small_torchvision())
    with pytest.raises(ValueError, match="supported"):
        convert.convert(nn.Linear(2, 2))


def test_dispatch_by_library():
    assert isinstance(convert.convert(small_torchvision()), mm.ViT)
    assert isinstance(convert.convert(small_timm()), mm.ViT)
    assert isinstance(convert.convert(transformers.BertModel(bert_config())), mm.TextEncoder)


def test_missing_and_unconverted_keys_are_listed():
    source = small_torchvision()
    source.encoder.ln.weight = None  # a LayerNorm without scale: no such key
    source.register_buffer("extra_scale", torch.ones(1))  # a key nothing converts
    with pytest.raises(ValueError) as err:
        convert.from_torchvision(source)
    message = str(err.value)
    assert "missing: encoder.ln.weight" in message
    assert "not converted" in message and "extra_scale" in message


def test_mis_shaped_keys_are_listed():
    source = small_timm()
    source.head = nn.Linear(32, 7)  # the config still says 10 classes
    with pytest.raises(ValueError, match=r"mis-shaped: head.weight: expected \(10, 32\), "
                                         r"got \(7, 32\)"):
        convert.from_timm(source)
