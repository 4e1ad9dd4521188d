"""The limiter of a Ray namespace (`limiter`: one actor holding every limit of the cluster,
`core.limits.LimitCore`), the gate a step host asks it through (`gate_for`), and the calls
behind `Jobs.set_limit`, `Jobs.limits` and `choreography-ray limits`.

An async actor whose calls never await but to store a limit set live, so each runs whole, one
at a time: a few dict updates. A limit set live is stored in Ray's internal KV (in the GCS)
before it is used, and read again when the limiter starts (after its node was lost, say).
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray.experimental import internal_kv
from ray.util import metrics as ray_metrics

from choreography_ray.core.gate import Gate, Spawn
from choreography_ray.core.limits import Holding, Key, LimitCore, TypeLimits, Want
from choreography_ray.limit import Limit, LimitState
from choreography_ray.logs import configure_actor, get_logger
from choreography_ray.runtime.names import LIMITER, actor_options
from choreography_ray.runtime.recovery import KV_NAMESPACE
from choreography_ray.step import JobStep
from choreography_ray.types import type_path

log = get_logger(__name__)

#: Seconds a call to the limiter may take before the caller gives up on it (and asks again).
CALL_SECONDS = 10.0
#: Seconds `limit_states` and `set_limit` wait for the limiter's answer.
ANSWER_SECONDS = 10.0
#: Seconds between two recordings of the limit gauges.
GAUGE_SECONDS = 5.0
#: The limit gauges (docs/metrics.md), tagged by `limit` (a limit's name, or a step type's
#: import path) and `kind` (named, type, per-key): never by concurrency key.
LIMIT_GAUGES = {
    "choreography_limit_held": "Permits of the limit held by steps (running or about to).",
    "choreography_limit_waiting": "Steps waiting for a permit of the limit.",
}


@ray.remote
class Limiter:
    def __init__(self, namespace: str) -> None:
        configure_actor()
        with warnings.catch_warnings():  # Ray 2.60 reads its own deprecated `actor_id` here
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.namespace = namespace
        self.core = LimitCore(time.monotonic(), restarted, load_live(namespace))
        #: Whether the hosts that asked lately have metrics on.
        self.metrics = False
        self._gauges = asyncio.get_running_loop().create_task(self._record_gauges())

    async def take(
        self, holder: str, holding: Holding, metrics: bool = True
    ) -> tuple[dict[Want, int], float]:
        self.metrics = self.metrics or metrics
        return self.core.take(holder, holding, time.monotonic())

    async def report(self, holder: str, holding: Holding) -> None:
        self.core.report(holder, holding, time.monotonic())

    async def set_limit(self, name: str, limit: Limit) -> None:
        """Changes a named limit: stored first, so a restarted limiter keeps it."""
        await asyncio.to_thread(store_live, self.namespace, name, limit)
        self.core.set_limit(name, limit)
        log.info("limit %s set live: %s", name, limit.describe())

    async def states(self) -> list[LimitState]:
        return self.core.states(time.monotonic())

    async def _record_gauges(self) -> None:
        gauges = {name: ray_metrics.Gauge(name, text, ("limit", "kind")) for name, text in
                  LIMIT_GAUGES.items()}  # fmt: skip
        while True:
            await asyncio.sleep(GAUGE_SECONDS)
            if not self.metrics:
                continue
            try:
                for state in self.core.states(time.monotonic()):
                    tags = {"limit": state.name, "kind": state.kind}
                    gauges["choreography_limit_held"].set(state.held, tags=tags)
                    gauges["choreography_limit_waiting"].set(state.waiting, tags=tags)
            except Exception:
                log.exception("recording the limit gauges failed")


def limiter(namespace: str) -> Any:
    """The namespace's limiter, created when missing. Blocks on the GCS."""
    return Limiter.options(**actor_options(LIMITER, namespace)).remote(namespace)  # type: ignore[attr-defined]


def _kv_key(namespace: str, name: str = "") -> str:
    return f"limits/{namespace}/{name}"


def store_live(namespace: str, name: str, limit: Limit) -> None:
    internal_kv._internal_kv_put(
        _kv_key(namespace, name), limit.model_dump_json(), overwrite=True, namespace=KV_NAMESPACE
    )


def load_live(namespace: str) -> dict[str, Limit]:
    """The limits set live in the namespace, as stored."""
    live: dict[str, Limit] = {}
    prefix = _kv_key(namespace)
    for key in internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        name = (key.decode() if isinstance(key, bytes) else key).removeprefix(prefix)
        if value is not None:
            live[name] = Limit.model_validate_json(value)
    return live


def set_limit(namespace: str, name: str, limit: Limit) -> None:
    """`Jobs.set_limit`: in effect on the limiter's next answers. Blocks."""
    ray.get(limiter(namespace).set_limit.remote(name, limit), timeout=ANSWER_SECONDS)


def limit_states(namespace: str) -> list[LimitState]:
    """`Jobs.limits`: every limit the namespace's limiter counts (none without a limiter)."""
    try:
        handle = ray.get_actor(LIMITER, namespace=namespace)
    except ValueError:
        return []
    states: list[LimitState] = ray.get(handle.states.remote(), timeout=ANSWER_SECONDS)
    return states


def gate_for(
    step_type: type[JobStep[Any]],
    namespace: str,
    incarnation: str,
    spawn: Spawn,
    named: Callable[[], Mapping[str, Limit]],
    metrics: Callable[[], bool],
) -> Gate:
    """A host's gate for a limited type. The limiter is found (or created) on the gate's first
    call, in a thread; a call that fails is made again (`core.gate`), and so is the finding:
    the steps wait meanwhile, the limit is never dropped. `named` says the named limits of the
    type as the host's options configure them, on each call. Its `wake` is set by the
    lane that uses it."""
    path = type_path(step_type)
    holder = f"{incarnation}/{path}"
    type_limits = TypeLimits.of(step_type)
    found: list[Any] = []

    async def call(method: str, *args: Any) -> Any:
        try:
            if not found:
                found.append(await asyncio.to_thread(limiter, namespace))
            async with asyncio.timeout(CALL_SECONDS):
                return await getattr(found[0], method).remote(holder, *args)
        except Exception:
            found.clear()  # found again on the next call: it may have been killed for good
            raise

    async def ask(wants: dict[Want, int], held: dict[Key, int]) -> tuple[dict[Want, int], float]:
        holding = Holding(path, type_limits, dict(named()), held, wants)
        granted, wait = await call("take", holding, metrics())
        return dict(granted), float(wait)

    async def report(held: dict[Key, int], wants: dict[Want, int]) -> None:
        await call("report", Holding(path, type_limits, dict(named()), held, wants))

    return Gate(path, ask, report, lambda: None, spawn)
