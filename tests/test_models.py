import pytest
import torch
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.models import (
    EMBEDDED_NAME,
    converted_dir,
    embedded_gguf_path,
    list_models,
    load_model,
    loading,
    tiny_random_model,
)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_random_model_runs_forward(arch):
    loaded = tiny_random_model(arch, seed=3)
    ids = torch.tensor([[1, 2, 3, 4]])
    logits = loaded.model(ids).logits
    assert logits.shape == (1, 4, 256)
    assert logits.dtype == torch.float64
    assert loaded.model.config.model_type == arch


def test_tiny_random_model_is_deterministic():
    a = tiny_random_model("llama", seed=7).model
    b = tiny_random_model("llama", seed=7).model
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(a(ids).logits, b(ids).logits)


def test_unknown_arch_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        tiny_random_model("gpt5")


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path / "empty"))


@pytest.mark.slow
def test_embedded_model_loads_and_is_cached(smollm2):
    gguf = embedded_gguf_path()
    assert gguf is not None
    assert (converted_dir(gguf) / "config.json").exists()
    assert smollm2.model.config.num_hidden_layers == 30
    tok = smollm2.tokenizer
    assert tok.convert_tokens_to_ids("<|im_end|>") in smollm2.eos_token_ids
    assert EMBEDDED_NAME in [m.name for m in list_models()]
    # The real model continues a familiar text sensibly (greedy).
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    out = smollm2.model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])


@pytest.mark.slow
def test_hf_directory_round_trip(smollm2, tmp_path):
    smollm2.model.save_pretrained(tmp_path / "m")
    smollm2.tokenizer.save_pretrained(tmp_path / "m")
    again = load_model(str(tmp_path / "m"), device="cpu")
    ids = torch.tensor([[1, 2, 3]])
    assert torch.allclose(again.model(ids).logits, smollm2.model(ids).logits)
    assert again.eos_token_ids == smollm2.eos_token_ids


def test_tiny_spec_uses_the_embedded_tokenizer():
    loaded = load_model("tiny-qwen2", device="cpu")
    assert loaded.model.config.model_type == "qwen2"
    assert loaded.model.config.vocab_size == len(loaded.tokenizer)
    assert loaded.tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.eos_token_ids


@pytest.mark.slow
def test_a_gguf_path_is_converted_once_then_loaded_from_the_cache(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("SRT_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "models"
    folder.mkdir()
    link = folder / "smol.gguf"
    link.symlink_to(embedded_gguf_path())
    assert [(m.name, m.cached) for m in list_models([folder]) if m.kind == "gguf"] == [("smol.gguf", False)]
    first = load_model(str(link), device="cpu")
    assert [(m.name, m.cached) for m in list_models([folder]) if m.kind == "gguf"] == [("smol.gguf", True)]

    def no_second_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(loading, "_convert_gguf", no_second_conversion)
    second = load_model(str(link), device="cpu")
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(first.model(ids).logits, second.model(ids).logits)
    assert torch.allclose(second.model(ids).logits, smollm2.model(ids).logits)


def test_models_command_lists_search_folders(tmp_path):
    tiny_random_model("llama", seed=0).model.save_pretrained(tmp_path / "my-model")
    result = CliRunner().invoke(app, ["models", "--search", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "my-model" in result.output and "hf-dir" in result.output
