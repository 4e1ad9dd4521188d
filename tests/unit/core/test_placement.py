"""Placement (no Ray): where a step type's steps run, read from its class attributes and checked;
how many hosts of a shape a node fits; the actor options of a shape; which types run in a lane."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import BaseModel

from choreography_ray import JobStep
from choreography_ray.core.placement import (
    MIN_CREDIT,
    ROUNDS_PER_HOST,
    SHARED,
    Placement,
    actor_resources,
    check_limits,
    hosts_fit,
    is_batched,
    placement_of,
    uses_lane,
)
from choreography_ray.step import BatchContext, StepContext, StepResult


class Number(BaseModel):
    value: int


class Plain(JobStep[Number]):
    async def perform(self, request: Number, context: StepContext) -> StepResult:
        return StepResult.succeeded()


class SetsUp(Plain):
    async def setup(self) -> None:
        pass


class Batched(JobStep[Number]):
    async def perform_batch(
        self, requests: list[Number], context: BatchContext
    ) -> list[StepResult]:
        return [StepResult.succeeded() for _ in requests]


def step_type(name: str, **attributes: Any) -> type[JobStep[Any]]:
    """A subclass of `Plain` named `name` with the class attributes given."""
    made: type[JobStep[Any]] = type(name, (Plain,), attributes)
    return made


# placement_of


def test_placement_of__a_plain_type_runs_on_the_shared_hosts() -> None:
    assert placement_of(Plain) == SHARED == Placement(dedicated=False, shape=None, resources=())


def test_placement_of__a_dedicated_type_is_dedicated_without_a_shape() -> None:
    assert placement_of(step_type("Own", dedicated=True)) == Placement(dedicated=True)


def test_placement_of__resources_name_the_shape_as_the_pool_and_are_kept_as_floats() -> None:
    placement = placement_of(step_type("Gpu", resources={"num_gpus": 1}))

    assert placement == Placement(
        shape="num_gpus=1", resources=(("num_gpus", 1.0),), credit=MIN_CREDIT
    )
    assert not placement.dedicated
    assert all(isinstance(amount, float) for _, amount in placement.resources)


def test_placement_of__the_shape_is_sorted_by_resource_name() -> None:
    placement = placement_of(step_type("Two", resources={"num_gpus": 1, "num_cpus": 2}))

    assert placement.shape == "num_cpus=2,num_gpus=1"
    assert placement.resources == (("num_cpus", 2.0), ("num_gpus", 1.0))


def test_placement_of__a_custom_resource_is_named_as_it_is_with_its_fraction() -> None:
    placement = placement_of(
        step_type("A10G", resources={"num_cpus": 2, "accelerator_type:A10G": 0.001})
    )

    assert placement.shape == "accelerator_type:A10G=0.001,num_cpus=2"
    assert placement.resources == (("accelerator_type:A10G", 0.001), ("num_cpus", 2.0))


def test_placement_of__empty_resources_are_a_pool_of_shape_none() -> None:
    assert placement_of(step_type("Nothing", resources={})) == Placement(
        shape="none", credit=MIN_CREDIT
    )


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        pytest.param(
            {"resources": {"num_gpus": 1}, "dedicated": True},
            "Wrong: set `resources` (a pool) or `dedicated`, not both",
            id="resources-and-dedicated",
        ),
        pytest.param(
            {"resources": [("num_gpus", 1)]},
            "Wrong.resources must be a dict",
            id="resources-not-a-dict",
        ),
        pytest.param(
            {"resources": {"a/b": 1}},
            "Wrong.resources: 'a/b' is not a resource name",
            id="resource-name-with-a-slash",
        ),
        pytest.param(
            {"resources": {"num_gpus": -1}},
            "Wrong.resources['num_gpus'] must be 0 or a number >= 0.0001, not -1",
            id="negative-amount",
        ),
        pytest.param(
            {"resources": {"num_gpus": True}},
            "Wrong.resources['num_gpus'] must be 0 or a number >= 0.0001, not True",
            id="bool-amount",
        ),
        pytest.param(
            {"resources": {"num_gpus": "1"}},
            "Wrong.resources['num_gpus'] must be 0 or a number >= 0.0001, not '1'",
            id="string-amount",
        ),
        pytest.param(
            {"resources": {"num_gpus": math.inf}},
            "Wrong.resources['num_gpus'] must be 0 or a number >= 0.0001, not inf",
            id="infinite-amount",
        ),
        pytest.param(
            {"resources": {"num_gpus": 0.00001}},
            "Wrong.resources['num_gpus'] must be 0 or a number >= 0.0001, not 1e-05",
            id="amount-below-ray's-resolution",
        ),
        pytest.param(
            {"resources": {"GPU": 1}},
            "Wrong.resources: say num_cpus, num_gpus or memory, not 'GPU'",
            id="ray's-own-name",
        ),
        pytest.param(
            {"resources": {"num_gpus": 1.5}},
            "Wrong.resources['num_gpus'] = 1.5: Ray takes a whole number above 1",
            id="fraction-above-one",
        ),
        pytest.param(
            {"resources": {"memory": 1e9 + 0.5}},
            "Wrong.resources['memory'] = 1000000000.5: Ray takes a whole number of bytes",
            id="memory-not-bytes",
        ),
        pytest.param(
            {"resources": {"num_gpus": 1}, "min_hosts": -1},
            "Wrong.min_hosts must be an int >= 0, not -1",
            id="min-hosts-negative",
        ),
        pytest.param(
            {"resources": {"num_gpus": 1}, "max_hosts": 0},
            "Wrong.max_hosts must be None or an int >= 1, not 0",
            id="max-hosts-0",
        ),
        pytest.param(
            {"resources": {"num_gpus": 1}, "min_hosts": 3, "max_hosts": 2},
            "Wrong.min_hosts (3) is above max_hosts (2)",
            id="min-above-max",
        ),
        pytest.param(
            {"concurrency": 0}, "Wrong.concurrency must be an int >= 1, not 0", id="concurrency-0"
        ),
        pytest.param(
            {"concurrency": True},
            "Wrong.concurrency must be an int >= 1, not True",
            id="concurrency-bool",
        ),
        pytest.param(
            {"batch_size": 0}, "Wrong.batch_size must be an int >= 1, not 0", id="batch-size-0"
        ),
        pytest.param(
            {"batch_wait": -0.5},
            "Wrong.batch_wait must be seconds >= 0, not -0.5",
            id="batch-wait-negative",
        ),
        pytest.param(
            {"batch_wait": math.inf},
            "Wrong.batch_wait must be seconds >= 0, not inf",
            id="batch-wait-inf",
        ),
        pytest.param(
            {"max_concurrent": 0},
            "Wrong.max_concurrent must be None or an int >= 1, not 0",
            id="max-concurrent-0",
        ),
        pytest.param(
            {"max_per_second": 0},
            "Wrong.max_per_second must be None or a number > 0, not 0",
            id="max-per-second-0",
        ),
        pytest.param(
            {"max_per_second": -2.0},
            "Wrong.max_per_second must be None or a number > 0, not -2.0",
            id="max-per-second-negative",
        ),
        pytest.param(
            {"max_concurrent_per_key": 0},
            "Wrong.max_concurrent_per_key must be None or an int >= 1, not 0",
            id="max-concurrent-per-key-0",
        ),
        pytest.param(
            {"limits": "crm-api"},
            "Wrong.limits must be a tuple of limit names, not 'crm-api'",
            id="limits-a-string",
        ),
    ],
)
def test_placement_of__a_wrong_attribute_is_a_type_error_naming_it(
    attributes: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError) as raised:
        placement_of(step_type("Wrong", **attributes))

    assert message in str(raised.value)


def test_placement_of__a_class_that_is_no_job_step_is_a_type_error() -> None:
    class NotAStep:
        pass

    with pytest.raises(TypeError, match="NotAStep is not a JobStep"):
        placement_of(NotAStep)


def test_placement_of__an_instance_is_no_step_type() -> None:
    with pytest.raises(TypeError, match="is not a JobStep"):
        placement_of(Plain())  # type: ignore[arg-type]


def test_placement_of__zero_amounts_are_dropped_so_one_shape_is_one_pool() -> None:
    gpu = placement_of(step_type("Gpu", resources={"num_gpus": 1}))
    no_cpu = placement_of(step_type("GpuNoCpu", resources={"num_gpus": 1, "num_cpus": 0}))

    assert no_cpu.shape == gpu.shape == "num_gpus=1"
    assert no_cpu.resources == gpu.resources


def test_placement_of__a_whole_amount_above_one_and_a_fraction_below_one_are_taken() -> None:
    assert placement_of(step_type("Two", resources={"num_gpus": 2.0})).shape == "num_gpus=2"
    assert placement_of(step_type("Half", resources={"num_gpus": 0.5})).shape == "num_gpus=0.5"


def test_placement_of__credit_is_rounds_of_what_a_host_runs_at_once() -> None:
    where = placement_of(
        type("Wide", (Batched,), {"resources": {"num_gpus": 1}, "concurrency": 2, "batch_size": 32})
    )

    assert where.credit == ROUNDS_PER_HOST * 2 * 32
    assert placement_of(step_type("One", resources={"num_gpus": 1})).credit == MIN_CREDIT


def test_placement_of__host_bounds_come_from_the_type() -> None:
    where = placement_of(step_type("Bound", resources={"num_gpus": 1}, min_hosts=1, max_hosts=3))

    assert (where.min_hosts, where.max_hosts) == (1, 3)


# hosts_fit


def test_hosts_fit__one_gpu_each_on_a_node_of_four_gpus_fits_four() -> None:
    assert hosts_fit((("num_gpus", 1.0),), {"CPU": 2, "GPU": 4}) == 4


def test_hosts_fit__the_scarcest_resource_limits_the_hosts() -> None:
    shape = placement_of(step_type("Both", resources={"num_gpus": 1, "num_cpus": 1})).resources

    assert hosts_fit(shape, {"CPU": 2, "GPU": 4}) == 2


def test_hosts_fit__a_resource_the_node_lacks_fits_none() -> None:
    assert hosts_fit((("accelerator_type:A10G", 0.001),), {"CPU": 8, "GPU": 1}) == 0
    assert hosts_fit((("num_gpus", 1.0),), {"CPU": 8}) == 0


def test_hosts_fit__fractions_of_a_gpu_fit_as_many_as_they_add_up_to() -> None:
    assert hosts_fit((("num_gpus", 0.25),), {"CPU": 1, "GPU": 1}) == 4


def test_hosts_fit__a_tiny_custom_amount_makes_no_more_hosts_than_cpus_or_gpus() -> None:
    label = (("accelerator_type:A10G", 0.001),)

    assert hosts_fit(label, {"CPU": 2, "GPU": 1, "accelerator_type:A10G": 1}) == 2
    assert hosts_fit(label, {"CPU": 2, "GPU": 8, "accelerator_type:A10G": 1}) == 8


def test_hosts_fit__a_shape_of_zero_amounts_fits_one_host_per_cpu() -> None:
    assert hosts_fit((("num_gpus", 0.0),), {"CPU": 6, "GPU": 1}) == 6
    assert hosts_fit((), {"CPU": 3}) == 3


# actor_resources


def test_actor_resources__num_cpus_is_zero_unless_the_shape_says_so() -> None:
    assert actor_resources((("num_gpus", 1.0),)) == {"num_cpus": 0, "num_gpus": 1.0}
    assert actor_resources((("num_cpus", 2.0),)) == {"num_cpus": 2.0}
    assert actor_resources(()) == {"num_cpus": 0}


def test_actor_resources__custom_resources_go_under_resources() -> None:
    shape = placement_of(
        step_type("Custom", resources={"accelerator_type:A10G": 0.001, "memory": 1e9})
    ).resources

    assert actor_resources(shape) == {
        "num_cpus": 0,
        "memory": 1e9,
        "resources": {"accelerator_type:A10G": 0.001},
    }


# uses_lane, is_batched


def test_uses_lane__a_plain_type_does_not() -> None:
    assert (uses_lane(Plain), is_batched(Plain)) == (False, False)


def test_uses_lane__a_type_with_resources_does() -> None:
    shaped = step_type("Shaped", resources={"num_cpus": 1})

    assert (uses_lane(shaped), is_batched(shaped)) == (True, False)


def test_uses_lane__a_type_that_overrides_setup_does() -> None:
    assert (uses_lane(SetsUp), is_batched(SetsUp)) == (True, False)


def test_uses_lane__a_type_that_overrides_perform_batch_does_and_is_batched() -> None:
    assert (uses_lane(Batched), is_batched(Batched)) == (True, True)


@pytest.mark.parametrize(
    "attributes",
    [{"max_concurrent": 5}, {"max_per_second": 2.0}, {"max_concurrent_per_key": 2},
     {"limits": ("crm-api",)}],
    ids=["max-concurrent", "max-per-second", "per-key", "named"],
)  # fmt: skip
def test_uses_lane__a_limited_type_does(attributes: dict[str, Any]) -> None:
    assert uses_lane(step_type("Limited", **attributes))


def test_check_limits__a_named_limit_the_options_do_not_configure_is_a_type_error() -> None:
    limited = step_type("CallCrm", limits=("crm-api", "mail"))

    check_limits(limited, {"crm-api", "mail"})
    with pytest.raises(TypeError) as raised:
        check_limits(limited, {"crm-api"})

    assert "CallCrm.limits names 'mail', which JobsOptions.limits does not" in str(raised.value)


def test_is_batched__a_subclass_of_a_batched_type_is_batched() -> None:
    class Later(Batched):
        pass

    assert is_batched(Later) and uses_lane(Later)


def test_placement_of__amounts_that_differ_name_different_pools() -> None:
    small = placement_of(step_type("Small", resources={"memory": 4_000_000_000}))
    large = placement_of(step_type("Large", resources={"memory": 4_000_001_000}))

    assert (small.shape, large.shape) == ("memory=4000000000", "memory=4000001000")


def test_placement_of__job_step_itself_is_no_step_type() -> None:
    with pytest.raises(TypeError, match="is not a JobStep"):
        placement_of(JobStep)
