"""Failure signatures: what groups a job's failed steps into clusters.

A failed step stores a signature beside its message: the step's `code` when it gave one
(`StepResult.failed(message, code=...)`), else its message with what varies from step to step
masked: quoted values, URLs and paths, ids (UUIDs, long hexadecimal runs), then numbers. A raised
exception's message begins with its type (`ValueError: ...`), which is kept, so `KeyError:
'doc-17'` and `KeyError: 'doc-18'` share the signature `KeyError: '<v>'`. docs/jobs.md
("Failures at scale") shows more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from choreography_ray.model import StepState

#: The longest signature stored: a longer one is cut (and so groups by its beginning).
MAX_SIGNATURE = 200

#: In the order they apply: a quoted value may hold a path, a path an id, an id digits.
_MASKS = (
    (re.compile(r"'[^'\n]*'"), "'<v>'"),
    (re.compile(r'"[^"\n]*"'), '"<v>"'),
    (re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+"), "<url>"),
    (re.compile(r"(?<![\w.])(?:[A-Za-z]:)?(?:[\\/][\w.@%+~-]+){2,}[\\/]?"), "<path>"),
    (re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\b(?=[a-fA-F]*[0-9])[0-9a-fA-F]{8,}\b"), "<id>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)


def failure_signature(message: str | None, code: str | None = None) -> str:
    """The signature of a failure: `code` when given, else `message` masked (module doc)."""
    if code:
        return code[:MAX_SIGNATURE]
    text = message or ""
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return text.strip()[:MAX_SIGNATURE] or "(no message)"


class FailureCluster(BaseModel):
    """The failed steps of a job that share a signature: how many, when the first and the last
    failure were stored, and one of them with its full message."""

    model_config = ConfigDict(frozen=True)

    signature: str
    count: int
    first_seen: datetime
    last_seen: datetime
    example_step_id: str
    example_message: str | None = None


def failure_cluster(signature: str, steps: Sequence[StepState]) -> FailureCluster:
    """The cluster of `steps` (a provider that groups them itself: memory), the example the
    first by step id."""
    example = min(steps, key=lambda s: s.step_id)
    changes = example.status_changes
    messages = changes[-1].exception_messages if changes else ()
    return FailureCluster(
        signature=signature,
        count=len(steps),
        first_seen=min(s.updated for s in steps),
        last_seen=max(s.updated for s in steps),
        example_step_id=example.step_id,
        example_message=messages[0] if messages else None,
    )
