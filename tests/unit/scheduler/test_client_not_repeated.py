"""Issue 36, item 10: the scheduler client does not repeat a call that may have run before an
actor restart lost its answer: an acknowledgement, `acknowledge_all` and the opt-out come out
as `SchedulerUnavailableError` rather than as an error or a zero count for a call that did
its work. Calls that change nothing (reads) still wait for the restarted actor."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import ray

from choreography_ray.errors import SchedulerUnavailableError
from choreography_ray.scheduler_client import AsyncScheduler

pytestmark = pytest.mark.timeout(10)


class RestartingActor:
    """Each method's first call is applied and its answer lost to an actor restart; the next
    call is answered by the restarted actor."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        actor = self

        class Method:
            def remote(self, *args: Any) -> asyncio.Future[Any]:
                actor.calls.append(name)
                future = asyncio.get_running_loop().create_future()
                if actor.calls.count(name) == 1:
                    future.set_exception(ray.exceptions.RayActorError())
                else:
                    future.set_result(0 if name == "acknowledge_all" else [])
                return future

        return Method()


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("acknowledge", ("letter-1", "seen")),
        ("acknowledge_all", (None,)),
        ("set_replay_decisions_on_retry", (["m"], False)),
    ],
)
def test_a_call_whose_answer_was_lost_to_a_restart_is_not_repeated(
    method: str, args: tuple[Any, ...]
) -> None:
    actor = RestartingActor()
    client = AsyncScheduler(actor, "s")

    async def call() -> None:
        kwargs = {"note": "seen"} if method == "acknowledge_all" else {}
        await getattr(client, method)(*args, **kwargs)

    with pytest.raises(SchedulerUnavailableError, match=method):
        asyncio.run(call())
    assert actor.calls == [method]


def test_a_read_waits_for_the_restarted_actor() -> None:
    actor = RestartingActor()
    assert asyncio.run(AsyncScheduler(actor, "s").manifests()) == []
    assert actor.calls == ["manifests", "manifests"]
