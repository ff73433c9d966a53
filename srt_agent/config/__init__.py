"""The env config and every name an env YAML can use.

- :mod:`.schema`: the YAML schema (pydantic models), its ``engine:`` section in :mod:`.engine_config`, what
  every section shares in :mod:`.base`, and the loader in :mod:`.loading`; ``from srt_agent.config import X``
  reads from them.
- :mod:`.algorithm_registry`: the advantage estimators and policy losses ``train:`` names.
- :mod:`.source_registry`: the environment sources ``env:``, ``agent:`` and ``dataset.source`` select.
- :mod:`.tasks`: the ``Task`` every source hands over, in verl's row layout.

The registries hold their implementations (in ``rl/``, ``sources/``) as ``"module:function"`` or by
decorator, so the config checks a name without importing them, or torch.
"""

from .engine_config import EngineConfig, RunAheadConfig, VLLMOptions
from .loading import apply_overrides, load_env_config, read_yaml, validate_config
from .schema import (
    ALGORITHMS,
    KL_PENALTIES,
    LOSS_AGG_MODES,
    PRESETS,
    ColdStartConfig,
    DatasetConfig,
    EnvConfig,
    InterpreterConfig,
    LoraConfig,
    ReasoningGymFamily,
    RewardConfig,
    SamplingConfig,
    TrainConfig,
)
from .strict import ConfigError, import_dotted

__all__ = [
    "ALGORITHMS",
    "KL_PENALTIES",
    "LOSS_AGG_MODES",
    "PRESETS",
    "ColdStartConfig",
    "ConfigError",
    "DatasetConfig",
    "EngineConfig",
    "EnvConfig",
    "InterpreterConfig",
    "LoraConfig",
    "ReasoningGymFamily",
    "RewardConfig",
    "RunAheadConfig",
    "SamplingConfig",
    "TrainConfig",
    "VLLMOptions",
    "apply_overrides",
    "import_dotted",
    "load_env_config",
    "read_yaml",
    "validate_config",
]
