"""Settings of every test tier.

Hypothesis draws the same examples every run (`derandomize`): a test tier is never flaky, and a
failure it shows is shown again. Exploring new examples is a run of its own
(`tests/unit/core/test_state_machine.py`'s `explore`, docs/testing.md)."""

from hypothesis import settings

settings.register_profile("tiers", derandomize=True, database=None)
settings.load_profile("tiers")
