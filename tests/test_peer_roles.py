"""Every peer role on both networks, against the same expectations.

Each case is a few roles talking to each other (a listener and the roles that
connect to it by name), run once in the real peer process on loopback and once
in a simulated world; one check function judges both results. A role defined
in this file (``test_echo_server``, registered with ``register_role``) runs on
both networks too: the peer process loads this file to find it.
"""
from __future__ import annotations

import pytest

from bench import peers
from bench.scenarios import simulated as simcells
from bench.peers import sim as simpeers

TOTAL = 200_000          # bytes a case sends
FRAME = 8192


@peers.register_role
class EchoServer(peers.Role):
    """Echo every byte back, reading while it writes; after the client's EOF,
    send what is left and close. Reports ``echoed_bytes``."""
    role = "test_echo_server"
    listens = True
    fields = {"recv_bytes": 65536}

    def setup(self):
        self._out = bytearray()
        self._eof = False
        self.result["echoed_bytes"] = 0

    def step(self, now):
        if self._out:
            if self._eof:
                return peers.Send(bytes(self._out))
            return peers.Duplex(bytes(self._out), self.cfg["recv_bytes"])
        if self._eof:
            self.end("closed")
            return self.next(now)
        return peers.Recv(self.cfg["recv_bytes"])

    def on_data(self, data, now):
        self.count_in(len(data), now)
        self._out += data

    def on_sent(self, n, now):
        self.sent += n
        del self._out[:n]
        self.result["echoed_bytes"] += n

    def on_eof(self, now):
        self._eof = True


# ---------------------------------------------------------------------------
# The two networks

def run_real(spec, timeout_s=15.0):
    """Listeners start at once; a role with connect="NAME" starts once NAME listens."""
    specs, later = [], {}
    for r in spec:
        r = dict(r)
        target = r.pop("connect", None)
        if target is not None:
            r["deferred"] = True
            later[r["name"]] = target
        specs.append(r)
    with peers.PeerProcess(specs, timeout_s=timeout_s) as p:
        for name, target in later.items():
            p.start(name, connect=p.address(target))
        out = p.results()
        assert p.stderr == ""
    return out


def run_sim(spec, bound=15.0):
    cell = simcells.SimCell(simcells.new_world(1))
    addrs, dial = {}, []
    for r in spec:
        r = dict(r)
        target = r.pop("connect", None)
        r.pop("listen", None)
        cfg = peers.check_role({**r, "deferred": True}, bound)
        role = simpeers.make_role(cell, cfg)
        if target is None:
            addrs[cfg["name"]] = cell.address()
            role.listen(addrs[cfg["name"]])
        else:
            dial.append((role, target))
    for role, target in dial:
        role.connect(addrs[target])
    cell.run_until_peers_end(bound)
    assert cell.all_ended()
    return {name: role.result() for name, role in cell.roles.items()}


# ---------------------------------------------------------------------------
# The cases: (spec, check(results))

