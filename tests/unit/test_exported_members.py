"""The public API is `choreography_ray.__all__`: complete, sorted, and every name in it real."""

from __future__ import annotations

import enum
import importlib
import inspect
import re

import pytest

import choreography_ray

#: The top-level modules whose public classes and enums are part of the public API.
PUBLIC_MODULES = ("model", "status", "errors", "options", "limit")


def test_all_names_exist() -> None:
    missing = [name for name in choreography_ray.__all__ if not hasattr(choreography_ray, name)]
    assert missing == []


def test_all_is_sorted_and_unique() -> None:
    names = choreography_ray.__all__
    assert list(names) == sorted(names)
    assert len(set(names)) == len(names)


def test_version_is_exported_and_matches_the_distribution() -> None:
    from importlib.metadata import version

    assert "__version__" in choreography_ray.__all__
    assert choreography_ray.__version__ == version("choreography-ray")


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_classes_of_module_are_exported(module_name: str) -> None:
    module = importlib.import_module(f"choreography_ray.{module_name}")
    defined = {
        name
        for name, member in vars(module).items()
        if inspect.isclass(member)
        and member.__module__ == module.__name__
        and not name.startswith("_")
    }
    assert defined, f"choreography_ray.{module_name} defines no public class"
    not_exported = sorted(defined - set(choreography_ray.__all__))
    assert not_exported == []


@pytest.mark.parametrize("name", [n for n in choreography_ray.__all__ if n != "__version__"])
def test_exported_name_is_the_defining_modules_object(name: str) -> None:
    member = getattr(choreography_ray, name)
    assert member.__module__.startswith("choreography_ray.")
    home = importlib.import_module(member.__module__)
    assert getattr(home, name) is member


def _exported_enums() -> list[type[enum.Enum]]:
    exported = [getattr(choreography_ray, n) for n in choreography_ray.__all__]
    return [m for m in exported if inspect.isclass(m) and issubclass(m, enum.Enum)]


def test_exported_enums_are_string_enums() -> None:
    enums = _exported_enums()
    assert {"JobStatus", "StepStatus", "JobStageFailureBehavior"} <= {e.__name__ for e in enums}
    not_str = [e.__name__ for e in enums if not issubclass(e, enum.StrEnum)]
    assert not_str == []


@pytest.mark.parametrize("enum_type", _exported_enums(), ids=lambda e: e.__name__)
def test_exported_enum_members_are_upper_snake_with_the_specs_names(
    enum_type: type[enum.StrEnum],
) -> None:
    # Members are Python names (UPPER_SNAKE); values are the spec's PascalCase names, as stored.
    for member in enum_type:
        assert re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", member.name), member.name
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", member.value), member.value
        expected = re.sub(r"(?<!^)(?=[A-Z])", "_", member.value).upper()
        assert member.name == expected
