"""What one decision costs, in ``bench_throttle.py``: Redis round trips and commands, bytes on
the wire, SQL queries, and the Redis memory of the state it writes.

Round trips and commands are counted in this process at the socket (see :class:`Wire`); bytes
on the wire come from the server's ``INFO stats`` (``total_net_input_bytes`` +
``total_net_output_bytes``), so they are RESP payload bytes both ways, without TCP/IP headers,
for every client of that server (the socket count of this process is kept as a cross-check).
"""

from __future__ import annotations

import _socket
import contextlib
import socket
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from bench_meter import Path

#: Keys sampled per path for ``MEMORY USAGE``.
MEMORY_SAMPLE = 200


class Wire:
    """Counts this process's traffic with the Redis server on ``port`` while :meth:`counting`
    is active, at the socket: whatever sends the bytes (redis-py, django-redis, or a backend
    writing straight to a pooled connection's socket) is seen.

    A round trip is a turn: one or more sends followed by a receive on the same socket (a
    pipeline is one). Commands and the keys they write are parsed from the bytes sent.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.round_trips = 0
        self.bytes_sent = self.bytes_received = 0
        self.commands: Counter[str] = Counter()
        #: Keys written by state commands, in first-seen order, per command name.
        self.keys: dict[str, dict[bytes, None]] = {}
        self._ours: dict[int, bool] = {}
        self._sending: dict[int, bool] = {}
        self._sent: dict[int, bytearray] = {}
        self._parsed: dict[int, int] = {}

    def _is_ours(self, sock: Any) -> bool:
        ours = self._ours.get(id(sock))
        if ours is None:
            try:
                ours = sock.getpeername()[1] == self.port
            except (OSError, IndexError, TypeError):
                ours = False
            self._ours[id(sock)] = ours
        return ours

    @contextlib.contextmanager
    def counting(self) -> Iterator[Wire]:
        cls = socket.socket
        base = _socket.socket
        wire = self

        def sendall(sock: Any, data: Any, *args: Any) -> Any:
            if wire._is_ours(sock):
                if not wire._sending.get(id(sock)):
                    wire.round_trips += 1
                wire._sending[id(sock)] = True
                wire._sent.setdefault(id(sock), bytearray()).extend(data)
                wire.bytes_sent += len(data)
            return base.sendall(sock, data, *args)

        def recv(sock: Any, *args: Any) -> Any:
            data = base.recv(sock, *args)
            if wire._is_ours(sock):
                wire._sending[id(sock)] = False
                wire.bytes_received += len(data)
            return data

        def recv_into(sock: Any, *args: Any) -> Any:
            size = base.recv_into(sock, *args)
            if wire._is_ours(sock):
                wire._sending[id(sock)] = False
                wire.bytes_received += size
            return size

        patched = {"sendall": sendall, "recv": recv, "recv_into": recv_into}
        own = {name: cls.__dict__[name] for name in patched if name in cls.__dict__}
        for name, function in patched.items():
            setattr(cls, name, function)
        try:
            yield self
        finally:
            for name in patched:
                if name in own:
                    setattr(cls, name, own[name])
                else:
                    delattr(cls, name)
            self._parse()

    def written(self, commands: Sequence[str]) -> list[bytes]:
        keys: dict[bytes, None] = {}
        for name in commands:
            keys.update(self.keys.get(name, {}))
        return list(keys)

    def _parse(self) -> None:
        for sock_id, data in self._sent.items():
            start = self._parsed.get(sock_id, 0)
            for args, after in parse_resp_commands(bytes(data), start):
                self._record(args)
                self._parsed[sock_id] = after

    def _record(self, args: list[bytes]) -> None:
        name = args[0].decode().lower()
        self.commands[name] += 1
        if name in ("evalsha", "eval", "fcall"):
            keys = args[3 : 3 + int(args[2])]
        elif name in ("set", "setex") and len(args) > 1:
            keys = args[1:2]
        else:
            return
        self.keys.setdefault(name, {}).update(dict.fromkeys(keys))


def parse_resp_commands(data: bytes, pos: int = 0) -> Iterator[tuple[list[bytes], int]]:
    """The complete commands in a stream of RESP requests from ``pos``, each with the
    position after it."""
    while pos < len(data):
        try:
            end = data.index(b"\r\n", pos)
            count = int(data[pos + 1 : end])
            cursor = end + 2
            args = []
            for _ in range(count):
                end = data.index(b"\r\n", cursor)
                size = int(data[cursor + 1 : end])
                if end + 4 + size > len(data):
                    return
                args.append(data[end + 2 : end + 2 + size])
                cursor = end + 4 + size
        except ValueError:  # incomplete: the rest comes with the next send
            return
        pos = cursor
        yield args, pos


class Server:
    """The server's own counters, read with INFO on a client of its own."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.port = int(client.connection_pool.connection_kwargs.get("port", 6379))
        self.bracket_bytes = 0.0
        self.memory_call_bytes = 0.0

    def net_bytes(self) -> int:
        stats = self.client.info("stats")
        return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])

    def command_usec(self) -> dict[str, int]:
        """Microseconds the server spent executing each command so far (INFO
        commandstats). A script's own commands are counted inside it and again under their
        names: take only the commands a client sent."""
        stats = self.client.info("commandstats")
        return {name.split("_", 1)[1]: int(row["usec"]) for name, row in stats.items()}

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def calibrate(self) -> None:
        """Traffic of the INFO calls made during a measurement, taken off every one."""
        brackets, memory = [], []
        for _ in range(5):
            before = self.net_bytes()
            brackets.append(self.net_bytes() - before)
            before = self.net_bytes()
            self.used_memory()
            memory.append(self.net_bytes() - before)
        self.bracket_bytes = statistics.median(brackets)
        self.memory_call_bytes = statistics.median(memory) - self.bracket_bytes

    def active_expiry(self, on: bool) -> bool:
        """Switch the server's active expiry (DEBUG, where allowed); False if it cannot."""
        try:
            self.client.execute_command("DEBUG", "SET-ACTIVE-EXPIRE", int(on))
        except Exception:
            return False
        return True

    def memory_usage(self, keys: Sequence[bytes]) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        return [int(size) for size in pipe.execute() if size is not None]

    def existing(self, keys: Sequence[bytes]) -> int:
        found = 0
        for start in range(0, len(keys), 1000):
            found += int(self.client.exists(*keys[start : start + 1000]))
        return found


