"""`choreography-ray dashboard`: the web dashboard on a storage, served by uvicorn.

It reads `--storage` directly, as `status` and `list` do. With `--address` it joins that Ray
cluster and its pages offer the actions, which need the token printed at start (or
`$CHOREOGRAPHY_DASHBOARD_TOKEN`). It binds 127.0.0.1 unless `--host` says otherwise.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from choreography_ray.cli._common import console, err_console, fail, open_stored
from choreography_ray.cli._options import StorageOption
from choreography_ray.runtime.names import DEFAULT_NAMESPACE
from choreography_ray.storage import redact_url

#: The port the dashboard listens on unless `--port` says otherwise (Ray's own is 8265).
DEFAULT_PORT = 8266
DEFAULT_HOST = "127.0.0.1"
#: The host names a loopback-bound dashboard answers to (a request naming another is refused,
#: against DNS rebinding).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str) -> list[str]:
    """The Host headers to answer: the loopback names when bound to loopback; the bound name
    when bound to one; any when bound to every interface."""
    if is_loopback(host):
        return [*LOOPBACK_NAMES, host]
    if host in ("0.0.0.0", "::", ""):
        return ["*"]
    return [host]


def dashboard(
    storage: StorageOption = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="The Ray cluster whose jobs managers and schedulers the actions go to, as "
            "ray.init takes it ('auto': the one running on this machine).",
            show_default="none: the dashboard only reads",
        ),
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            help="The interface to listen on; other than loopback, anyone who reaches it "
            "reads the dashboard."
        ),
    ] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(min=1, max=65535, help="The port to listen on.")] = (
        DEFAULT_PORT
    ),
    ray_namespace: Annotated[
        str, typer.Option(help="The Ray namespace of the job system's actors (with --address).")
    ] = DEFAULT_NAMESPACE,
) -> None:
    """Serve the web dashboard: jobs, a job's progress, schedules; actions with --address."""
    import uvicorn

    from choreography_ray.dashboard import RayActions, create_app
    from choreography_ray.dashboard.security import TOKEN_ENV, token_from_environment

    store = open_stored(storage, "the dashboard's pages")
    actions = None
    if address:
        actions = RayActions(store.url, address=address, ray_namespace=ray_namespace)
        try:
            actions.join()
        except Exception as error:  # ray.init raises several kinds; each is a bad address here
            fail(f"cannot join the Ray cluster at {address}: {error}")
    token, generated = token_from_environment()
    app = create_app(store, token=token, actions=actions, allowed_hosts=allowed_hosts(host))
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    console.print(f"choreography-ray dashboard at {base}/ on {redact_url(store.url)}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if actions is None:
        console.print("read only: give --address to stop, resume, remove and retry jobs",
                      highlight=False, soft_wrap=True)  # fmt: skip
    elif generated:
        console.print(f"actions need the token; log in at {base}/login?token={token}",
                      highlight=False, soft_wrap=True)  # fmt: skip
    else:
        console.print(f"actions need the token in ${TOKEN_ENV}; log in at {base}/login",
                      highlight=False, soft_wrap=True)  # fmt: skip
    if not is_loopback(host):
        err_console.print(f"warning: listening on {host}: the dashboard is plain HTTP and its "
                          "pages can be read by anyone who reaches it", highlight=False,
                          soft_wrap=True)  # fmt: skip
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
