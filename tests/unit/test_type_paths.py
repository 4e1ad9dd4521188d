"""`type_path` of a class from a script (`__main__`): in the script's own process, the script's
module name; in a Ray worker, where such a class arrives by value inside an actor defined in the
driver's script (and that worker's `__main__` is Ray's own), the module name of the file that
defines it, as importable from the worker's path (Ray puts the script's directory on it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from choreography_ray.errors import TypeImportError
from choreography_ray.types import type_path

SCRIPT = """
class Thumbnails:
    def prepare_steps(self, request):
        return []


class Empty:
    pass
"""


def sent_by_value(path: Path, name: str) -> type:
    """Class `name` of the script at `path`, as a worker sees it when Ray pickled it by value
    from the driver: its `__module__` is `__main__`, and this process's `__main__` lacks it."""
    spec = importlib.util.spec_from_file_location("driver_script_copy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls: type = getattr(module, name)
    cls.__module__ = "__main__"
    return cls


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "apps" / "gallery_app.py"
    path.parent.mkdir()
    path.write_text(SCRIPT, encoding="utf-8")
    return path


def test_class_of_a_driver_script_seen_in_a_worker__named_by_the_scripts_module(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(script.parent))

    assert type_path(sent_by_value(script, "Thumbnails")) == "gallery_app:Thumbnails"


def test_class_of_a_driver_script__the_most_specific_path_entry_wins(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(script.parent.parent))  # would make it `apps.gallery_app`
    monkeypatch.syspath_prepend(str(script.parent))

    assert type_path(sent_by_value(script, "Thumbnails")) == "gallery_app:Thumbnails"


def test_class_of_a_driver_script_off_the_path__refused_with_advice(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])

    with pytest.raises(TypeImportError, match="define job and step types in a module"):
        type_path(sent_by_value(script, "Thumbnails"))


def test_class_of_a_driver_script_without_methods__refused_with_advice(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(script.parent))

    with pytest.raises(TypeImportError, match="define job and step types in a module"):
        type_path(sent_by_value(script, "Empty"))
