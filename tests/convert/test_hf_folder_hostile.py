"""Hostile or broken Hugging Face folders are refused from config.json and the safetensors
headers alone, before a tensor is read or a parameter allocated, in the file's own names."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

import multimodal as mm
from multimodal.convert.common import StateReader
from multimodal.weights import name_list, read_safetensors_header

transformers = pytest.importorskip("transformers")


def _bert(folder, hidden=32, layers=2):
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=16))
    model.save_pretrained(folder)
    return folder


def _edit_config(folder, **changes):
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def _edit_tensor(folder, name, value):
    file = folder / "model.safetensors"
    state = load_file(str(file))
    state[name] = value
    save_file(state, str(file), metadata={"format": "pt"})


@pytest.fixture
def no_tensor_read(monkeypatch):
    """Fails the test if any tensor data is read."""
    import safetensors.torch

    reads = []
    monkeypatch.setattr(safetensors.torch, "load_file", lambda f, *a, **k: reads.append(f))
    yield reads
    assert reads == [], "tensor data was read before the folder was refused"


def test_valid_folder_still_matches_transformers(tmp_path):
    folder = _bert(tmp_path)
    ref = transformers.BertModel.from_pretrained(folder).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(mm.from_hf(folder).forward_features(ids),
                                   ref(ids).last_hidden_state, atol=1e-5, rtol=1e-5)


def test_huge_hidden_size_is_refused_naming_field_and_file_tensor(tmp_path, no_tensor_read):
    folder = _bert(tmp_path)
    _edit_config(folder, hidden_size=10_000_000)
    with pytest.raises(ValueError) as err:
        mm.from_hf(folder)
    msg = str(err.value)
    assert "model.safetensors" in msg and "hidden_size=10000000" in msg
    assert "embeddings.word_embeddings.weight is (50, 32)" in msg
    assert re.search(r"\.\.\. and \d+ more$", msg) and len(msg) < 3000


def test_huge_depth_is_refused_before_the_converter_loops(tmp_path, no_tensor_read):
    folder = _bert(tmp_path)
    _edit_config(folder, hidden_size=10_000_000, num_hidden_layers=100_000)
    with pytest.raises(ValueError) as err:
        mm.from_hf(folder)
    msg = str(err.value)
    assert "num_hidden_layers = 100,000" in msg and "2 layers" in msg
    assert "encoder.layer.0 ... encoder.layer.1" in msg and "config.json" in msg
    assert len(msg) < 1000


def test_query_weight_of_the_wrong_width_is_named_before_fusing(tmp_path):
    folder = _bert(tmp_path)
    _edit_tensor(folder, "encoder.layer.1.attention.self.query.weight", torch.zeros(32, 16))
    with pytest.raises(ValueError) as err:
        mm.from_hf(folder)
    msg = str(err.value)
    assert "encoder.layer.1.attention.self.query.weight has shape (32, 16)" in msg
    assert "encoder.layer.1.attention.self.key.weight (32, 32)" in msg
    assert "fused" in msg and "model.safetensors" in msg


def test_query_weight_of_the_wrong_height_is_the_one_named(tmp_path):
    folder = _bert(tmp_path)
    _edit_tensor(folder, "encoder.layer.0.attention.self.value.weight", torch.zeros(20, 32))
    with pytest.raises(ValueError) as err:
        mm.from_hf(folder)
    msg = str(err.value)
    assert "encoder.layer.0.attention.self.value.weight is the one that differs" in msg
    assert "give (84, 32) but the config needs (96, 32)" in msg


def test_mlp_shape_error_uses_the_file_name_and_the_field(tmp_path):
    folder = _bert(tmp_path)
    _edit_config(folder, intermediate_size=48)  # the file's MLP is 64 wide
    with pytest.raises(ValueError) as err:
        mm.from_hf(folder)
    msg = str(err.value)
    assert "model.safetensors: encoder.layer.0.intermediate.dense.weight is (64, 32) but the " \
           "config needs (48, 32)" in msg
    assert "intermediate_size=48" in msg
    assert "transformer.blocks.0.mlp.fc1.weight" in msg  # ours, after the file's


def test_integer_weights_are_refused_by_dtype(tmp_path):
    folder = _bert(tmp_path)
    _edit_tensor(folder, "encoder.layer.0.output.dense.weight",
                 torch.zeros(32, 64, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"encoder\.layer\.0\.output\.dense\.weight \(32, 64\) "
                                         r"is stored as torch\.int64"):
        mm.from_hf(folder)


@pytest.mark.parametrize("changes", [{"num_attention_heads": 0}, {"hidden_size": -32},
                                     {"hidden_size": "32"}, {"intermediate_size": 1.5e300}])
def test_sizes_that_are_no_sizes_are_refused_naming_config_json(tmp_path, changes,
                                                                 no_tensor_read):
    folder = _bert(tmp_path)
    _edit_config(folder, **changes)
    with pytest.raises(ValueError, match=r"config\.json"):
        mm.from_hf(folder)


def test_load_encoder_refuses_a_hostile_folder_the_same_way(tmp_path, no_tensor_read):
    folder = _bert(tmp_path)
    _edit_config(folder, num_hidden_layers=100_000)
    with pytest.raises(ValueError, match=r"num_hidden_layers = 100,000"):
        mm.load_encoder(folder)


@pytest.mark.parametrize("cut", [8, 100, -1])
def test_truncated_safetensors_is_named(tmp_path, cut, no_tensor_read):
    folder = _bert(tmp_path)
    file = folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[:cut])
    with pytest.raises(ValueError, match=r"model\.safetensors (is truncated|is not a "
                                         r"safetensors file)"):
        mm.from_hf(folder)


def test_truncated_file_matches_safetensors_own_verdict(tmp_path):
    """Our header check refuses exactly what safetensors refuses (one byte short), and
    accepts the intact file."""
    from safetensors import SafetensorError

    folder = _bert(tmp_path)
    file = folder / "model.safetensors"
    assert read_safetensors_header(file).keys() == load_file(str(file)).keys()
    file.write_bytes(file.read_bytes()[:-1])
    with pytest.raises(SafetensorError):
        load_file(str(file))
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors_header(file)


def test_pickle_named_safetensors_is_not_a_safetensors_file(tmp_path, no_tensor_read):
    folder = _bert(tmp_path)
    torch.save({"x": torch.zeros(3)}, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors is not a safetensors file"):
        mm.from_hf(folder)


def test_html_page_as_weights_is_named(tmp_path):
    folder = _bert(tmp_path)
    (folder / "model.safetensors").write_text("<!DOCTYPE html><html>" + "x" * 100)
    with pytest.raises(ValueError, match=r"model\.safetensors is not a safetensors file"):
        mm.from_hf(folder)


def test_lists_of_names_are_capped():
    names = [f"layer.{i}.weight" for i in range(1_600_000)]
    text = name_list(names)
    assert text.endswith("layer.19.weight, ... and 1 599 980 more")
    assert name_list(names[:3]) == "layer.0.weight, layer.1.weight, layer.2.weight"
    reader = StateReader({f"extra.{i}": torch.zeros(1) for i in range(500)}, "BertModel")
    for i in range(300):
        reader.take(f"absent.{i}")
    with pytest.raises(ValueError) as err:
        reader.finish()
    assert "and 280 more" in str(err.value) and "and 480 more" in str(err.value)
    assert len(str(err.value)) < 1200


def _ours(folder):
    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=60, max_len=24, dim=32, depth=2,
                                                heads=2, mlp_dim=64))
    model.save_pretrained(folder)
    return folder


def _edit_backbone(folder, **changes):
    file = folder / "config.json"
    meta = json.loads(file.read_text())
    meta["config"]["backbone"].update(changes)
    file.write_text(json.dumps(meta))


def test_our_format_is_checked_against_the_header_too(tmp_path, no_tensor_read):
    """``from_pretrained`` / ``load_encoder`` of a ``save_pretrained`` folder: the same
    checks from config.json and the header, in our names (they are the file's)."""
    folder = _ours(tmp_path)
    _edit_backbone(folder, dim=10_000_000, depth=100_000)
    with pytest.raises(ValueError, match=r"config\.json: backbone\.depth = 100,000, "
                                         r"but model\.safetensors holds 2 layers"):
        mm.load_encoder(folder)
    _edit_backbone(folder, depth=2)
    with pytest.raises(ValueError) as err:
        mm.from_pretrained(folder)
    msg = str(err.value)
    assert "pos_embed.weight: expected (24, 10000000), got (24, 32)" in msg
    assert "backbone.dim=10000000" in msg and re.search(r"and \d+ more$", msg)


def test_our_format_truncated_or_mis_shaped(tmp_path):
    folder = _ours(tmp_path)
    _edit_backbone(folder, mlp_dim=48)
    with pytest.raises(ValueError, match=r"transformer\.blocks\.0\.mlp\.fc1\.weight: "
                                         r"expected \(48, 32\), got \(64, 32\) "
                                         r"\(config\.json: backbone\.mlp_dim=48\)"):
        mm.from_pretrained(folder)
    _edit_backbone(folder, mlp_dim=64)
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"model\.safetensors is truncated"):
        mm.from_pretrained(folder)


