"""The peer role ``looplab check`` drives a server with: one client of one endpoint.

``check_client`` is a sans-IO role (``bench.peers.core.Role``), so it runs on both
drivers: in the peer process on blocking sockets (real network) and inside a simulated
world. It speaks just enough of three kinds of endpoint to count what matters:

- ``http``: ``GET target`` on a keep-alive HTTP/1.1 connection; responses are parsed
  (Content-Length, chunked or to EOF) by ``bench.peers.http``'s parser;
- ``ws``: the WebSocket opening handshake for ``target``, then server frames counted
  as bytes; pings are answered (a server with a heartbeat keeps a healthy client);
- ``raw``: ``target`` is the request's bytes (latin-1), sent as they are; the
  response is whatever comes back, ``declared`` bytes long when the user said so.

Its ``mode`` is the part it plays:

- ``probe``: one request; reports the status, the declared size (Content-Length,
  or ``declared``) and whether the answer streams. Ends after ``sample_bytes`` of
  body, a complete response, or ``duration_s``;
- ``healthy``: from ``start_after_s``, requests for ``duration_s``; ``latencies_s`` is
  how long it waited for each ``sample_bytes`` of body, or for a whole response when
  that is shorter (then the next request goes at once, on the same connection). The
  wait still open at the end counts too, so a client that got nothing reports its
  whole wait, never an empty list;
- ``slow``: one request, then the body read at ``rate_Bps`` (``read=False``: never
  a byte) for ``hold_s``; then it vanishes (an RST). The driver reports the bytes
  left unread in its receive queue (``unread_bytes``);
- ``shutdown``: one request, read at ``rate_Bps`` until the server ends the
  connection or ``max_s``: ``body_bytes`` against ``declared_bytes``, and how it
  ended (``eof``: a FIN; ``reset``: an RST).

Every mode reports ``status`` (HTTP; 101 for an upgraded WebSocket), ``head_bytes``,
``body_bytes``, ``declared_bytes``, ``streaming`` (an answer with no declared end),
``responses_count``, ``server_closed`` (the server ended the connection first) and
``protocol_error``. docs/check.md says how the verbs use them.
"""
from __future__ import annotations

import struct

from bench.peers.core import Bucket, Hold, Recv, Role, Send, Sleep
from bench.peers.http import _Body, _WS_KEY, ws_frame
from bench.peers.spec import register_role

__all__ = ["CheckClient", "request_bytes", "KINDS", "MODES"]

KINDS = ("http", "ws", "raw")
MODES = ("probe", "healthy", "slow", "shutdown")


