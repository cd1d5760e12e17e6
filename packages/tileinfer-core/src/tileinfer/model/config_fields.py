"""The checks of config.json's fields that every architecture's reading shares."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A config.json this engine cannot run: unknown architecture, missing or unsupported field."""


def int_field(d, name, value=None, minimum=1):
    value = d[name] if value is None else value
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"config field {name!r} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"config field {name!r} must be >= {minimum}, got {value}")
    return value


def float_field(name, value, positive=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"config field {name!r} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"config field {name!r} must be > 0, got {value}")
    return float(value)
