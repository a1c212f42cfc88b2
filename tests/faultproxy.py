"""A fault-injecting TCP proxy between the app and a real ``redis-server``, for the fault suite.

The proxy listens on 127.0.0.1 (a free port) and forwards to a Redis on 127.0.0.1. Tests switch
it at runtime between modes that imitate what a network or a sick Redis does to a client:

``pass``        forward both ways.
``refuse``      stop listening (new connects are refused) and reset every open connection: a
                killed Redis.
``blackhole``   accept and read, never forward and never answer: a hung host or a partition.
``delay``       forward commands at once, hold each reply ``delay`` seconds: Redis executed the
                command, the client may have given up on it.

``drop_reply``  forward the command, then drop its reply and close the connection: the command
                WAS executed, the client never learns its result.
``reset``       forward the first half of a reply, then reset the connection (RST through
                ``SO_LINGER`` 0): a reply torn in the middle.

``delay``, ``drop_reply`` and ``reset`` spare the replies to redis-py's connection handshake
(``HELLO``, ``CLIENT SETINFO``...), so every command the app sends meets the fault, also on a
fresh connection.

Counts (commands forwarded, commands swallowed, connections, replies dropped, resets) let tests
assert how often the app touched Redis and how often it could have charged a bucket.

One thread runs the whole proxy (a selector loop), so every socket is opened and closed by the
same thread and mode changes are applied between events; :meth:`FaultProxy.set_mode` returns
once the loop has applied the mode. Bounded: at most ``max_connections`` open connections,
64 KiB per read; :meth:`FaultProxy.stop` (or leaving the ``with`` block) ends the thread.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MODES = ("pass", "refuse", "blackhole", "delay", "drop_reply", "reset")
LOOPBACK = "127.0.0.1"
#: Redis commands that run the counting script: what can charge a bucket.
SCRIPT_COMMANDS = ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL")


class CommandReader:
    """Split a client's byte stream into Redis command names (RESP arrays or inline commands).

    Only the names are kept; a malformed stream is dropped rather than buffered without bound.
    """

    MAX_BUFFER = 1 << 20

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        names: list[str] = []
        while self._buffer:
            parsed = _parse_command(self._buffer)
            if parsed is None:
                break
            name, consumed = parsed
            del self._buffer[:consumed]
            names.append(name)
        if len(self._buffer) > self.MAX_BUFFER:
            self._buffer.clear()
        return names


def _parse_command(buffer: bytearray) -> tuple[str, int] | None:
    """The first complete command in ``buffer``: (upper-case name, bytes used), or None."""
    end = buffer.find(b"\r\n")
    if end < 0:
        return None
    if buffer[:1] != b"*":  # inline command: "PING\r\n"
        words = bytes(buffer[:end]).split()
        return (words[0].decode(errors="replace").upper() if words else ""), end + 2
    count = int(buffer[1:end])
    position = end + 2
    name = ""
    for index in range(count):
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        length = int(buffer[position + 1 : end])
        start = end + 2
        if len(buffer) < start + length + 2:
            return None
        if index == 0:
            name = bytes(buffer[start : start + length]).decode(errors="replace").upper()
        position = start + length + 2
    return name, position


#: Connection set-up commands: ``delay``, ``drop_reply`` and ``reset`` let their replies
#: through at once, so the fault hits the command the app sent, not redis-py's handshake.
HANDSHAKE_COMMANDS = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT", "READONLY"})


def _reply_end(buffer: bytearray, position: int = 0) -> int | None:
    """Where the complete RESP2/RESP3 reply starting at ``position`` ends, or None."""
    end = buffer.find(b"\r\n", position)
    if end < 0:
        return None
    kind = buffer[position : position + 1]
    after = end + 2
    if kind in (b"$", b"=", b"!"):  # bulk string, verbatim string, bulk error
        length = int(buffer[position + 1 : end])
        if length < 0:
            return after
        return after + length + 2 if len(buffer) >= after + length + 2 else None
    if kind in (b"*", b"~", b">", b"%", b"|"):  # array, set, push, map, attribute
        count = int(buffer[position + 1 : end])
        if kind in (b"%", b"|"):
            count *= 2
        for _ in range(max(count, 0)):
            found = _reply_end(buffer, after)
            if found is None:
                return None
            after = found
        return after
    return after  # simple string, error, integer, null, double, boolean, big number


@dataclass
class _Link:
    """One client connection and its connection to Redis."""

    client: socket.socket
    upstream: socket.socket
    reader: CommandReader = field(default_factory=CommandReader)
    #: Names of forwarded commands whose replies have not arrived yet, oldest first.
    awaiting: collections.deque[str] = field(default_factory=collections.deque)
    replies: bytearray = field(default_factory=bytearray)
    #: Replies held by ``delay`` (kept in order: later replies queue behind earlier ones).
    pending: int = 0
    last_due: float = 0.0
    closed: bool = False


class FaultProxy:
    """A proxy on 127.0.0.1 in front of the Redis on ``127.0.0.1:upstream_port``."""

    def __init__(self, upstream_port: int, *, port: int = 0, max_connections: int = 128) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self.max_connections = max_connections
        self._mode = "pass"
        self._delay = 0.0
        self._generation = 0
        self._applied = 0
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._selector = selectors.DefaultSelector()
        self._links: list[_Link] = []
        self._delayed: list[tuple[float, int, _Link, bytes]] = []
        self._sequence = itertools.count()
        self._counts_lock = threading.Lock()
        self.forwarded: collections.Counter[str] = collections.Counter()
        self.swallowed: collections.Counter[str] = collections.Counter()
        self.connections = 0
        self.upstream_failures = 0
        self.replies_dropped = 0
        self.resets = 0

    # -- control (any thread) ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def mode(self) -> str:
        return self._mode

    def start(self) -> FaultProxy:
        self._listener = self._listen()
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def set_mode(self, mode: str, *, delay: float = 0.0, timeout: float = 10.0) -> None:
        """Switch mode; return once the proxy thread applies it (listener closed or open)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        with self._changed:
            self._mode, self._delay = mode, delay
            self._generation += 1
            wanted = self._generation
            if not self._changed.wait_for(lambda: self._applied >= wanted, timeout=timeout):
                raise RuntimeError(f"fault proxy did not apply mode {mode!r} in {timeout} s")

    def reset_counts(self) -> None:
        with self._counts_lock:
            self.forwarded.clear()
            self.swallowed.clear()
            self.connections = self.upstream_failures = self.replies_dropped = self.resets = 0

    def counts(self) -> dict[str, Any]:
        """A consistent snapshot of every counter."""
        with self._counts_lock:
            return {
                "forwarded": dict(self.forwarded),
                "swallowed": dict(self.swallowed),
                "connections": self.connections,
                "upstream_failures": self.upstream_failures,
                "replies_dropped": self.replies_dropped,
                "resets": self.resets,
            }

    def scripts_forwarded(self) -> int:
        """Script calls that reached Redis (each may have charged a bucket)."""
        with self._counts_lock:
            return sum(self.forwarded[name] for name in SCRIPT_COMMANDS)

    def scripts_seen(self) -> int:
        """Script calls the app sent, whether forwarded or swallowed by ``blackhole``."""
        with self._counts_lock:
            return sum(self.forwarded[n] + self.swallowed[n] for n in SCRIPT_COMMANDS)

    # -- the proxy thread ----------------------------------------------------------------------

    def _listen(self) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, self.port))
        listener.listen(128)
        listener.setblocking(False)
        return listener

    def _run(self) -> None:
        assert self._listener is not None
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._stopping.is_set():
                self._apply_mode()
                timeout = 0.02
                if self._delayed:
                    timeout = max(0.0, min(timeout, self._delayed[0][0] - time.monotonic()))
                for key, _ in self._selector.select(timeout):
                    if key.data is None:
                        self._accept()
                    else:
                        link, side = key.data
                        if not link.closed:
                            self._read(link, side)
                self._send_due()
        finally:
            for link in list(self._links):
                self._close(link, abort=True)
            if self._listener is not None:
                self._selector.unregister(self._listener)
                self._listener.close()
                self._listener = None
            self._selector.close()

    def _apply_mode(self) -> None:
        with self._changed:
            if self._applied == self._generation:
                return
            mode = self._mode
        if mode == "refuse":
            if self._listener is not None:
                self._selector.unregister(self._listener)
                self._listener.close()
                self._listener = None
            for link in list(self._links):
                self._close(link, abort=True)
        elif self._listener is None:
            self._listener = self._listen()
            self._selector.register(self._listener, selectors.EVENT_READ, None)
        with self._changed:
            self._applied = self._generation
            self._changed.notify_all()

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        with self._counts_lock:
            self.connections += 1
        if self._mode == "refuse" or len(self._links) >= self.max_connections:
            _abort(client)
            return
        try:
            upstream = socket.create_connection((LOOPBACK, self.upstream_port), timeout=2.0)
        except OSError:
            with self._counts_lock:
                self.upstream_failures += 1
            _abort(client)
            return
        client.setblocking(True)
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(client, upstream)
        self._links.append(link)
        self._selector.register(client, selectors.EVENT_READ, (link, "client"))
        self._selector.register(upstream, selectors.EVENT_READ, (link, "upstream"))

    def _read(self, link: _Link, side: str) -> None:
        sock = link.client if side == "client" else link.upstream
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close(link, abort=False)
            return
        if side == "client":
            self._from_client(link, data)
        else:
            self._from_upstream(link, data)

    def _from_client(self, link: _Link, data: bytes) -> None:
        names = link.reader.feed(data)
        if self._mode == "blackhole":
            with self._counts_lock:
                self.swallowed.update(names)
            return
        with self._counts_lock:
            self.forwarded.update(names)
        link.awaiting.extend(names)
        try:
            link.upstream.sendall(data)
        except OSError:
            self._close(link, abort=True)

    def _from_upstream(self, link: _Link, data: bytes) -> None:
        """Split Redis's bytes into whole replies, each paired with the command it answers,
        then pass, hold, drop or tear each as the mode says (handshake replies always pass)."""
        mode = self._mode
        link.replies += data
        start = 0
        while (end := _reply_end(link.replies, start)) is not None:
            name = link.awaiting.popleft() if link.awaiting else ""
            reply = bytes(link.replies[start:end])
            start = end
            if name in HANDSHAKE_COMMANDS or mode == "pass":
                self._forward(link, reply, 0.0)
            elif mode == "delay":
                self._forward(link, reply, self._delay)
            elif mode in ("drop_reply", "reset"):
                with self._counts_lock:
                    if mode == "drop_reply":
                        self.replies_dropped += 1
                    else:
                        self.resets += 1
                if mode == "reset":
                    self._forward(link, reply[: max(1, len(reply) // 2)], 0.0)
                self._close(link, abort=mode == "reset")
                return
            # blackhole: the reply is dropped and the connection left hanging
        del link.replies[:start]

    def _forward(self, link: _Link, data: bytes, delay: float) -> None:
        """Send now, or after ``delay``; never ahead of a reply already held back."""
        if delay or link.pending:
            due = max(time.monotonic() + delay, link.last_due)
            link.pending += 1
            link.last_due = due
            heapq.heappush(self._delayed, (due, next(self._sequence), link, data))
            return
        self._send(link, data)

    def _send_due(self) -> None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, link, data = heapq.heappop(self._delayed)
            link.pending -= 1
            if not link.closed:
                self._send(link, data)

    def _send(self, link: _Link, data: bytes) -> None:
        if link.closed:
            return
        try:
            link.client.sendall(data)
        except OSError:
            self._close(link, abort=True)

    def _close(self, link: _Link, *, abort: bool) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.remove(link)
        for sock in (link.client, link.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
        if abort:
            _abort(link.client)
        else:
            link.client.close()
        link.upstream.close()


def _abort(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN, as a crashed peer or a middlebox would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
