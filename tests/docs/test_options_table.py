"""docs/options.md is what `scripts/options_table.py` prints from the option models."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docs_options_md_lists_every_option_with_its_current_default() -> None:
    render = runpy.run_path(str(ROOT / "scripts" / "options_table.py"))["render"]
    written = (ROOT / "docs" / "options.md").read_text()
    assert written == render(), (
        "docs/options.md drifted from the option models: run "
        "`python scripts/options_table.py > docs/options.md`"
    )
