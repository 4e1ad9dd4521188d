"""`Duration`: a `timedelta` field that reads plain numbers as seconds (every options model)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator


def _seconds(value: object) -> object:
    """Plain numbers read as seconds; infinity is kept as the largest duration."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta.max if math.isinf(value) else timedelta(seconds=value)
    return value


Duration = Annotated[timedelta, BeforeValidator(_seconds)]
