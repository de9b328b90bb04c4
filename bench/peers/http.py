"""HTTP/1.1 and WebSocket peer roles: plain-socket clients that stay the ground truth
when the app under test is a real web framework (``bench/zoo/frameworks.py``).

Each role is a sans-IO core (``bench.peers.core.Role``) like the built-in ones, so
both drivers run it: blocking sockets in the peer process and the simulated world.
Importing this module registers them in the one role table (``register_role``); the
peer process finds them by module name (``role_origin``).

The roles listen by default: the program under test connects to them and hands the
connected socket to its framework as an accepted connection
(``loop.connect_accepted_socket``), so the framework's own protocol, request handler
and shutdown run on it while the peer plays the client. HTTP does not care which end
sent the SYN. Give ``connect=`` instead to dial a server that listens.

- ``http_client``: ``count`` GET requests for ``path``, pipelined (all at once) or one
  after another, responses parsed (Content-Length, chunked, or to EOF) and their bodies
  checked against the pattern the framework programs serve (byte i of a body is
  ``i % 251``); then, with ``finish="idle"``, it keeps the connection open and idle
  until the server closes it.
- ``http_slow_reader``, ``http_no_read``, ``http_vanish``: the same client reading at
  ``rate_Bps``, never reading a byte of the response, or resetting the connection
  after ``vanish_after_bytes`` of response body.
- ``ws_subscriber``: the WebSocket opening handshake, then server messages read (at
  ``rate_Bps`` if given), pings answered, a close answered; client frames are masked,
  as RFC 6455 requires. No WebSocket library: the framing is written here.

docs/peers.md lists every field and result with its unit.
"""
from __future__ import annotations

import base64
import hashlib
import struct

from bench.peers.core import Bucket, Hold, Recv, Role, Send, Sleep
from bench.peers.spec import register_role

__all__ = ["HttpClient", "SlowReader", "NoRead", "Vanish", "WsSubscriber", "PATTERN_PERIOD",
           "pattern", "ROLES_HERE"]

PATTERN_PERIOD = 251          # byte i of a served body is i % 251 (a prime: never aligns)
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_WS_KEY = base64.b64encode(bytes(range(16)))    # fixed: a peer's run is a function of its spec
_MAX_HEAD = 64 * 1024


def pattern(n: int, start: int = 0) -> bytes:
    """The body every framework program serves: byte i is ``(start + i) % 251``."""
    whole = bytes(range(PATTERN_PERIOD))
    k = start % PATTERN_PERIOD
    reps = (k + n) // PATTERN_PERIOD + 1
    return (whole * reps)[k:k + n]


def _str(field, v):
    if not isinstance(v, str) or not v.startswith("/"):
        raise TypeError(f"{field} must be a path starting with '/', got {v!r}")
    return v


def _opt_int(field, v):
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TypeError(f"{field} must be an int >= 0 or None, got {v!r}")
    return v


def _text(field, v):
    if v is not None and not isinstance(v, str):
        raise TypeError(f"{field} must be a str or None, got {v!r}")
    return v


def _host(field, v):
    if not isinstance(v, str) or not v or any(c in v for c in " \r\n"):
        raise TypeError(f"{field} must be a host name (a non-empty str), got {v!r}")
    return v


class _Body:
    """Incremental HTTP/1.1 response parser: head, then a Content-Length, chunked or
    read-to-EOF body. ``feed`` returns the body bytes it decoded."""

    def __init__(self):
        self.buf = b""
        self.state = "head"
        self.status = None
        self.left = None            # body bytes left (Content-Length or current chunk)
        self.chunked = False
        self.headers: dict = {}
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = []
        while not self.done:
            if self.state == "head":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > _MAX_HEAD:
                        raise ValueError("response head longer than 64 KiB")
                    break
                head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:]
                lines = head.split("\r\n")
                parts = lines[0].split(" ", 2)
                if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                    raise ValueError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
                self.status = int(parts[1])
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    self.headers[k.strip().lower()] = v.strip()
                if self.status in (101, 204, 304) or 100 <= self.status < 200:
                    self.done = True     # no body (an upgrade's bytes are not HTTP)
                    break
                if "chunked" in self.headers.get("transfer-encoding", "").lower():
                    self.chunked, self.state = True, "size"
                elif "content-length" in self.headers:
                    self.left, self.state = int(self.headers["content-length"]), "body"
                    self.done = self.left == 0
                else:
                    self.state = "eof"
            elif self.state == "body" or self.state == "chunk":
                take = self.buf[:self.left]
                self.buf = self.buf[len(take):]
                self.left -= len(take)
                out.append(take)
                if self.left:
                    break
                if self.state == "body":
                    self.done = True
                else:
                    self.state = "crlf"
            elif self.state == "crlf":
                if len(self.buf) < 2:
                    break
                self.buf, self.state = self.buf[2:], "size"
            elif self.state == "size":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    break
                size = int(self.buf[:end].split(b";")[0], 16)
                self.buf = self.buf[end + 2:]
                if size == 0:
                    self.state = "trailer"
                else:
                    self.left, self.state = size, "chunk"
            elif self.state == "trailer":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    break
                line, self.buf = self.buf[:end], self.buf[end + 2:]
                self.done = not line
            else:                       # "eof": everything until the connection ends
                out.append(self.buf)
                self.buf = b""
                break
        return b"".join(out)


