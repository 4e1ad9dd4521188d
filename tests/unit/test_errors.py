"""Errors: the operation error carries its code, every error pickles (Ray ships exceptions
between processes by pickling them), and storage errors name what they are about."""

from __future__ import annotations

import enum
import inspect
import pickle
import traceback
import typing

import pytest
from ray import cloudpickle
from ray.exceptions import RayTaskError

from choreography_ray import errors
from choreography_ray.errors import (
    CannotResumeJobError,
    ChoreographyError,
    CorruptRecordError,
    JobOperationError,
    OperationErrorCode,
    RemoveJobError,
    RetryFailedStepsError,
    SchedulerError,
    SchedulerOperationError,
    StartJobError,
    StopJobError,
    StorageError,
)

ERROR_ENUMS: tuple[type[enum.StrEnum], ...] = typing.get_args(OperationErrorCode)
ALL_CODES = [code for enum_type in ERROR_ENUMS for code in enum_type]


def _round_trip(value: object) -> object:
    return pickle.loads(pickle.dumps(value))


def test_operation_error_codes_include_the_enums_the_design_names() -> None:
    named = {
        StartJobError.INVALID_REQUEST,
        StopJobError.COULD_NOT_PERSIST_STOP,
        RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED,
        RemoveJobError.UNKNOWN,
        RetryFailedStepsError.NOT_SUPPORTED,
        RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES,
        RetryFailedStepsError.COULD_NOT_PERSIST,
        CannotResumeJobError.MISSING_STEP_PLAN,
    }
    assert named <= set(ALL_CODES)


@pytest.mark.parametrize("code", ALL_CODES, ids=lambda c: f"{type(c).__name__}.{c.name}")
def test_operation_error_carries_its_code(code: OperationErrorCode) -> None:
    error = JobOperationError(code, "details")
    assert error.error is code
    assert error.message == "details"
    assert str(error) == f"{type(code).__name__}.{code.name}: details"
    assert isinstance(error, ChoreographyError)


def test_operation_error_without_message_names_only_the_code() -> None:
    error = JobOperationError(StopJobError.COULD_NOT_PERSIST_STOP)
    assert str(error) == "StopJobError.COULD_NOT_PERSIST_STOP"
    assert error.message == ""


@pytest.mark.parametrize("code", ALL_CODES, ids=lambda c: f"{type(c).__name__}.{c.name}")
def test_operation_error_pickles_round_trip(code: OperationErrorCode) -> None:
    original = JobOperationError(code, "why it failed")
    copy = _round_trip(original)
    assert type(copy) is JobOperationError
    assert copy.error is code
    assert copy.message == "why it failed"
    assert str(copy) == str(original)


def test_corrupt_record_error_names_collection_and_id() -> None:
    error = CorruptRecordError("job_steps", "job-1/step-7", "status 'Exploded' is not a status")
    assert error.collection == "job_steps"
    assert error.record_id == "job-1/step-7"
    assert error.reason == "status 'Exploded' is not a status"
    assert "job_steps" in str(error)
    assert "job-1/step-7" in str(error)
    assert "Exploded" in str(error)
    assert isinstance(error, StorageError)


def test_corrupt_record_error_pickles_round_trip() -> None:
    original = CorruptRecordError("jobs", "job-1", "bad json")
    copy = _round_trip(original)
    assert type(copy) is CorruptRecordError
    assert (copy.collection, copy.record_id, copy.reason) == ("jobs", "job-1", "bad json")
    assert str(copy) == str(original)


def _exception_classes() -> list[type[BaseException]]:
    return [
        member
        for member in vars(errors).values()
        if inspect.isclass(member)
        and issubclass(member, BaseException)
        and member.__module__ == errors.__name__
    ]


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: c.__name__)
def test_every_error_has_the_one_root(cls: type[BaseException]) -> None:
    assert issubclass(cls, ChoreographyError)


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: c.__name__)
def test_every_error_is_drawn_in_the_module_tree(cls: type[BaseException]) -> None:
    assert errors.__doc__ is not None
    assert cls.__name__ in errors.__doc__


@pytest.mark.parametrize(
    "cls",
    [
        c
        for c in _exception_classes()
        if c not in (JobOperationError, CorruptRecordError, SchedulerOperationError)
    ],
    ids=lambda c: c.__name__,
)
def test_message_only_errors_pickle_round_trip(cls: type[Exception]) -> None:
    copy = _round_trip(cls("something happened"))
    assert type(copy) is cls
    assert str(copy) == "something happened"


def test_operation_error_survives_rays_task_error_wrapping() -> None:
    # What a caller of a Ray actor sees: the actor's exception wrapped in RayTaskError, pickled
    # with Ray's cloudpickle, and re-raised as an instance of both.
    try:
        raise JobOperationError(RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED, "again")
    except JobOperationError as exc:
        wrapped = RayTaskError("remove", traceback.format_exc(), exc)

    received = pickle.loads(cloudpickle.dumps(wrapped)).as_instanceof_cause()
    assert isinstance(received, JobOperationError)
    assert received.error is RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED
    assert received.message == "again"


@pytest.mark.parametrize("code", list(SchedulerError), ids=lambda c: c.name)
def test_scheduler_operation_error_carries_its_code_and_pickles(code: SchedulerError) -> None:
    original = SchedulerOperationError(code, "why")
    assert str(original) == f"SchedulerError.{code.name}: why"
    copy = _round_trip(original)
    assert type(copy) is SchedulerOperationError
    assert copy.error is code and copy.message == "why" and str(copy) == str(original)
