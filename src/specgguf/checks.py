"""Argument checks shared by every layer: one message for each mistake.

Plain functions with no imports from the package, so the configuration,
the engine and the command line all use them without reaching up.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Union


def check_int(name: str, value: object, low: int, high: Optional[int] = None) -> int:
    """``value`` as an int in [low, high]; TypeError for a non-int (bools
    included), ValueError naming ``name`` and the bound otherwise."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return int(value)


def check_real(name: str, value: object, low: float, high: float = math.inf) -> float:
    """``value`` as a finite float in [low, high] (TypeError / ValueError as :func:`check_int`)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not (low <= v <= high) or math.isnan(v) or math.isinf(v):
        bound = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return v


def check_p_min(value: object) -> Union[None, float, str]:
    """A draft confidence cutoff: None (off), ``"auto"`` (learned), or a number in [0, 1]."""
    if value is None or value == "auto":
        return value  # type: ignore[return-value]
    if isinstance(value, str):
        raise ValueError(f"p_min must be None, 'auto' or a number in [0, 1], got {value!r}")
    return check_real("p_min", value, 0.0, 1.0)