class HttpClient(Role):
    """``count`` GET requests for ``path``; responses parsed and checked (see the module
    docstring). ``pipeline``: send every request at once (else the next request goes
    when a response is complete). ``finish``: "close" after the last response, or
    "idle" (keep the idle keep-alive connection open until the server closes it or
    ``max_s``). ``read=False``: never read (hold the connection for ``hold_s``).
    ``vanish_after_bytes``: reset once that much response body arrived. ``connection``:
    send a ``Connection: close`` (or ``keep-alive``) header."""
    role = "http_client"
    listens = True
    tracked = "received"
    fields = {"path": "/", "count": 1, "pipeline": False, "finish": "close", "rate_Bps": None,
              "recv_bytes": 65536, "read": True, "hold_s": 0.0, "vanish_after_bytes": None,
              "host": "looplab.test", "connection": None}
    checks = {"path": _str, "pipeline": lambda f, v: _bool(f, v),
              "finish": lambda f, v: _choice(f, v, ("close", "idle")),
              "read": lambda f, v: _bool(f, v), "vanish_after_bytes": _opt_int,
              "host": _host,
              "connection": lambda f, v: v if v is None else _choice(f, v, ("close", "keep-alive"))}

    def setup(self):
        self.result.update(responses_count=0, statuses=[], body_bytes=0, mismatch_bytes=0,
                           sse_events_count=0, first_byte_after_s=None, last_response_after_s=None,
                           idle_eof_after_s=None, eof_at=None, protocol_error=None)
        self._out = b""
        self._queued = 0                     # requests handed to the driver
        self._parser = None
        self._pos = 0                        # body offset of the response under way
        self._tail = b""                     # last byte of the body (SSE event boundaries)
        self._bucket = None

    def _request(self) -> bytes:
        c = self.cfg
        conn = f"Connection: {c['connection']}\r\n" if c.get("connection") else ""
        return (f"GET {c['path']} HTTP/1.1\r\nHost: {c['host']}\r\n"
                f"User-Agent: looplab-peer\r\n{conn}\r\n").encode()

    def start(self, now):
        c = self.cfg
        n = c["count"] if c["pipeline"] else min(1, c["count"])
        self._out = self._request() * n
        self._queued = n
        self._parser = _Body()
        if c["rate_Bps"]:
            self._bucket = Bucket(c["rate_Bps"], c["recv_bytes"], now)

    def on_sent(self, n, now):
        super().on_sent(n, now)
        self._out = self._out[n:]

    def step(self, now):
        c = self.cfg
        if self._out:
            return Send(self._out)
        if not c["read"]:
            if now >= self.t0 + c["hold_s"]:
                self.end("closed")
                return self.next(now)
            return Hold(self.t0 + c["hold_s"])
        if self._bucket is not None and self._bucket.due > now:
            return Sleep(self._bucket.due)
        return Recv(c["recv_bytes"])

    def on_data(self, data, now):
        self.count_in(len(data), now)
        res = self.result
        if res["first_byte_after_s"] is None:
            res["first_byte_after_s"] = now - self.t0
        if self._bucket is not None:
            self._bucket.charge(len(data), now)
        if self._parser is None:           # data after the last response
            res["unexpected_bytes"] = res.get("unexpected_bytes", 0) + len(data)
            return
        try:
            while data is not None:
                body = self._parser.feed(data)
                data = None
                self._body(body)
                if self.ended:
                    return
                if self._parser.done:
                    leftover = self._parser.buf
                    self._response_done(now)
                    if leftover and self._parser is not None:
                        data = leftover
                    elif leftover:
                        res["unexpected_bytes"] = res.get("unexpected_bytes", 0) + len(leftover)
        except ValueError as e:
            res["protocol_error"] = str(e)
            self.end("error")

    def _body(self, body: bytes):
        if not body:
            return
        res = self.result
        want = pattern(len(body), self._pos)
        if body != want and not self.cfg["path"].startswith("/sse"):
            res["mismatch_bytes"] += sum(1 for a, b in zip(body, want) if a != b)
        joined = self._tail + body
        res["sse_events_count"] += joined.count(b"\n\n")
        self._tail = joined[-1:]
        self._pos += len(body)
        res["body_bytes"] += len(body)
        v = self.cfg["vanish_after_bytes"]
        if v is not None and res["body_bytes"] >= v:
            self.end("reset_sent", reset=True)

    def _response_done(self, now):
        res = self.result
        res["responses_count"] += 1
        res["statuses"].append(self._parser.status)
        res["last_response_after_s"] = now - self.t0
        self._pos, self._tail = 0, b""
        c = self.cfg
        if res["responses_count"] >= c["count"]:
            self._parser = None
            if c["finish"] == "close":
                self.end("closed")
            return
        self._parser = _Body()
        if not c["pipeline"]:
            self._out += self._request()
            self._queued += 1

    def on_eof(self, now):
        res = self.result
        res["eof_at"] = now
        if self._parser is not None and self._parser.state == "eof":
            self._response_done(now)
        elif res["responses_count"] >= self.cfg["count"] and res["last_response_after_s"] is not None:
            res["idle_eof_after_s"] = now - self.t0 - res["last_response_after_s"]
        self.end("eof")


