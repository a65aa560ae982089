"""The worker's configuration: one typed tree (schema) loaded from a TOML file in configs/ (loader)."""

from worker.config.loader import ConfigError, load_config
from worker.config.schema import (
    BatchConfig,
    DeadlinesConfig,
    DistributedConfig,
    EncodeConfig,
    GCSConfig,
    LimitsConfig,
    LocalStorageConfig,
    LoraConfig,
    LoggingConfig,
    ModelConfig,
    SwapConfig,
    ParallelConfig,
    QueueConfig,
    SpeedConfig,
    StorageConfig,
    StoreTarget,
    WarmupConfig,
    WorkerConfig,
)

__all__ = ["BatchConfig", "DeadlinesConfig", "ConfigError", "DistributedConfig", "EncodeConfig", "GCSConfig", "LimitsConfig",
           "LocalStorageConfig", "LoggingConfig", "LoraConfig", "ModelConfig", "SwapConfig", "ParallelConfig", "QueueConfig", "SpeedConfig",
           "StorageConfig", "StoreTarget", "WarmupConfig", "WorkerConfig", "load_config"]
