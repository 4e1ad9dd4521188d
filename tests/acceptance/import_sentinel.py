"""A module that records every import of it, with the importing process's pid, in
`SENTINEL_LOG`: the tests use it to show that a type outside `allowed_type_prefixes`, read from
storage, is never imported (so its module's import-time code never runs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel

import choreography_ray as cr
from tests.support import append_line

SENTINEL_LOG = Path(tempfile.gettempdir()) / "choreography-import-sentinel.log"

append_line(SENTINEL_LOG, str(os.getpid()))


class Nothing(BaseModel):
    pass


class SentinelJob(cr.Job[Nothing]):
    def prepare_steps(self, request: Nothing) -> list[cr.StepSpec]:
        return []
