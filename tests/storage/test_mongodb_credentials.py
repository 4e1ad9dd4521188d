"""A MongoDB server that will not take the URL's credentials: a clear `StorageUnavailableError`
without the password, from the provider and from the CLI as a subprocess.

nx-27017 (the tests' server) has no authentication, so it cannot refuse credentials the way
`mongod` does (code 18, AuthenticationFailed); given credentials, its answer to `saslStart`
lacks the payload and pymongo fails inside its handshake. That is the refusal tried here, for
real; the code-18 path is the same branch of the provider and is not caused here.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from choreography_ray.errors import StorageUnavailableError
from choreography_ray.storage.mongodb import MongoStorage

pytestmark = pytest.mark.mongodb

PASSWORD = "wr0ng-Pa55word-c3"
REPO = Path(__file__).resolve().parents[2]


def with_credentials(server: str) -> str:
    parts = urlsplit(server)
    return f"mongodb://user:{PASSWORD}@{parts.netloc}/creds?serverSelectionTimeoutMS=3000"


def test_credentials_not_taken__provider_raises_unavailable_without_the_password(
    mongodb_server: str,
) -> None:
    storage = MongoStorage(with_credentials(mongodb_server))

    async def read() -> None:
        try:
            await storage.list_manager_keys()
        finally:
            await storage.close()

    with pytest.raises(StorageUnavailableError) as refused:
        asyncio.run(read())
    message = str(refused.value)
    assert "user:***@" in message and PASSWORD not in message
    assert "authentication" in message


def test_credentials_not_taken__cli_exits_with_a_clear_error(mongodb_server: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", "list", "--storage",
         with_credentials(mongodb_server)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    assert "unavailable" in done.stderr and "user:***@" in done.stderr, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
