"""A fault proxy for MongoDB's wire protocol: an asyncio TCP proxy on loopback between pymongo and
a server (`nx-27017`, or the `mongod` of `CHOREOGRAPHY_MONGODB_URI`), that injects the faults a
network and a server cause for real, message by message:

- `latency`: every request waits this long before it is forwarded (`slow(delay, seconds)`: for
  a while);
- `reset(command)`: the next request of that command is not forwarded; its connection is closed
  (the driver sees a reset before the server saw anything);
- `drop_reply(command)`: the next request of that command is forwarded and applied, and its
  reply dropped with the connection closed: the lost acknowledgement, for real;
- `hang(command)`: the next request of that command is swallowed and its connection left open
  and silent (a half-open connection);
- `partition(seconds, refuse=True)`: for that long every connection is refused (closed as it
  is accepted, and those open are closed), or with `refuse=False` black-holed (accepted and
  never answered).

A command is the first key of the request's command document (`insert`, `update`, `delete`,
`findAndModify`, `find`, `aggregate`, `hello`, ...); None matches every request. Each fault that
fired is appended to `hits` as (fault, command). Everything is bounded: the proxy listens on
127.0.0.1 only, a partition ends by its clock, and `close` ends every connection.

The proxy runs its own event loop in a daemon thread, so a test (sync or async) and pymongo's
own threads use it alike; the fault methods may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import bson

#: Deadlines of a test's client, so that a partition or a half-open connection fails within
#: seconds: URL options for `FaultProxy.url`.
SHORT_DEADLINES = {
    "serverSelectionTimeoutMS": 1500,
    "socketTimeoutMS": 1500,
    "connectTimeoutMS": 1500,
}
#: MongoDB's message header: messageLength, requestID, responseTo, opCode (little-endian int32).
HEADER = struct.Struct("<iiii")
OP_MSG, OP_QUERY = 2013, 2004


@dataclass
class _Fault:
    kind: str
    command: str | None
    times: int


def command_of(message: bytes) -> str:
    """The command a request names: the first key of its command document ("" if unknown)."""
    try:
        op_code = HEADER.unpack_from(message)[3]
        if op_code == OP_MSG:
            at = HEADER.size + 4  # flag bits
            if message[at] != 0:  # kind 0: the command document
                return ""
            at += 1
        elif op_code == OP_QUERY:
            at = message.index(b"\0", HEADER.size + 4) + 1 + 8  # collection, skip, return
        else:
            return ""
        (length,) = struct.unpack_from("<i", message, at)
        document = bson.decode(message[at : at + length])
        return next(iter(document), "")
    except (ValueError, IndexError, struct.error, bson.errors.BSONError):
        return ""


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.latency = 0.0
        self.hits: list[tuple[str, str]] = []
        self._faults: list[_Fault] = []
        self._partition: tuple[float, bool] | None = None
        self._slow: tuple[float, float] | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="mongo-fault-proxy", daemon=True
        )
        self._thread.start()
        ready.wait(10)
        assert self._server is not None, "the fault proxy did not start"
        self.port: int = self._server.sockets[0].getsockname()[1]

    def url(self, database: str = "test", **options: object) -> str:
        """A URL through the proxy: a direct connection (the server's own address is not the
        proxy's), with `options` (e.g. `socketTimeoutMS=1000`)."""
        query = "&".join(f"{k}={v}" for k, v in {"directConnection": "true", **options}.items())
        return f"mongodb://127.0.0.1:{self.port}/{database}?{query}"

    # faults
    def reset(self, command: str | None = None, times: int = 1) -> None:
        self._add("reset", command, times)

    def drop_reply(self, command: str | None = None, times: int = 1) -> None:
        self._add("drop_reply", command, times)

    def hang(self, command: str | None = None, times: int = 1) -> None:
        self._add("hang", command, times)

    def slow(self, delay: float, seconds: float) -> None:
        with self._lock:
            self._slow = (time.monotonic() + seconds, delay)

    def partition(self, seconds: float, refuse: bool = True) -> None:
        with self._lock:
            self._partition = (time.monotonic() + seconds, refuse)
        if refuse:
            self._loop.call_soon_threadsafe(self._close_all)

    def heal(self) -> None:
        """Ends a partition and forgets the faults not fired yet."""
        with self._lock:
            self._partition = self._slow = None
            self._faults.clear()

    def close(self) -> None:
        """Ends every connection and the proxy's loop."""

        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            self._close_all()
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # internals
    def _add(self, kind: str, command: str | None, times: int) -> None:
        with self._lock:
            self._faults.append(_Fault(kind, command, times))

    def _take(self, command: str) -> str | None:
        """The fault this request meets, if any (counted as fired)."""
        with self._lock:
            for fault in self._faults:
                if fault.command in (None, command):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    self.hits.append((fault.kind, command))
                    return fault.kind
        return None

    def _delay(self) -> float:
        with self._lock:
            if self._slow is not None and time.monotonic() < self._slow[0]:
                return self._slow[1]
            return self.latency

    def _partitioned(self) -> bool | None:
        """None when there is no partition now, else whether it refuses."""
        with self._lock:
            if self._partition is None:
                return None
            until, refuse = self._partition
            if time.monotonic() >= until:
                self._partition = None
                return None
            return refuse

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
            ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    async def _connection(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter):
        self._writers.add(client_out)
        try:
            refuse = self._partitioned()
            if refuse is True:
                return
            if refuse is False:
                await client_in.read()  # black-holed: read until the client gives up
                return
            server_in, server_out = await asyncio.open_connection(*self.upstream)
            self._writers.add(server_out)
            dropped: set[int] = set()
            replies = asyncio.ensure_future(self._replies(server_in, client_out, dropped))
            try:
                await self._requests(client_in, server_out, client_out, dropped)
            finally:
                replies.cancel()
                server_out.close()
                self._writers.discard(server_out)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            client_out.close()
            self._writers.discard(client_out)

    async def _requests(
        self,
        client_in: asyncio.StreamReader,
        server_out: asyncio.StreamWriter,
        client_out: asyncio.StreamWriter,
        dropped: set[int],
    ) -> None:
        while (message := await _read(client_in)) is not None:
            if delay := self._delay():
                await asyncio.sleep(delay)
            refuse = self._partitioned()
            if refuse is True:
                return
            fault = "hang" if refuse is False else self._take(command_of(message))
            if fault == "reset":
                return
            if fault == "hang":
                await client_in.read()  # silent until the client closes the connection
                return
            if fault == "drop_reply":
                dropped.add(HEADER.unpack_from(message)[1])
            server_out.write(message)
            await server_out.drain()

    async def _replies(
        self, server_in: asyncio.StreamReader, client_out: asyncio.StreamWriter, dropped: set[int]
    ) -> None:
        while (reply := await _read(server_in)) is not None:
            if HEADER.unpack_from(reply)[2] in dropped:
                client_out.close()  # applied, never acknowledged
                return
            client_out.write(reply)
            await client_out.drain()
        client_out.close()


async def _read(reader: asyncio.StreamReader) -> bytes | None:
    """The next framed message of a stream, None at its end."""
    try:
        header = await reader.readexactly(4)
    except asyncio.IncompleteReadError:
        return None
    (length,) = struct.unpack("<i", header)
    return header + await reader.readexactly(length - 4)


@contextlib.contextmanager
def fault_proxy(upstream_url: str) -> Iterator[FaultProxy]:
    """A proxy to the server of `upstream_url` (host and port), closed at the end."""
    parts = urlsplit(upstream_url)
    proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 27017)
    try:
        yield proxy
    finally:
        proxy.close()


