"""The scheduler's settings: one typed tree (schema) from a TOML file in configs/, `--set` overrides
and the command-line flags (loader, flags)."""

from scheduler.config.flags import FLAGS, add_flags, flag_values
from scheduler.config.loader import COMMAND_LINE, ConfigError, load_config
from scheduler.config.schema import (
    ApiConfig,
    DatabaseConfig,
    LoggingConfig,
    ModelsConfig,
    SchedulerConfig,
    Secrets,
    ServerConfig,
    StoreConfig,
    read_secrets,
)

__all__ = ["ApiConfig", "COMMAND_LINE", "ConfigError", "DatabaseConfig", "FLAGS", "LoggingConfig", "ModelsConfig", "SchedulerConfig",
           "Secrets", "ServerConfig", "StoreConfig", "add_flags", "flag_values", "load_config",
           "read_secrets"]
