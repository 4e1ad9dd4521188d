"""Type paths from storage: imported only under `allowed_type_prefixes`, at a name boundary."""

from __future__ import annotations

from pathlib import Path

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


def test_import_type__a_module_that_raises_while_imported_is_a_type_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a script that connects at module level does when an actor imports it to find its
    job type: the error names the module, the cause and the `__main__` guard."""
    (tmp_path / "connects_at_import.py").write_text(
        "raise RuntimeError('asyncio.run() cannot be called from a running event loop')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeImportError) as raised:
        import_type("connects_at_import:Squares")
    message = str(raised.value)
    assert "'connects_at_import'" in message
    assert "RuntimeError: asyncio.run() cannot be called" in message
    assert 'if __name__ == "__main__":' in message
