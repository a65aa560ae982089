"""The scheduler's settings: one typed tree (schema) from a TOML file in configs/, `--set` overrides
and the command-line flags (loader, flags)."""

from scheduler.config.flags import FLAGS, RENAMED_FLAGS, add_flags, flag_values
from scheduler.config.loader import COMMAND_LINE, ConfigError, load_config
from scheduler.config.schema import (
    RENAMED_KEYS,
    ApiConfig,
    AuthConfig,
    DatabaseConfig,
    GateConfig,
    LoggingConfig,
    ModelsConfig,
    ResultsConfig,
    SchedulerConfig,
    Secrets,
    ServerConfig,
    StoreConfig,
    WaitsConfig,
    WebhooksConfig,
    read_secrets,
)

__all__ = ["ApiConfig", "AuthConfig", "COMMAND_LINE", "ConfigError", "DatabaseConfig", "FLAGS", "GateConfig",
           "LoggingConfig", "ModelsConfig", "RENAMED_FLAGS", "RENAMED_KEYS", "ResultsConfig", "SchedulerConfig",
           "Secrets", "ServerConfig", "StoreConfig", "WaitsConfig", "WebhooksConfig", "add_flags", "flag_values",
           "load_config", "read_secrets"]
