"""The settings file: tuned knobs, what was measured, and the machine they were tuned on."""

from tuneup.settings.schema import (
    AMP_DTYPES,
    COMPILE_MODES,
    SCHEMA_VERSION,
    Knobs,
    Measurement,
    Settings,
    SettingsError,
)
from tuneup.settings.store import (
    ENV_DISABLE,
    ENV_PATH,
    TuneupWarning,
    default_path,
    disabled,
    load,
    read,
    resolve_path,
    save,
)

__all__ = [
    "AMP_DTYPES", "COMPILE_MODES", "SCHEMA_VERSION", "ENV_DISABLE", "ENV_PATH",
    "Knobs", "Measurement", "Settings", "SettingsError", "TuneupWarning",
    "default_path", "disabled", "load", "read", "resolve_path", "save",
]
