"""Models: loading (the embedded SmolLM2 GGUF, Hugging Face directories, GGUF paths, tiny random
models) in `loading`, and which architectures the engine runs in `architectures`."""

from .architectures import UnsupportedModel
from .loading import (
    EMBEDDED_NAME,
    TINY_PREFIX,
    LoadedModel,
    ModelInfo,
    cache_root,
    cast_weights,
    check_runnable,
    converted_dir,
    default_search_dirs,
    embedded_gguf_path,
    end_token_ids,
    is_converted,
    list_models,
    load_model,
    load_tokenizer,
    resolve_device,
    tiny_random_model,
)

__all__ = [
    "EMBEDDED_NAME",
    "TINY_PREFIX",
    "LoadedModel",
    "ModelInfo",
    "UnsupportedModel",
    "cache_root",
    "cast_weights",
    "check_runnable",
    "converted_dir",
    "default_search_dirs",
    "embedded_gguf_path",
    "end_token_ids",
    "is_converted",
    "list_models",
    "load_model",
    "load_tokenizer",
    "resolve_device",
    "tiny_random_model",
]
