"""Type paths from storage: imported only under `allowed_type_prefixes`, at a name boundary."""

from __future__ import annotations

import pytest

from choreography_ray.errors import TypeImportError
from choreography_ray.types import import_type, is_under


@pytest.mark.parametrize(
    ("path", "prefix", "under"),
    [
        ("myapp:Job", "myapp", True),
        ("myapp.jobs.reindex:Job", "myapp", True),
        ("myapp.jobs.reindex:Job", "myapp.jobs", True),
        ("myapp_tools.x:Job", "myapp", False),
        ("myapp.jobsx:Job", "myapp.jobs", False),
        ("myapp.jobs.reindex:Job", "myapp.jobs.", True),
        ("myapp.jobs.reindex:Job", "myapp.jobs.reindex:", True),
        ("myapp.jobs.reindex:JobTwo", "myapp.jobs.reindex:Job", False),
        ("myapp", "myapp", True),
        ("other:Job", "myapp", False),
    ],
)
def test_is_under__matches_at_a_name_boundary(path: str, prefix: str, under: bool) -> None:
    assert is_under(path, prefix) is under


def test_import_type__a_lookalike_of_an_allowed_module_is_refused_before_import() -> None:
    with pytest.raises(TypeImportError, match="not under the allowed prefixes"):
        import_type("choreography_ray_evil.x:Job", ("choreography_ray",))
    assert import_type("choreography_ray.job:Job", ("choreography_ray",)).__name__ == "Job"
