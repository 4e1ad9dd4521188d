"""The web dashboard: `choreography-ray dashboard` serves it (see docs/dashboard.md).

A Starlette application with server-rendered Jinja2 templates and one small script for the live
parts; its templates, stylesheet and script ship in this package. The pages read storage directly
(the records are the truth, as for `status` and `list`); the actions go through the jobs managers'
and schedulers' clients in the Ray cluster at `--address`, and need the dashboard's token.

    app.py        the ASGI app: routes, login, error pages, the guarding middleware
    jobs.py       the jobs list, a job's page and live fragment, the job actions
    schedules.py  manifests, runs, dead letters and their actions
    actions.py    what the buttons do, through the clients (`Actions`, `RayActions`)
    security.py   the token, the session, CSRF, the response headers
    progress.py   bar segments, rate and ETA
    site.py       the state every page shares, templates and filters
"""

from __future__ import annotations

from choreography_ray.dashboard.actions import (
    ActionRefused,
    Actions,
    DeadLetterOperation,
    JobOperation,
    RayActions,
)
from choreography_ray.dashboard.app import create_app
from choreography_ray.dashboard.security import TOKEN_ENV

__all__ = [
    "TOKEN_ENV",
    "ActionRefused",
    "Actions",
    "DeadLetterOperation",
    "JobOperation",
    "RayActions",
    "create_app",
]
