"""``mm.from_hf(folder)``: a Hugging Face layout folder (config.json + safetensors, one
file or shards) -> our model, with transformers NOT importable, giving transformers'
outputs (fp32, atol 1e-4). Folders are written here by transformers' ``save_pretrained``
from small random-weight configs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import multimodal as mm

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def _sources():
    t = transformers
    torch.manual_seed(0)
    ids = torch.randint(0, 90, (2, 7))
    img = torch.randn(2, 3, 28, 28)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    return {
        "llama": (t.LlamaForCausalLM(t.LlamaConfig(vocab_size=90, intermediate_size=48,
                                                   num_key_value_heads=2, **small)),
                  ids, lambda m, x: m(x).logits, lambda m, x: m(x)),
        "bert": (t.BertModel(t.BertConfig(vocab_size=90, intermediate_size=48, **small)),
                 ids, lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x)),
        "gpt2": (t.GPT2LMHeadModel(t.GPT2Config(vocab_size=90, n_embd=32, n_layer=2, n_head=4)),
                 ids, lambda m, x: m(x).logits, lambda m, x: m(x)),
        "vit": (t.ViTModel(t.ViTConfig(image_size=28, patch_size=7, intermediate_size=48,
                                       **small)),
                img, lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x)),
        "dinov2": (t.Dinov2Model(t.Dinov2Config(image_size=28, patch_size=14, **small)),
                   img, lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x)),
        "deit": (t.DeiTModel(t.DeiTConfig(image_size=28, patch_size=7, intermediate_size=48,
                                          **small)),
                 img, lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x)),
        "dinov2_reg": (t.Dinov2WithRegistersModel(t.Dinov2WithRegistersConfig(
            image_size=28, patch_size=14, num_register_tokens=2, **small)),
            img, lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x)),
    }


_BLOCKED_RUN = textwrap.dedent("""
    import sys, json
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "transformers" or name.startswith("transformers."):
                raise ImportError("transformers is blocked in this test")
    sys.meta_path.insert(0, Block())
    import torch
    from safetensors.torch import load_file
    import multimodal as mm
    cases = json.loads(sys.argv[1])
    for name, folder in cases.items():
        io = load_file(folder + "/io.safetensors")
        model = mm.from_hf(folder)
        x = io["input"]
        with torch.no_grad():
            got = model(x) if name in ("llama", "gpt2", "bert") else model.forward_features(x)
        torch.testing.assert_close(got, io["output"], atol=1e-4, rtol=1e-4)
        print("ok", name, type(model).__name__)
    assert "transformers" not in sys.modules
""")


def test_folders_load_without_transformers(tmp_path):
    cases = {}
    for name, (model, x, theirs, _) in _sources().items():
        model.eval()
        folder = tmp_path / name
        # llama in shards, the others in one file
        model.save_pretrained(folder, max_shard_size="40KB" if name == "llama" else "1GB")
        with torch.no_grad():
            save_file({"input": x, "output": theirs(model, x).contiguous()},
                      str(folder / "io.safetensors"))
        cases[name] = str(folder)
    assert (tmp_path / "llama" / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "llama" / "model.safetensors").exists()
    run = subprocess.run([sys.executable, "-c", _BLOCKED_RUN, json.dumps(cases)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok ") == len(cases), run.stdout


@pytest.fixture
def bert_folder(tmp_path):
    t = transformers
    model = t.BertModel(t.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32))
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    return folder


def test_equal_to_live_conversion(bert_folder):
    live = mm.convert.from_hf(transformers.BertModel.from_pretrained(bert_folder))
    ours = mm.from_hf(bert_folder)
    ids = torch.randint(0, 50, (1, 5))
    torch.testing.assert_close(ours(ids), live(ids),
                               rtol=0, atol=0)


def test_no_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        mm.from_hf(tmp_path)


def test_unsupported_model_type_lists_supported(bert_folder):
    cfg = json.loads((bert_folder / "config.json").read_text())
    cfg.update(model_type="t5", architectures=["T5Model"])
    (bert_folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model_type='t5'.*supported model_type: \[.*'bert'"):
        mm.from_hf(bert_folder)


def test_missing_and_unexpected_keys_are_listed(bert_folder):
    file = bert_folder / "model.safetensors"
    state = load_file(str(file))
    del state["encoder.layer.0.output.dense.bias"]
    state["encoder.layer.0.extra.weight"] = torch.zeros(3)
    save_file(state, str(file))
    with pytest.raises(ValueError, match=r"missing: encoder\.layer\.0\.output\.dense\.bias.*"
                                         r"not converted.*encoder\.layer\.0\.extra\.weight"):
        mm.from_hf(bert_folder)


def test_shape_mismatch_names_both_shapes(bert_folder):
    file = bert_folder / "model.safetensors"
    state = load_file(str(file))
    state["embeddings.word_embeddings.weight"] = torch.zeros(51, 16)
    save_file(state, str(file))
    with pytest.raises(ValueError, match=r"tok_embed\.weight: expected \(50, 16\), got \(51, 16\)"):
        mm.from_hf(bert_folder)


def test_missing_shard(tmp_path):
    t = transformers
    model = t.BertModel(t.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32))
    model.save_pretrained(tmp_path, max_shard_size="8KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / shard).unlink()
    with pytest.raises(FileNotFoundError, match=f"shards that are not in .*{shard}"):
        mm.from_hf(tmp_path)


def test_pickle_only_refused(bert_folder):
    state = load_file(str(bert_folder / "model.safetensors"))
    (bert_folder / "model.safetensors").unlink()
    torch.save(state, bert_folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model\.bin\)"):
        mm.from_hf(bert_folder)


_BLOCKED_CLIP = _BLOCKED_RUN.split("cases = json.loads")[0] + textwrap.dedent("""
    folder = sys.argv[1]
    io = load_file(folder + "/io.safetensors")
    clip = mm.from_hf(folder)
    assert type(clip) is mm.CLIP, type(clip)
    with torch.no_grad():
        got = clip.similarity(io["images"], io["ids"], io["mask"])
        text = clip.encode_text(io["ids"], io["mask"], normalize=False)
    torch.testing.assert_close(got, io["logits_per_image"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(text, io["text_features"], atol=1e-4, rtol=1e-4)
    assert "transformers" not in sys.modules
    print("ok clip")
""")


def test_clip_folder_loads_as_our_clip_without_transformers(tmp_path):
    t = transformers
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4)
    model = t.CLIPModel(t.CLIPConfig(
        text_config=dict(vocab_size=60, max_position_embeddings=12, eos_token_id=59,
                         bos_token_id=58, pad_token_id=0, **small),
        vision_config=dict(image_size=28, patch_size=7, **small), projection_dim=16)).eval()
    model.save_pretrained(tmp_path)
    ids = torch.tensor([[58, 3, 4, 59, 0], [58, 5, 6, 7, 59]])
    mask = (ids != 0).long()
    images = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, pixel_values=images)
        text = model.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
    save_file({"images": images, "ids": ids, "mask": mask, "text_features": text.contiguous(),
               "logits_per_image": out.logits_per_image.contiguous()},
              str(tmp_path / "io.safetensors"))
    run = subprocess.run([sys.executable, "-c", _BLOCKED_CLIP, str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok clip" in run.stdout