def account(
    path: Path, n: int, server: Server, connection: Any, max_seconds: float = 3.0
) -> dict[str, Any]:
    """Run ``n`` decisions of ``path`` (items built first) in ten chunks, or fewer once
    ``max_seconds`` have passed, and count what they cost: round trips, commands, SQL, bytes
    on the wire, and the memory of the state written. A path that leaves work for later
    (``settle``: the push of its usage counts) has it done inside the window, so its bytes
    and server time count too, shared by the decisions that made it (its round trips, one per
    push, do not count as the decisions').

    Active expiry is paused meanwhile where the server allows it (a key of a ``1000/hour``
    limit touched once lives 3.6 s), so every key written is still in ``used_memory`` when it
    is read between chunks. ``used_memory_per_key`` is the whole pass's growth per key written
    (hash-table resizes included when they fall in the pass); ``used_memory_marginal`` the
    median growth per key of the chunks (without resizes)."""
    from django.test.utils import CaptureQueriesContext

    items = path.source.take(n)
    size = max(1, -(-n // 10))
    wire = Wire(server.port)
    paused = server.active_expiry(False)
    memory = [server.used_memory()]
    written = [0]
    done = 0
    deadline = time.perf_counter() + max_seconds
    if path.settle is not None:
        path.settle()  # what earlier work left to push goes before the window opens
    bytes_before = server.net_bytes()
    usec_before = server.command_usec()
    try:
        with CaptureQueriesContext(connection) as queries:
            while done < n and (done == 0 or time.perf_counter() < deadline):
                with wire.counting():
                    for item in items[done : done + size]:
                        path.step(item)
                done = min(n, done + size)
                memory.append(server.used_memory())
                written.append(len(wire.written(path.state_commands)))
            if path.settle is not None:
                path.settle()  # this pass's usage counts: their push is part of the cost
        bytes_after = server.net_bytes()
        usec_after = server.command_usec()
    finally:
        if paused:
            server.active_expiry(True)
    path.source.give_back(items[done:])
    n = done
    overhead = server.bracket_bytes + server.memory_call_bytes * (len(memory) - 1)
    result: dict[str, Any] = {
        "decisions": n,
        "round_trips": wire.round_trips / n,
        "commands": {name: calls / n for name, calls in sorted(wire.commands.items())},
        "sql_queries": len(queries.captured_queries) / n,
        "wire_bytes": (bytes_after - bytes_before - overhead) / n,
        "client_bytes": (wire.bytes_sent + wire.bytes_received) / n,
        "server_us": sum(
            usec_after.get(name, 0) - usec_before.get(name, 0) for name in wire.commands
        )
        / n,
        "memory_usage_per_key": None,
        "used_memory_per_key": None,
        "used_memory_marginal": None,
        "keys_per_decision": None,
        "expiry_paused": paused,
    }
    keys = wire.written(path.state_commands)
    if not keys:
        return result
    sizes = server.memory_usage(keys[-MEMORY_SAMPLE:])  # the newest: still alive
    result["memory_usage_per_key"] = statistics.median(sizes) if sizes else None
    result["keys_per_decision"] = len(keys) / n
    if path.fresh_keys and not path.hot:
        counted = len(keys) if paused else server.existing(keys)
        if counted:
            result["used_memory_per_key"] = (memory[-1] - memory[0]) / counted
        slopes = [
            (memory[i + 1] - memory[i]) / (written[i + 1] - written[i])
            for i in range(len(memory) - 1)
            if written[i + 1] > written[i]
        ]
        result["used_memory_marginal"] = statistics.median(slopes) if slopes else None
    return result
