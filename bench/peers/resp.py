"""A Redis-protocol (RESP2) server peer, for programs that run a real Redis client.

``resp_server`` listens; the program's client connects to it (as to a Redis server).
It reads commands (RESP arrays of bulk strings) and answers each one ``reply_delay_s``
after it arrived, in order: ``GET KEY`` with the bulk string ``value:KEY``, ``PING``
with ``+PONG``, anything else with ``+OK``. It keeps, in order, the keys of the GETs it
answered (``answered``), so what a client read can be checked against what was sent
for it: the wire's account, not the client's. Importing this module registers it.
"""
from __future__ import annotations

from bench.peers.core import Recv, Role, Send
from bench.peers.spec import register_role


def _delay(field, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or v > 60:
        raise ValueError(f"{field} must be seconds between 0 and 60, got {v!r}")
    return float(v)


def parse_commands(buf: bytes):
    """(commands, rest): the complete RESP arrays at the start of ``buf``, each a list
    of bytes, and the bytes after them."""
    out, at = [], 0
    while True:
        if at >= len(buf):
            break
        if buf[at:at + 1] != b"*":
            raise ValueError(f"not a RESP array: {buf[at:at + 20]!r}")
        end = buf.find(b"\r\n", at)
        if end < 0:
            break
        n, pos, args = int(buf[at + 1:end]), end + 2, []
        for _ in range(n):
            end = buf.find(b"\r\n", pos)
            if end < 0 or buf[pos:pos + 1] != b"$":
                break
            size = int(buf[pos + 1:end])
            if len(buf) < end + 2 + size + 2:
                break
            args.append(buf[end + 2:end + 2 + size])
            pos = end + 2 + size + 2
        if len(args) < n:
            break
        out.append(args)
        at = pos
    return out, buf[at:]


def reply_for(args) -> bytes:
    cmd = args[0].upper() if args else b""
    if cmd == b"GET" and len(args) > 1:
        value = b"value:" + args[1]
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if cmd == b"PING":
        return b"+PONG\r\n"
    return b"+OK\r\n"


class RespServer(Role):
    """Answers RESP commands after ``reply_delay_s`` (see the module docstring)."""
    role = "resp_server"
    listens = True
    tracked = "received"
    fields = {"reply_delay_s": 0.0, "recv_bytes": 65536}
    checks = {"reply_delay_s": _delay}

    def setup(self):
        self.result.update(commands_count=0, answered=[], protocol_error=None, eof_at=None)
        self._buf = b""
        self._due = []            # (when, reply, key or None), in arrival order
        self._out = b""

    def step(self, now):
        while self._due and self._due[0][0] <= now:
            _, reply, key = self._due.pop(0)
            self._out += reply
            if key is not None:
                self.result["answered"].append(key)
        if self._out:
            return Send(self._out)
        if self._due:
            return Recv(self.cfg["recv_bytes"], until=self._due[0][0])
        return Recv(self.cfg["recv_bytes"])

    def on_sent(self, n, now):
        super().on_sent(n, now)
        self._out = self._out[n:]

    def on_data(self, data, now):
        self.count_in(len(data), now)
        self._buf += data
        try:
            commands, self._buf = parse_commands(self._buf)
        except ValueError as exc:
            self.result["protocol_error"] = str(exc)
            self.end("error")
            return
        for args in commands:
            self.result["commands_count"] += 1
            key = args[1].decode("latin-1") if args and args[0].upper() == b"GET" and len(args) > 1 else None
            self._due.append((now + self.cfg["reply_delay_s"], reply_for(args), key))

    def on_eof(self, now):
        self.result["eof_at"] = now
        self.end("eof")


register_role(RespServer)

__all__ = ["RespServer", "parse_commands", "reply_for"]