def _framed(r):
    s, k = r["source"], r["sink"]
    assert s["ended"] == "closed" and s["sent_bytes"] == TOTAL
    assert s["frames_sent"] == -(-TOTAL // FRAME) and s["sending_s"] >= 0
    assert s["rate_Bps"] > 0 and s["send_blocked_s"] >= 0 and s["peer_eof"] is None
    assert k["ended"] == "eof" and k["received_bytes"] == TOTAL
    assert k["frames_count"] == s["frames_sent"] and k["last_seq"] == s["frames_sent"] - 1
    assert k["out_of_order_count"] == k["missing_count"] == k["duplicate_count"] == 0
    assert "frame_error" not in k and k["max_latency_s"] >= 0
    assert k["latency_series"] and max(v for _, v in k["latency_series"]) == k["max_latency_s"]
    assert k["eof_after_s"] >= 0 and k["pauses"] == []


def _paused(r):
    k = r["sink"]
    assert k["ended"] == "eof" and k["received_bytes"] == TOTAL
    assert [p[3] for p in k["pauses"]] == ["start_after_s", "pause_at_bytes"]
    assert k["pauses"][0][0] == 0 and k["pauses"][0][1] >= 0.1
    frm, to, at, _ = k["pauses"][1]
    assert at >= 50_000 and to - frm >= 0.1


def _reader(r):
    s, k = r["source"], r["reader"]
    assert k["ended"] == "eof" and k["received_bytes"] == TOTAL
    assert k["first_byte_after_s"] >= 0.1 and k["eof_after_connect_s"] >= k["eof_after_s"]
    assert s["ended"] == "eof" and s["peer_eof"] is True and s["sent_bytes"] == TOTAL


def _reset(r):
    s, k = r["source"], r["reset"]
    assert k["ended"] == "reset_sent" and k["reset_sent"] is True
    assert k["received_bytes"] == 50_000          # exactly after_bytes, not a byte more
    assert k["reset_after_s"] is not None and 0 <= k["reset_after_s"] <= k["ran_s"]
    assert s["ended"] == "reset" and s["sent_bytes"] >= 50_000


def _reset_at_once(r):
    k = r["reset"]
    assert k["ended"] == "reset_sent" and k["reset_sent"] is True and k["received_bytes"] == 0
    # at once: well before the client's 0.5 s hold ends (a loaded CI machine
    # can take tens of ms to schedule the peer process, so not 0.05 s)
    assert k["reset_after_s"] == pytest.approx(0.0, abs=0.3)


def _pipeline(r):
    c, k = r["client"], r["reader"]
    assert c["requests_sent"] == 50 and c["sent_bytes"] == sum(len(b"REQ %d\n" % i)
                                                               for i in range(50))
    assert c["ended"] == "closed" and c["unread_bytes"] == 0
    assert k["received_bytes"] == c["sent_bytes"] and k["ended"] == "eof"


def _push_stalled(r):
    c, s = r["client"], r["source"]
    assert c["mode"] == "stalled" and c["received_bytes"] == 0
    assert c["ended"] == "eof" and c["unread_bytes"] == 20_000
    assert s["ended"] == "closed" and s["sent_bytes"] == 20_000


def _push_healthy(r):
    c = r["client"]
    assert c["mode"] == "healthy" and c["ended"] == "eof" and c["received_bytes"] == TOTAL
    assert c["unread_bytes"] is None


def _push_until(r):
    c = r["client"]
    assert c["ended"] == "closed" and c["received_bytes"] == 0
    assert 0.3 <= c["ran_s"] < 2.0


def _echo(r):
    c, e = r["client"], r["echo"]
    assert c["ok"] is True and c["mismatch_at"] is None and c["ended"] == "eof"
    assert c["sent_bytes"] == c["received_bytes"] == TOTAL
    assert e["echoed_bytes"] == TOTAL and e["ended"] == "closed"


def _deadline(r):
    k, c = r["reader"], r["client"]
    assert k["ended"] == "timeout" and 0.5 <= k["ran_s"] < 1.5 and k["eof_at"] is None
    assert c["ended"] == "eof" and c["ran_s"] < 2.5        # saw the reader's close, not hold_s


CASES = {
    "source-sink": ([peers.sink(frame_bytes=FRAME, verify=True),
                     peers.source(connect="sink", total_bytes=TOTAL, frame_bytes=FRAME)], _framed),
    "sink-paused": ([peers.sink(start_after_s=0.1, pause_at_bytes=50_000, pause_s=0.1),
                     peers.source(connect="sink", total_bytes=TOTAL, frame_bytes=FRAME)], _paused),
    "reader": ([peers.reader(start_after_s=0.1),
                peers.source(connect="reader", total_bytes=TOTAL, frame_bytes=FRAME,
                             finish="shutdown")], _reader),
    "reset_peer": ([peers.reset_peer(listen="127.0.0.1:0", after_bytes=50_000),
                    peers.source(connect="reset", total_bytes=4_000_000, frame_bytes=FRAME,
                                 rate_Bps=2e6, max_s=5)], _reset),
    "reset_peer-at-once": ([peers.reset_peer(listen="127.0.0.1:0"),
                            peers.pipeline_client(connect="reset", count=0, hold_s=0.5)],
                           _reset_at_once),
    "pipeline_client": ([peers.reader(),
                         peers.pipeline_client(connect="reader", count=50, hold_s=0.2)],
                        _pipeline),
    "push_client-stalled": ([peers.source(listen="127.0.0.1:0", total_bytes=20_000,
                                          frame_bytes=FRAME),
                             peers.push_client(connect="source", mode="stalled",
                                               duration_s=3.0)], _push_stalled),
    "push_client-healthy": ([peers.source(listen="127.0.0.1:0", total_bytes=TOTAL,
                                          frame_bytes=FRAME),
                             peers.push_client(connect="source", mode="healthy",
                                               duration_s=5.0)], _push_healthy),
    "push_client-until": ([peers.reader(),
                           peers.push_client(connect="reader", mode="healthy",
                                             duration_s=0.3)], _push_until),
    "max_s": ([peers.reader(max_s=0.5),
               peers.pipeline_client(connect="reader", count=0, hold_s=3.0)], _deadline),
    "echo_client": ([peers.role("test_echo_server", "echo"),
                     peers.echo_client(connect="echo", total_bytes=TOTAL, chunk_bytes=4096)],
                    _echo),
}


@pytest.mark.parametrize("net", ["real", "sim"])
@pytest.mark.parametrize("case", list(CASES))
def test_role_on_both_networks(case, net):
    spec, check = CASES[case]
    results = (run_real if net == "real" else run_sim)(spec)
    assert set(results) == {r["name"] for r in spec}
    for res in results.values():
        assert res["connected"] is True and "error" not in res, res
        assert res["sockbuf_effective"][0] > 0 and res["series"]
    check(results)


def test_every_registered_role_has_a_case():
    """Every role of bench.peers.roles is played here on both networks (the HTTP and
    WebSocket roles of bench.peers.http are played by tests/test_frameworks.py, and
    register only when that module is imported)."""
    played = {r["role"] for spec, _ in CASES.values() for r in spec}
    builtin = {name for name, cls in peers.ROLES.items() if cls.__module__ == "bench.peers.roles"}
    assert builtin and builtin <= played, builtin - played


def test_a_registered_role_needs_checks_for_new_fields_and_a_free_name():
    class Odd(peers.Role):
        role = "test_odd"
        fields = {"colour": "red"}
    with pytest.raises(ValueError, match="colour"):
        peers.register_role(Odd)

    class Thief(peers.Role):
        role = "sink"
    with pytest.raises(ValueError, match="taken"):
        peers.register_role(Thief)
    assert peers.ROLES["sink"] is not Thief and "test_odd" not in peers.ROLES


def test_a_reset_that_beats_connect_is_a_connection_then_a_reset(monkeypatch):
    # A peer that resets at once can do it before the client's connect() reads
    # its result (a socket with a timeout connects in two steps): connect()
    # raises ECONNRESET although the handshake completed. That is what a connect
    # a moment quicker reports as "connected, then reset", and so must this one.
    import socket

    from bench.peers import real

    class ResetAtConnect(socket.socket):
        def connect(self, addr):
            super().connect(addr)
            raise ConnectionResetError(104, "Connection reset by peer")

    made = real._Driver._socket

    def socket_that_is_reset(self):
        s = made(self)
        self.socks.remove(s)
        odd = ResetAtConnect(fileno=s.detach())
        self.socks.append(odd)
        return odd
    monkeypatch.setattr(real._Driver, "_socket", socket_that_is_reset)
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        cfg = peers.check_role(peers.pipeline_client("c", connect=lsock.getsockname()[:2],
                                                     count=0, hold_s=0.5, max_s=5))
        res = real.play(cfg, lambda event: None)
    assert res["connected"] is True and res["ended"] == "reset" and "error" not in res, res


def test_a_driver_refuses_an_action_it_does_not_know():
    import socket

    from bench.peers import real

    class Confused(peers.Role):
        role = "test_confused"

        def step(self, now):
            return "send everything"
    peers.register_role(Confused)
    try:
        with socket.create_server(("127.0.0.1", 0)) as lsock:
            cfg = peers.check_role(peers.role("test_confused", "c",
                                              connect=lsock.getsockname()[:2], max_s=5))
            res = real.play(cfg, lambda event: None)
        assert res["ended"] == "error" and "UnknownAction" in res["error"]
        with pytest.raises(peers.UnknownAction):
            run_sim([peers.reader(), peers.role("test_confused", "c", connect="reader")])
    finally:
        del peers.ROLES["test_confused"]


USER_FILE = '''
from bench import peers
from bench.scenarios.api import Metric, Scenario, run_program


@peers.register_role
class Tally(peers.Role):
    """Listens, reads until EOF and reports how many b"x" bytes came."""
    role = "user_tally"
    listens = True
    fields = {"recv_bytes": 4096}

    def setup(self):
        self.result["x_count"] = 0

    def step(self, now):
        return peers.Recv(self.cfg["recv_bytes"])

    def on_data(self, data, now):
        self.count_in(len(data), now)
        self.result["x_count"] += bytes(data).count(b"x")


async def send(port, host, tcp_port, n):
    stream = await port.open_tcp_stream(host, tcp_port)
    await stream.send_all(b"x" * n)
    await stream.aclose()


def program(job):
    port = job.runtime.open()
    try:
        port.run(send, *job.peer("tally"), job.params["total_bytes"])
    finally:
        port.close()
    return {"written_bytes": job.params["total_bytes"]}


def run(ctx):
    ran = run_program(ctx, peers=[peers.role("user_tally", "tally", max_s=10)], max_s=10)
    got = ran.peers["tally"]["x_count"]
    return ({"tallied_count": got}, {"all_tallied": got == ran.app["written_bytes"]}, [])


SCENARIO = Scenario(
    id="U-TALLY", title="a user role", run=run, programs={"task": program},
    styles=("task",), summary="A role from the user's file counts what arrives.",
    metrics=[Metric("tallied_count", "higher", "tallied")],
    verdicts={"all_tallied": "the user's role counted every byte written"},
    presets={"tiny": {"total_bytes": 100_000}})
'''


@pytest.mark.timeout(300)
def test_a_role_from_a_scenario_file_runs_on_both_networks(tmp_path):
    import json
    import os
    import subprocess
    import sys
    path = tmp_path / "tally.py"
    path.write_text(USER_FILE)
    out = tmp_path / "res.json"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    r = subprocess.run([sys.executable, "-m", "bench", "run", "--scenario-file", str(path),
                        "--scenarios", "U-TALLY", "--runtimes", "coro", "--preset", "tiny",
                        "--net", "both", "--json", str(out), "--out", str(tmp_path / "rep")],
                       capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    cells = json.loads(out.read_text())["cells"]
    assert sorted(c.get("net", "real") for c in cells) == ["real", "sim"], cells
    for c in cells:
        assert not c["errors"], c["errors"]
        assert c["metrics"]["tallied_count"] == 100_000 and c["verdicts"] == {"all_tallied": True}


def test_a_refused_connection_is_the_same_error_on_both_networks():
    import socket
    with socket.socket() as s:             # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[:2]
    spec = peers.reader("r", connect=free, max_s=5)
    with peers.PeerProcess([spec], timeout_s=10) as p:
        real = p.results()["r"]
    cell = simcells.SimCell(simcells.new_world(1))
    role = simpeers.make_role(cell, peers.check_role({**spec, "deferred": True}, 10.0))
    role.connect(("127.0.0.1", 9999))
    cell.run_until_peers_end(10.0)
    sim = role.result()
    for res in (real, sim):
        assert res["ended"] == "error" and res["connected"] is False, res
        assert "connect to 127.0.0.1:" in res["error"] and "refused" in res["error"], res
        assert res["sent_bytes"] == res["received_bytes"] == 0 and res["series"] == []


def test_a_peer_reset_before_the_driver_looks_still_counts_as_connected(monkeypatch):
    # On a loaded machine the RST of a peer that resets at once can arrive
    # between connect() and the driver's getpeername(), which then fails with
    # ENOTCONN: the connection was made all the same.
    import errno
    import socket

    from bench.peers import real

    def unconnected(self):
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        addr = lsock.getsockname()[:2]
        cfg = peers.check_role(peers.pipeline_client("c", connect=addr, count=0, hold_s=0.1,
                                                     max_s=5))
        monkeypatch.setattr(socket.socket, "getpeername", unconnected)
        res = real.play(cfg, lambda event: None)
    assert res["connected"] is True and res.get("error") is None, res
    assert tuple(res["peer"]) == tuple(addr)
