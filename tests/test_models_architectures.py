"""What the engine refuses, and how: one line naming the architecture and the gap, before any weight
is read. (What it runs is checked per architecture in test_engine_runner.py and test_engine_lossless.py.)"""

from __future__ import annotations

import json

import gguf
import pytest
from transformers import AutoConfig
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.models import load_model, loading, tiny_random_model
from srt_agent.models.architectures import VERIFIED, UnsupportedModel, check_config, gguf_model_types, tiny_config

# Read by transformers' GGUF loader but not runnable here, with the reason the refusal must give.
REFUSED = {
    "falcon": "AttentionInterface",
    "bloom": "AttentionInterface",
    "stablelm": "AttentionInterface",
    "nemotron": "AttentionInterface",
    "gemma4_text": "layers differ in shape",  # read by the GGUF loader after 5.10 (in 5.19)
    "mamba": "recurrent state",
    "t5": "encoder-decoder",
    "umt5": "encoder-decoder",
}


def test_every_gguf_architecture_is_verified_or_refused():
    """Each model type the GGUF loader produces either runs (verified) or is refused with a reason."""
    unknown = gguf_model_types() - set(VERIFIED) - set(REFUSED) - {"lfm2", "deci"}
    assert not unknown, f"GGUF architectures neither verified nor refused: {unknown}"


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refusals_name_the_architecture_and_the_gap(model_type):
    with pytest.raises(UnsupportedModel) as err:
        check_config(AutoConfig.for_model(model_type))
    message = str(err.value)
    assert message.startswith(model_type) and REFUSED[model_type] in message and "\n" not in message


@pytest.mark.parametrize(
    ("model_type", "kwargs", "gap"),
    [
        ("lfm2", dict(num_hidden_layers=4, full_attn_idxs=[1, 3]), "conv layers keep a recurrent state"),
        ("qwen3_next", {}, "linear_attention layers"),
        ("jamba", {}, "mamba layers"),
        ("gemma3", {}, "multimodal model; the engine runs text-only causal LMs; load its text model \\(gemma3_text\\)"),
        ("llama", dict(attention_chunk_size=8), "chunked attention"),
        ("gemma3_text", dict(use_bidirectional_attention=True), "bidirectional attention"),
    ],
)
def test_hybrid_multimodal_and_other_attention_kinds_are_refused(model_type, kwargs, gap):
    with pytest.raises(UnsupportedModel, match=gap):
        check_config(AutoConfig.for_model(model_type, **kwargs))


def test_verified_configs_pass_the_check():
    for arch in VERIFIED:
        check_config(tiny_config(arch))


def test_refused_before_weights_are_read(tmp_path, monkeypatch):
    """An HF directory with only a config, and a GGUF holding only metadata: refused with the reason
    (not a missing-weights error), and the GGUF is never dequantized."""
    monkeypatch.setenv("SRT_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "falcon-dir"
    folder.mkdir()
    AutoConfig.for_model("falcon").save_pretrained(folder)
    with pytest.raises(UnsupportedModel, match="falcon"):
        load_model(str(folder), device="cpu")
    (tmp_path / "deci").mkdir()
    (tmp_path / "deci" / "config.json").write_text(json.dumps({"model_type": "deci"}))
    with pytest.raises(UnsupportedModel, match="transformers cannot read this model's config"):
        load_model(str(tmp_path / "deci"), device="cpu")

    def no_conversion(*args):
        raise AssertionError("weights were converted")

    monkeypatch.setattr(loading, "_convert_gguf", no_conversion)
    path = tmp_path / "tiny-bloom.gguf"
    writer = gguf.GGUFWriter(str(path), "bloom")
    writer.add_name("tiny-bloom")
    for add, value in [
        (writer.add_context_length, 64),
        (writer.add_embedding_length, 32),
        (writer.add_block_count, 2),
        (writer.add_head_count, 4),
        (writer.add_layer_norm_eps, 1e-5),
    ]:
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModel, match="bloom: BloomForCausalLM's attention"):
        load_model(str(path), device="cpu")
    result = CliRunner().invoke(
        app, ["rollout", "envs/retool_arith.yaml", "--model", str(path), "--out", str(tmp_path / "r.jsonl")]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "bloom" in result.output and "AttentionInterface" in result.output


def test_models_command_lists_architectures_and_search_needs_no_argument(tmp_path, monkeypatch):
    tiny_random_model("gemma2", seed=0).model.save_pretrained(tmp_path / "my-gemma")
    (tmp_path / "my-falcon").mkdir()
    AutoConfig.for_model("falcon").save_pretrained(tmp_path / "my-falcon")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    result = CliRunner().invoke(app, ["models", "--search"])
    assert result.exit_code == 0, result.output
    for arch in VERIFIED:
        assert arch in result.output
    assert "my-gemma" in result.output and "my-falcon" in result.output
    assert "no: falcon" in result.output