#: How long a started nx-27017 server may take to accept connections, in seconds.
NX_START_SECONDS = 30.0


def nx_command() -> list[str]:
    script = Path(sys.executable).with_name("nx-27017")
    if script.exists():
        return [str(script)]
    # The package has no __main__; its console script calls this.
    return [
        sys.executable,
        "-c",
        "import sys; from nx_27017.nx_27017 import main; sys.exit(main())",
    ]


def start_nx(home: Path, port: int) -> tuple[subprocess.Popen[bytes], str]:
    """An nx-27017 server on 127.0.0.1:`port` keeping its databases under `home` (one file per
    database: with one `--db` file every database would share the same collections), and its
    URL without a database. Raises `RuntimeError` (with the server's output) when it does not
    accept connections in time; the caller stops it (`terminate`, then `wait`)."""
    (home / "databases").mkdir(parents=True, exist_ok=True)
    options = ["--host", "127.0.0.1", "-p", str(port), "--data-dir", str(home / "databases")]
    options += ["--pid-file", str(home / "nx.pid"), "--log-file", str(home / "nx.log")]
    with (home / "output.log").open("wb") as output:
        try:
            server = subprocess.Popen(
                [*nx_command(), *options], cwd=home, stdout=output, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            raise RuntimeError(f"cannot start nx-27017: {exc}") from exc
    deadline = time.monotonic() + NX_START_SECONDS
    while not _accepts(port):
        exited = server.poll() is not None
        if exited or time.monotonic() > deadline:
            server.kill()
            server.wait()
            why = f"exited ({server.returncode})" if exited else "timed out"
            log = (home / "output.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"nx-27017 on port {port} {why} before accepting connections\n{log}")
        time.sleep(0.1)
    return server, f"mongodb://127.0.0.1:{port}/"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
