"""Decisions: an answer recorded through `StepContext.decide(question, state, ask)`.

A decision is keyed by its question and a stable hash of its state: the SHA-256 of the state's
canonical JSON (pydantic's JSON mode for a model, keys sorted, no whitespace, UTF-8), so the same
state hashes the same in every process and release. A recorded answer replays into a retry only
into a question asked the same way, about a state that hashes the same, and while it is younger
than `replay_answers_for` (24 h); any other answer is asked afresh.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from choreography_ray.scheduler.records import Decision


def canonical_json(state: BaseModel | Mapping[str, Any]) -> str:
    data = state.model_dump(mode="json") if isinstance(state, BaseModel) else state
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def state_hash(state: BaseModel | Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(state).encode()).hexdigest()


def decision_key(question: str, hashed_state: str) -> str:
    """The question and the state's hash, as one string: the key a replay matches on."""
    question_hash = hashlib.sha256(question.encode()).hexdigest()[:32]
    return f"{question_hash}:{hashed_state}"


def is_replayable(decision: Decision, now: datetime, replay_answers_for: timedelta) -> bool:
    return now - decision.recorded_at < replay_answers_for


def replayed_answer(
    recorded: Iterable[Decision],
    question: str,
    hashed_state: str,
    now: datetime,
    replay_answers_for: timedelta,
) -> Decision | None:
    """The failed run's answer to this question about this state, while it is young enough."""
    for decision in recorded:
        if decision.question == question and decision.state_hash == hashed_state:
            return decision if is_replayable(decision, now, replay_answers_for) else None
    return None