def request_bytes(kind: str, target: str, host: str = "looplab.test") -> bytes:
    """What one request of an endpoint sends."""
    if kind == "http":
        return (f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: looplab-check\r\n"
                "\r\n").encode()
    if kind == "ws":
        return (f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {_WS_KEY.decode()}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n").encode()
    return target.encode("latin-1")


def _choice(values):
    def check(field, v):
        if v not in values:
            raise ValueError(f"{field} must be one of {', '.join(values)}, got {v!r}")
        return v
    return check


def _text(field, v):
    if not isinstance(v, str) or not v:
        raise TypeError(f"{field} must be a non-empty str, got {v!r}")
    return v


def _opt_count(field, v):
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TypeError(f"{field} must be an int >= 0 or None, got {v!r}")
    return v


def _flag(field, v):
    if not isinstance(v, bool):
        raise TypeError(f"{field} must be True or False, got {v!r}")
    return v


class _WsFrames:
    """Walks server frames as they stream in, buffering only headers and ping
    payloads; returns the pongs owed."""

    def __init__(self):
        self.buf = b""
        self.skip = 0            # payload bytes of a data frame still to pass over
        self.closed = False

    def feed(self, data: bytes, mask) -> bytes:
        out = []
        data = self.buf + bytes(data)
        self.buf = b""
        at = 0
        while at < len(data):
            if self.skip:
                n = min(self.skip, len(data) - at)
                self.skip -= n
                at += n
                continue
            head = data[at:at + 14]
            if len(head) < 2:
                break
            opcode, n, hl = head[0] & 0x0F, head[1] & 0x7F, 2
            if n == 126:
                if len(head) < 4:
                    break
                n, hl = struct.unpack("!H", head[2:4])[0], 4
            elif n == 127:
                if len(head) < 10:
                    break
                n, hl = struct.unpack("!Q", head[2:10])[0], 10
            if opcode in (0x8, 0x9):            # close, ping: their payloads matter
                if len(data) - at < hl + n:
                    break
                payload = data[at + hl:at + hl + n]
                if opcode == 0x9:
                    out.append(ws_frame(0xA, payload, mask()))
                else:
                    self.closed = True
                at += hl + n
            else:
                at += hl
                self.skip = n
        self.buf = data[at:]
        return b"".join(out)


class CheckClient(Role):
    """One client of one endpoint, playing one ``mode`` (see the module docstring)."""
    role = "check_client"
    fields = {"kind": "http", "target": "/", "host": "looplab.test", "declared": None,
              "mode": "probe", "duration_s": 1.0, "start_after_s": 0.0, "sample_bytes": 16384,
              "rate_Bps": None, "read": True, "hold_s": 1.0, "recv_bytes": 65536,
              "interval_s": 0.005}
    checks = {"kind": _choice(KINDS), "target": _text, "host": _text, "declared": _opt_count,
              "mode": _choice(MODES), "duration_s": lambda f, v: _seconds(f, v),
              "sample_bytes": lambda f, v: _positive(f, v), "read": _flag,
              "interval_s": lambda f, v: _seconds(f, v) if v else 0.0}

    def setup(self):
        self.wants_unread = self.cfg["mode"] == "slow"
        self.result.update(status=None, head_bytes=0, body_bytes=0, declared_bytes=None,
                           streaming=None, responses_count=0, latencies_s=[],
                           server_closed=False, protocol_error=None, first_body_after_s=None,
                           body_series=[])
        self._out = b""
        self._parser = None
        self._frames = None
        self._upgraded = False
        self._bucket = None
        self._begun = None          # when the first request went (after start_after_s)
        self._mark = None           # the wait under way began here
        self._chunk = 0             # body bytes since the mark
        self._resp_body = 0         # body bytes of the response under way
        self._until = None
        self._masks = 0
        self._next_series = 0.0
        self._next_request = None   # healthy: the next request waits until then

    # -- requests -------------------------------------------------------------------

    def _request(self, now):
        c = self.cfg
        self._out += request_bytes(c["kind"], c["target"], c["host"])
        self._resp_body = 0
        if c["kind"] != "raw" and not self._upgraded:
            self._parser = _Body()
        self._mark, self._chunk = now, 0

    def _mask(self) -> bytes:
        self._masks += 1
        return struct.pack("!I", (self._masks * 2654435761) & 0xFFFFFFFF)

    def start(self, now):
        c = self.cfg
        if c["rate_Bps"]:
            self._bucket = Bucket(c["rate_Bps"], min(c["recv_bytes"], 16384), now)

    def step(self, now):
        c = self.cfg
        if self._begun is None:
            if now < self.t0 + c["start_after_s"]:
                return Sleep(self.t0 + c["start_after_s"])
            self._begun = now
            mode = c["mode"]
            span = {"probe": c["duration_s"], "healthy": c["duration_s"], "slow": c["hold_s"],
                    "shutdown": None}[mode]
            self._until = None if span is None else now + span
            self._request(now)
        if self._out:
            return Send(self._out)
        if self._until is not None and now >= self._until:
            self._close(now)
            return self.next(now)
        if self._next_request is not None:
            if now < self._next_request:
                return Sleep(min(self._next_request, self._until))
            self._next_request = None
            self._request(now)
            return Send(self._out)
        if c["mode"] == "slow" and not c["read"]:
            return Hold(self._until)
        if self._bucket is not None and self._bucket.due > now:
            return Sleep(min(self._bucket.due, self._until or self._bucket.due))
        want = c["recv_bytes"] if self._bucket is None else min(c["recv_bytes"], 16384)
        return Recv(want, self._until)

    def on_sent(self, n, now):
        super().on_sent(n, now)
        self._out = self._out[n:]

    def _close(self, now):
        """Our own end of the mode: a slow client vanishes (RST), others close."""
        res = self.result
        if self.cfg["mode"] == "healthy" and self._mark is not None:
            res["latencies_s"].append(now - self._mark)       # the wait still open
        self.end("closed", reset=self.cfg["mode"] in ("slow", "healthy", "probe"))

    # -- what arrives ---------------------------------------------------------------

    def on_data(self, data, now):
        self.count_in(len(data), now)
        if self._bucket is not None:
            self._bucket.charge(len(data), now)
        res = self.result
        try:
            if self.cfg["kind"] == "raw" or self._upgraded:
                self._body(bytes(data), now)
                return
            while data:
                if self._parser is None:    # after the last answer: counted, not parsed
                    res["extra_bytes"] = res.get("extra_bytes", 0) + len(data)
                    return
                body = self._parser.feed(bytes(data))
                data = b""
                if self._parser.status is not None and res["status"] is None:
                    self._head(now)
                if self._upgraded:          # what followed the 101 are frames
                    leftover, self._parser = self._parser.buf, None
                    self._body(leftover, now)
                    return
                self._body(body, now)
                if self._parser.done and not self.ended:
                    leftover = self._parser.buf
                    self._response_done(now)
                    data = leftover if self._parser is not None else b""
        except ValueError as exc:
            res["protocol_error"] = str(exc)
            self.end("error")

    def _head(self, now):
        res, p = self.result, self._parser
        res["status"] = p.status
        res["head_bytes"] = self.received - len(p.buf)
        if self.cfg["kind"] == "ws":
            self._upgraded = p.status == 101
            if not self._upgraded:
                res["protocol_error"] = f"the WebSocket handshake got HTTP {p.status}"
            res["streaming"] = True
            self._frames = _WsFrames()
            return
        length = p.headers.get("content-length")
        res["declared_bytes"] = int(length) if length and length.isdigit() else None
        res["streaming"] = res["declared_bytes"] is None

    def _body(self, body: bytes, now):
        if not body:
            return
        res, c = self.result, self.cfg
        if res["first_body_after_s"] is None:
            res["first_body_after_s"] = now - self.t0
        if self._frames is not None:
            pong = self._frames.feed(body, self._mask)
            if pong:
                self._out += pong
        res["body_bytes"] += len(body)
        self._resp_body += len(body)
        if now >= self._next_series:
            res["body_series"].append([round(now - self.t0, 4), res["body_bytes"]])
            self._next_series = now + 0.05
        if c["mode"] == "healthy" and self._mark is not None:
            # one wait per arrival, however many sample_bytes it carried: a read that
            # brings 64 KiB is one wait, not one wait and three of zero
            self._chunk += len(body)
            if self._chunk >= c["sample_bytes"]:
                res["latencies_s"].append(now - self._mark)
                self._mark, self._chunk = now, self._chunk % c["sample_bytes"]
        elif c["mode"] == "probe" and res["body_bytes"] >= c["sample_bytes"]:
            self.end("closed", reset=True)
        if c["kind"] == "raw" and c["declared"] is not None and self._resp_body >= c["declared"]:
            self._response_done(now)

    def _response_done(self, now):
        res, c = self.result, self.cfg
        res["responses_count"] += 1
        if c["kind"] == "raw":
            res["declared_bytes"] = c["declared"]
            res["streaming"] = False
        self._parser = None
        if c["mode"] == "healthy":
            if self._mark != now:          # the tail of the answer: one more wait
                res["latencies_s"].append(now - self._mark)
            # a client that thinks between requests: its load is bounded in time, on
            # the simulated network too (where an answer costs no virtual time)
            self._mark = None
            self._next_request = now + c["interval_s"]
        elif c["mode"] == "probe":
            self.end("closed")
        else:              # shutdown: read on until the server ends the connection (FIN/RST)
            self._parser = None

    def on_eof(self, now):
        res = self.result
        res["server_closed"] = True
        if self._parser is not None and self._parser.state == "eof":
            self._parser.done = True
            self._response_done(now)
        if self.cfg["mode"] == "healthy" and self._mark is not None and not self.ended:
            res["latencies_s"].append(now - self._mark)
            self._mark = None
        self.end("eof")

    def on_reset(self, now):
        self.result["server_closed"] = True
        if self.cfg["mode"] == "healthy" and self._mark is not None:
            self.result["latencies_s"].append(now - self._mark)
            self._mark = None
        self.end("reset")

    def finish(self, now):
        res = self.result
        if self.t0 is not None and (not res["body_series"]
                                    or res["body_series"][-1][1] != res["body_bytes"]):
            res["body_series"].append([round(now - self.t0, 4), res["body_bytes"]])
        if self.cfg["kind"] == "raw" and res["declared_bytes"] is None:
            res["declared_bytes"] = self.cfg["declared"]
            res["streaming"] = self.cfg["declared"] is None


def _seconds(field, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
        raise ValueError(f"{field} must be a number of seconds > 0, got {v!r}")
    return float(v)


def _positive(field, v):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{field} must be an int >= 1, got {v!r}")
    return v


register_role(CheckClient)