_PEAK = textwrap.dedent("""
    import resource, sys
    import multimodal as mm
    def vm_peak():
        for line in open("/proc/self/status"):
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    limit = int(sys.argv[2])
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        getattr(mm, sys.argv[3])(sys.argv[1])
        outcome = "loaded"
    except ValueError as err:
        outcome = "refused:" + str(err)[:300].replace(chr(10), " ")
    except MemoryError:
        outcome = "memory"
    print(outcome)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, vm_peak())
""")


def _peak(folder, limit=0, loader="from_hf"):
    run = subprocess.run([sys.executable, "-c", _PEAK, str(folder), str(limit), loader],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    outcome, sizes = run.stdout.strip().splitlines()[-2:]
    rss, vm = map(int, sizes.split())
    return outcome, rss, vm


@pytest.mark.slow
def test_refusing_a_hostile_folder_costs_no_more_memory_than_loading_a_valid_one(tmp_path):
    """A subprocess under RLIMIT_AS = 1.2 x the address space a valid folder of the same
    architecture needs: the hostile folder is refused by name, not by the allocator."""
    valid = _bert(tmp_path / "valid")
    hostile = _bert(tmp_path / "hostile")
    outcome, rss, vm = _peak(valid)
    assert outcome == "loaded"
    for changes in ({"hidden_size": 10_000_000},
                    {"hidden_size": 10_000_000, "num_hidden_layers": 100_000},
                    {"intermediate_size": 10_000_000, "vocab_size": 10_000_000_000}):
        _edit_config(hostile, **changes)
        got, hostile_rss, _ = _peak(hostile, limit=int(1.2 * vm))
        assert got.startswith("refused:") and "config.json" in got, (changes, got)
        assert hostile_rss <= 1.2 * rss, (changes, hostile_rss, rss)
    # our own save_pretrained format, through load_encoder's from_pretrained
    outcome, rss, vm = _peak(_ours(tmp_path / "ours_valid"), loader="load_encoder")
    assert outcome == "loaded"
    hostile = _ours(tmp_path / "ours_hostile")
    for changes in ({"dim": 10_000_000}, {"dim": 10_000_000, "depth": 100_000}):
        _edit_backbone(hostile, **changes)
        got, hostile_rss, _ = _peak(hostile, limit=int(1.2 * vm), loader="load_encoder")
        assert got.startswith("refused:") and "config.json" in got, (changes, got)
        assert hostile_rss <= 1.2 * rss, (changes, hostile_rss, rss)


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_folder_models_are_built_on_meta_no_parameter_allocated_on_cpu(tmp_path, monkeypatch,
                                                                       arch):
    """Every parameter of a folder's model is created on ``meta`` (the registration hook
    sees no real tensor to move), and the loaded model equals transformers'."""
    from multimodal.convert import common

    cfg = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=16)
    if arch == "bert":
        source = transformers.BertModel(transformers.BertConfig(**cfg))
    elif arch == "gpt2":
        source = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16))
    else:
        source = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    source.eval().save_pretrained(tmp_path)
    real = []
    hook = common._to_meta
    monkeypatch.setattr(common, "_to_meta", lambda m, n, p: real.append(n) if (
        p is not None and not p.is_meta and common._ON_META.get()
        and not common._ASSIGNING.get()) else hook(m, n, p))
    ours = mm.from_hf(tmp_path)
    assert real == []
    assert all(not t.is_meta for t in [*ours.parameters(), *ours.buffers()])
    ids = torch.randint(0, 50, (1, 6))
    with torch.no_grad():
        ref = source(ids)
        ref = ref.logits if arch != "bert" else ref.last_hidden_state
        got = ours(ids) if arch != "bert" else ours.forward_features(ids)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_checkpoint_with_a_hostile_model_config_is_refused_before_building(tmp_path):
    from multimodal.weights import config_to_dict

    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=60, max_len=24, dim=32, depth=2,
                                                heads=2, mlp_dim=64))
    cfg = config_to_dict(model.config)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    path = tmp_path / "task.ckpt"
    torch.save({"state_dict": state, "multimodal_model": {"model_type": "TextEncoder",
                                                          "model_config": cfg}}, path)
    torch.testing.assert_close(mm.from_pretrained(path).state_dict(), model.state_dict())
    for changes, pattern in (
            ({"depth": 100_000}, r"model_config: backbone\.depth = 100,000, but task\.ckpt "
                                 r"holds 2 layers"),
            ({"dim": 10_000_000}, r"pos_embed\.weight: expected \(24, 10000000\), got "
                                  r"\(24, 32\) \(task\.ckpt: model_config: backbone\.dim=")):
        hostile = json.loads(json.dumps(cfg))
        hostile["backbone"].update(changes)
        torch.save({"state_dict": state, "multimodal_model": {"model_type": "TextEncoder",
                                                              "model_config": hostile}}, path)
        with pytest.raises(ValueError, match=pattern):
            mm.from_pretrained(path)
