"""Job and step types are stored by import path ("pkg.module:ClassName") and imported again.

Nothing read from storage runs code but the import of a type the path names; with
`JobsOptions.allowed_type_prefixes` set, only paths under those prefixes are imported.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from choreography_ray.errors import TypeImportError


def type_path(cls: type) -> str:
    """`"pkg.module:ClassName"`. A type defined in the script being run (`__main__`) is named
    by the script's module name, so actors can import it (guard the script's driver code with
    `if __name__ == "__main__":`)."""
    if "<locals>" in cls.__qualname__:
        raise TypeImportError(
            f"{cls.__qualname__} is defined inside a function; job and step types must be "
            "importable by path (define them at module level)"
        )
    module = cls.__module__
    if module == "__main__":
        module = _script_module(cls)
    return f"{module}:{cls.__qualname__}"


def _script_module(cls: type) -> str:
    """The module name of the script that defines `cls`, a class of `__main__`."""
    main = sys.modules["__main__"]
    if getattr(main, cls.__name__, None) is not cls:
        # Not this process's script: a class Ray sent by value from a driver's script (an
        # actor defined there refers to it), seen in a worker whose `__main__` is Ray's own.
        return _module_of_source(cls)
    spec = getattr(main, "__spec__", None)
    script = getattr(main, "__file__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    if script:
        return Path(script).stem
    raise TypeImportError(
        f"{cls.__qualname__} is defined in an interactive session; define job and step types "
        "in a module"
    )


def _module_of_source(cls: type) -> str:
    """The module name under which the file that defines `cls`'s methods is importable from
    `sys.path`, from the most specific entry (Ray puts a driver's script directory on its
    workers' path, so a script `app.py` is `app`, as it is for its driver)."""
    files = {
        Path(code.co_filename).resolve()
        for member in vars(cls).values()
        if (code := getattr(getattr(member, "__func__", member), "__code__", None)) is not None
    }
    names: list[tuple[int, str]] = []
    for file in files:
        for entry in sys.path:
            try:
                parts = file.with_suffix("").relative_to(Path(entry or ".").resolve()).parts
            except ValueError:
                continue
            if all(part.isidentifier() for part in parts):
                names.append((len(parts), ".".join(parts)))
    if not names:
        raise TypeImportError(
            f"{cls.__qualname__} comes from a script (`__main__`) whose module cannot be found "
            "on this process's path; define job and step types in a module and import them"
        )
    return min(names)[1]


def import_type(path: str, allowed_prefixes: Sequence[str] | None = None) -> type:
    """The class `path` names; `TypeImportError` naming the path when it cannot be had."""
    if allowed_prefixes is not None and not any(is_under(path, p) for p in allowed_prefixes):
        raise TypeImportError(
            f"type {path!r} is not under the allowed prefixes {list(allowed_prefixes)}"
        )
    return _import(path)


def is_under(path: str, prefix: str) -> bool:
    """Whether `path` is under `prefix` at a name boundary: `"myapp"` admits `"myapp:Job"` and
    `"myapp.jobs:Job"`, not `"myapp_tools:Job"`; a prefix ending in `.` or `:` is taken as is."""
    if not path.startswith(prefix):
        return False
    rest = path[len(prefix) :]
    return not rest or prefix.endswith((".", ":")) or rest.startswith((".", ":"))


@lru_cache(maxsize=1024)
def _import(path: str) -> type:
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname:
        raise TypeImportError(f"type path {path!r} is not of the form 'pkg.module:ClassName'")
    try:
        obj: object = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as error:
        raise TypeImportError(f"cannot import type {path!r}: {error}") from error
    except Exception as error:  # the module's own code raised while it was imported
        raise TypeImportError(
            f"importing module {module_name!r} (for type {path!r}) raised "
            f"{type(error).__name__}: {error}. Ray's workers import the module that defines "
            "a job or step type: keep a script's driver code (Jobs.connect, starting jobs) "
            'under `if __name__ == "__main__":`'
        ) from error
    if not isinstance(obj, type):
        raise TypeImportError(f"{path!r} names {type(obj).__name__}, not a class")
    return obj