class SlowReader(HttpClient):
    """``http_client`` reading the response at ``rate_Bps`` (required)."""
    role = "http_slow_reader"
    fields = {**HttpClient.fields, "rate_Bps": 100_000.0}


class NoRead(HttpClient):
    """``http_client`` that sends its requests and never reads a byte, for ``hold_s``."""
    role = "http_no_read"
    fields = {**HttpClient.fields, "read": False, "hold_s": 1.0}


class Vanish(HttpClient):
    """``http_client`` that resets the connection once ``vanish_after_bytes`` of
    response body arrived (a client that goes away mid-response)."""
    role = "http_vanish"
    fields = {**HttpClient.fields, "vanish_after_bytes": 65536}


def _bool(field, v):
    if not isinstance(v, bool):
        raise TypeError(f"{field} must be True or False, got {v!r}")
    return v


def _choice(field, v, values):
    if v not in values:
        raise ValueError(f"{field} must be one of {', '.join(map(repr, values))}, got {v!r}")
    return v


def ws_frame(opcode: int, payload: bytes, mask_key: bytes) -> bytes:
    """One final client frame, masked with ``mask_key`` (4 bytes)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    masked = bytes(b ^ mask_key[i % 4] for i, b in enumerate(payload))
    return head + mask_key + masked


class WsSubscriber(Role):
    """The WebSocket opening handshake for ``path``, an optional ``hello`` text message,
    then every server message read (at ``rate_Bps`` if given) and checked against the
    pattern (binary messages), pings answered with pongs, a close answered with a
    close; ``close_after_messages``: close ourselves (code 1000) after that many;
    ``stall_s``: once upgraded, read nothing for that long (a subscriber that stops
    reading; its receive window closes)."""
    role = "ws_subscriber"
    listens = True
    fields = {"path": "/ws", "rate_Bps": None, "recv_bytes": 65536, "hello": None,
              "close_after_messages": None, "stall_s": 0.0, "host": "looplab.test"}
    checks = {"path": _str, "hello": _text, "close_after_messages": _opt_int, "host": _host}

    def setup(self):
        self.result.update(upgraded=False, messages_count=0, message_bytes=0, mismatch_bytes=0,
                           pings_count=0, close_code=None, closed_by=None,
                           first_message_after_s=None, close_after_s=None, eof_at=None,
                           protocol_error=None)
        self._out = b""
        self._buf = b""
        self._head = None
        self._frag = []
        self._frag_op = None
        self._masks = 0
        self._bucket = None
        self._stall_until = None

    def _mask(self) -> bytes:
        self._masks += 1
        return struct.pack("!I", (self._masks * 2654435761) & 0xFFFFFFFF)

    def start(self, now):
        c = self.cfg
        self._out = (f"GET {c['path']} HTTP/1.1\r\nHost: {c['host']}\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: {_WS_KEY.decode()}\r\n"
                     f"Sec-WebSocket-Version: 13\r\n\r\n").encode()
        if c["rate_Bps"]:
            self._bucket = Bucket(c["rate_Bps"], c["recv_bytes"], now)

    def on_sent(self, n, now):
        super().on_sent(n, now)
        self._out = self._out[n:]

    def step(self, now):
        if self._out:
            return Send(self._out)
        if self.result["upgraded"] and self.cfg["stall_s"]:
            if self._stall_until is None:
                self._stall_until = now + self.cfg["stall_s"]
            if now < self._stall_until:
                return Hold(self._stall_until)
        if self._bucket is not None and self._bucket.due > now:
            return Sleep(self._bucket.due)
        return Recv(self.cfg["recv_bytes"])

    def _fail(self, text):
        self.result["protocol_error"] = text
        self.end("error")

    def on_data(self, data, now):
        self.count_in(len(data), now)
        if self._bucket is not None:
            self._bucket.charge(len(data), now)
        self._buf += data
        res = self.result
        if not res["upgraded"]:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self._buf = self._buf[:end].decode("latin-1"), self._buf[end + 4:]
            lines = head.split("\r\n")
            accept = base64.b64encode(hashlib.sha1(_WS_KEY + _WS_GUID).digest()).decode()
            hdrs = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            if " 101 " not in lines[0] + " " or hdrs.get("sec-websocket-accept") != accept:
                return self._fail(f"handshake refused: {lines[0][:60]!r}")
            res["upgraded"] = True
            if self.cfg["hello"] is not None:
                self._out += ws_frame(0x1, self.cfg["hello"].encode(), self._mask())
        while not self.ended:
            frame = self._frame()
            if frame is None:
                return
            self._on_frame(*frame, now)

    def _frame(self):
        b = self._buf
        if len(b) < 2:
            return None
        fin, opcode, masked, n = b[0] & 0x80, b[0] & 0x0F, b[1] & 0x80, b[1] & 0x7F
        at = 2
        if n == 126:
            if len(b) < 4:
                return None
            n, at = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, at = struct.unpack("!Q", b[2:10])[0], 10
        if masked:
            self._fail("a server frame was masked")
            return None
        if len(b) < at + n:
            return None
        self._buf = b[at + n:]
        return bool(fin), opcode, b[at:at + n]

    def _on_frame(self, fin, opcode, payload, now):
        res = self.result
        if opcode == 0x9:                       # ping -> pong
            res["pings_count"] += 1
            self._out += ws_frame(0xA, payload, self._mask())
        elif opcode == 0x8:                     # close: answer it, then wait for the EOF
            res["close_code"] = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
            res["close_after_s"] = now - self.t0
            if res["closed_by"] is None:
                res["closed_by"] = "server"
                self._out += ws_frame(0x8, payload[:2], self._mask())
        elif opcode in (0x0, 0x1, 0x2):
            if opcode:                          # a message's first frame names its type
                self._frag_op = opcode
            self._frag.append(payload)
            if not fin:
                return
            msg, opcode = b"".join(self._frag), self._frag_op
            self._frag = []
            res["messages_count"] += 1
            res["message_bytes"] += len(msg)
            if res["first_message_after_s"] is None:
                res["first_message_after_s"] = now - self.t0
            if opcode == 0x2:                   # binary messages carry the pattern
                want = pattern(len(msg))
                res["mismatch_bytes"] += sum(1 for a, b in zip(msg, want) if a != b)
            limit = self.cfg["close_after_messages"]
            if limit is not None and res["messages_count"] >= limit and res["closed_by"] is None:
                res["closed_by"] = "client"
                self._out += ws_frame(0x8, struct.pack("!H", 1000), self._mask())

    def on_eof(self, now):
        self.result["eof_at"] = now
        self.end("eof")


ROLES_HERE = (HttpClient, SlowReader, NoRead, Vanish, WsSubscriber)
for _cls in ROLES_HERE:
    register_role(_cls)
