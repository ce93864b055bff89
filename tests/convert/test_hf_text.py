"""transformers' text models (GPT-2, BERT, Llama) converted to our text models give the
source's outputs and greedy generations (fp32, atol 1e-4); sources are built with random
weights from small configs (no download)."""

import pytest
import torch

import multimodal as mm
from multimodal import convert
from tests.convert.sources import perturb_norms, randomise_layer_norms

transformers = pytest.importorskip("transformers")

# Ours and the peer compute the same maths in float32 in another order of operations:
# an absolute floor for values near zero plus float32's relative resolution (torch's default
# rtol, about ten ulps) so that the tolerance scales with the outputs' magnitude.
ATOL = 1e-4
RTOL = 1.3e-6


# -- GPT-2 ------------------------------------------------------------------------------
def gpt2_config(**kw):
    args = dict(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4,
                bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return transformers.GPT2Config(**{**args, **kw})


def test_gpt2_logits_and_greedy_generation_match():
    torch.manual_seed(0)
    source = randomise_layer_norms(transformers.GPT2LMHeadModel(gpt2_config()))
    ours = convert.from_hf(source)
    assert isinstance(ours, mm.TextDecoder)
    assert ours.config.activation == "gelu_tanh" and ours.config.norm_eps == 1e-5
    assert ours.lm_head.weight is ours.tok_embed.weight
    ids = torch.randint(2, 97, (3, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), source(ids).logits, atol=ATOL, rtol=RTOL)
    want = source.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                           do_sample=False, pad_token_id=1)
    got = ours.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, want)


def test_gpt2_base_model_and_untied_head():
    torch.manual_seed(0)
    base = randomise_layer_norms(transformers.GPT2Model(gpt2_config(n_inner=48)))
    ours = convert.from_hf(base)
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(ids), base(ids).last_hidden_state,
                                   atol=ATOL, rtol=RTOL)
    lm = transformers.GPT2LMHeadModel(gpt2_config(tie_word_embeddings=False)).eval()
    with torch.no_grad():
        lm.lm_head.weight.normal_(0, 0.1)
    ours = convert.from_hf(lm)
    assert ours.lm_head.weight is not ours.tok_embed.weight
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), lm(ids).logits, atol=ATOL, rtol=RTOL)


# -- BERT -------------------------------------------------------------------------------
def bert_config(**kw):
    args = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=40, num_labels=3)
    return transformers.BertConfig(**{**args, **kw})


def _bert_inputs():
    ids = torch.randint(0, 101, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return ids, mask, types


def test_bert_hidden_states_and_pooler_match():
    torch.manual_seed(0)
    source = randomise_layer_norms(transformers.BertModel(bert_config()))
    ours = convert.from_hf(source)
    assert isinstance(ours, mm.TextEncoder)
    assert ours.config.norm == "post" and ours.config.embed_norm
    ids, mask, types = _bert_inputs()
    with torch.no_grad():
        ref = source(ids, attention_mask=mask, token_type_ids=types)
        hidden = ours(ids, attention_mask=mask, token_type_ids=types)
        torch.testing.assert_close(hidden, ref.last_hidden_state, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(ours.pool(hidden), ref.pooler_output, atol=ATOL, rtol=RTOL)


def test_bert_masked_lm_and_classifier_match():
    torch.manual_seed(0)
    ids, mask, types = _bert_inputs()
    mlm = randomise_layer_norms(transformers.BertForMaskedLM(bert_config()))
    with torch.no_grad():
        mlm.cls.predictions.bias.normal_(0, 0.5)
    ours = convert.from_hf(mlm)
    with torch.no_grad():
        want = mlm(ids, attention_mask=mask, token_type_ids=types).logits
        got = ours.mlm_logits(ours(ids, attention_mask=mask, token_type_ids=types))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    cls = randomise_layer_norms(transformers.BertForSequenceClassification(bert_config()))
    ours = convert.from_hf(cls)
    with torch.no_grad():
        want = cls(ids, attention_mask=mask, token_type_ids=types).logits
        got = ours.classify(ours(ids, attention_mask=mask, token_type_ids=types))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


# -- Llama ------------------------------------------------------------------------------
def llama(kind="LlamaForCausalLM", **kw):
    args = dict(vocab_size=97, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=False)
    args.update(kw)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**args)
    model = perturb_norms(getattr(transformers, kind)(cfg))
    with torch.no_grad():  # peaked logits: random weights otherwise give near-ties that
        # float rounding (1e-6) may break either way in greedy decoding
        model.get_input_embeddings().weight.mul_(30.0)
        if hasattr(model, "lm_head"):
            model.lm_head.weight.mul_(30.0)
    return model


@pytest.mark.parametrize("kw", [dict(), dict(num_key_value_heads=1, tie_word_embeddings=True),
                                dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True)])
def test_llama_logits_and_greedy_generation_match(kw):
    source = llama(**kw)
    ours = convert.from_hf(source)
    assert isinstance(ours, mm.TextDecoder)
    bb = ours.config.backbone
    assert (bb.rope, bb.norm_type, bb.mlp_type, bb.activation) == ("1d", "rmsnorm", "glu", "silu")
    assert bb.rope_base == 500.0 and bb.kv_heads == source.config.num_key_value_heads
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), source(ids).logits, atol=ATOL, rtol=1e-4)
        want = source.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0,
                               eos_token_id=None)
    got = ours.generate(ids, max_new_tokens=12)
    assert torch.equal(got, want)


def test_llama_left_padded_batch_matches():
    source = llama()
    ours = convert.from_hf(source)
    ids = torch.randint(1, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        want = source(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask)
    torch.testing.assert_close(got[0], want[0], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(got[1, 3:], want[1, 3:], atol=ATOL, rtol=1e-4)


def test_llama_base_model_matches_last_hidden_state():
    source = llama("LlamaModel")
    ours = convert.from_hf(source)
    ids = torch.randint(0, 97, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(ids), source(ids).last_hidden_state,
                                   atol=ATOL, rtol=1e-4)


def test_llama_rope_scaling_refused():
    source = llama(rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="rope scaling"):
        convert.from_hf(source)
