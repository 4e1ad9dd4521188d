"""Job types, steps and a key provider for the rehydration and multi-node recovery tests.

Hooks cannot see their job's request, so what they observe goes to a file of the job's scope
under `events_dir()` (every process of the test machine shares it): `events_file(scope, kind)`.
Steps log to the file their request names. Both are trace files (`tests.support.trace`).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import ray
from pydantic import BaseModel

import choreography_ray as cr
from tests.support import read_trace, trace


def events_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "choreography-rehydration-tests"
    path.mkdir(parents=True, exist_ok=True)
    return path


def events_file(scope: str, kind: str) -> Path:
    return events_dir() / f"{scope}.{kind}.jsonl"


#: The name `tests.runtime.test_recovery_cluster` reads the step logs by.
read = read_trace


# -- steps ----------------------------------------------------------------------------------------


class RecordedItem(BaseModel):
    log: str
    sleep: float = 0.1


class RecordedStep(cr.JobStep[RecordedItem]):
    """Logs its start and its end, with the Ray node it runs on."""

    async def perform(self, request: RecordedItem, context: cr.StepContext) -> cr.StepResult:
        node = ray.get_runtime_context().get_node_id()

        def log(event: str) -> None:
            trace(
                request.log,
                event=event,
                job=context.job_id,
                step=context.step_id,
                node=node,
                at=time.time(),
            )

        log("start")
        await asyncio.sleep(request.sleep)
        log("end")
        return cr.StepResult.succeeded()


# -- jobs -----------------------------------------------------------------------------------------


class RecordedRequest(BaseModel):
    log: str
    steps: int
    sleep: float = 0.1


class RecordedJob(cr.Job[RecordedRequest]):
    """`steps` recorded steps in one stage; its hooks log to the scope's events files."""

    def prepare_steps(self, request: RecordedRequest) -> list[cr.StepSpec]:
        item = RecordedItem(log=request.log, sleep=request.sleep)
        return [self.create_step(RecordedStep, item) for _ in range(request.steps)]

    async def on_stopped(self) -> None:
        trace(events_file(self.scope, "stopped"), job=self.job_id, at=time.time())

    async def on_before_resuming_job_steps(self) -> None:
        trace(events_file(self.scope, "resumed"), job=self.job_id, at=time.time())


class SlowResumeJob(RecordedJob):
    """Its resume hook takes half a second and logs when it started and ended."""

    async def on_before_resuming_job_steps(self) -> None:
        start = time.time()
        await asyncio.sleep(0.5)
        trace(events_file(self.scope, "resumed"), job=self.job_id, start=start, end=time.time())


# -- a key provider that fails at first -----------------------------------------------------------


class FlakyKeys:
    """A recovery key provider whose `get_keys` fails `fail` times, then returns its keys.

    Its configuration is the file `events_dir()/{token}.json` ({"fail": n, "keys": [[scope,
    namespace], ...]}, and optionally "after": [scope, job_id]: it goes on failing until that
    job has resumed); each call appends a line to `{token}.calls.jsonl`. Use the import path
    `flaky_keys_path(token)`: the module builds one subclass per token on attribute access.
    """

    token = ""

    async def get_keys(self) -> list[cr.JobsManagerKey]:
        config = json.loads((events_dir() / f"{self.token}.json").read_text())
        calls = events_dir() / f"{self.token}.calls.jsonl"
        trace(calls, at=time.time())
        after = config.get("after")
        waiting = after is not None and not any(
            e["job"] == after[1] for e in read_trace(events_file(after[0], "resumed"))
        )
        if waiting or len(read_trace(calls)) <= config["fail"]:
            raise RuntimeError(f"key provider {self.token} is not ready yet")
        return [cr.JobsManagerKey(scope=s, namespace=n) for s, n in config["keys"]]


_PROVIDER_PREFIX = "FlakyKeys_"


def flaky_keys_path(token: str) -> str:
    return f"{__name__}:{_PROVIDER_PREFIX}{token}"


def __getattr__(name: str) -> type[FlakyKeys]:
    if name.startswith(_PROVIDER_PREFIX):
        token = name[len(_PROVIDER_PREFIX) :]
        return type(name, (FlakyKeys,), {"token": token, "__module__": __name__})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
