"""The bench on the MongoDB provider directly and through the fault proxy (no fault), in one run.

    python benchmarks/mongodb_proxy.py --steps 100000
    python benchmarks/mongodb_proxy.py --steps 100000 --no-bare --actor-sample 0 --repeat 3

Starts an `nx-27017` server in a temporary directory (or uses `CHOREOGRAPHY_MONGODB_URI`'s
server) and a `tests/mongo_proxy.py` proxy in front of it, then runs `choreography-ray bench`
with both as `--storage` (every other option is the bench's own), so bare Ray tasks, the direct
provider and the proxied one are measured in the same rounds. What the proxy costs is what the
chaos suite's MongoDB runs pay for their faults (docs/chaos.md); the figures are in
docs/benchmarks.md. Nothing here is a test.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

from choreography_ray.cli import app

# The proxy is the test tree's (`tests/mongo_proxy.py`): this runs from a checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.mongo_proxy import fault_proxy, start_nx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main(bench_options: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="choreography-mongodb-bench-") as home:
        server = None
        upstream = os.environ.get("CHOREOGRAPHY_MONGODB_URI")
        if upstream is None:
            server, upstream = start_nx(Path(home), free_port())
        try:
            with fault_proxy(upstream) as proxy:
                direct = f"{upstream.rstrip('/')}/bench_direct"
                proxied = proxy.url("bench_proxied")
                print(f"direct: {direct}\nthrough the proxy: {proxied}", flush=True)
                options = ["bench", "--storage", direct, "--storage", proxied, *bench_options]
                app(options, standalone_mode=False)
        finally:
            if server is not None:
                server.terminate()
                server.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
