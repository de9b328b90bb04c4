"""The TCP model interface, and the byte model (``accounting="bytes"``).

A ``SimSocket`` keeps what any TCP keeps -- its state, the bytes the
application handed over and not yet sent (``_unsent``), those sent and not yet
acknowledged (``_unacked``, ``_sent_total``), the bytes received and not yet
read (``_rcv``, ``_read_total``), the FIN, the RST, the faults -- and leaves
the accounting to one model object: how much of a send fits, when segments
leave for the link, what window the receiver offers, when it acknowledges.
The world picks the model class once (``World.tcp_model``); a socketpair
always uses ``ByteModel`` (AF_UNIX has no window).

A model is its socket's part: it reads and writes the socket's streams above,
and calls back only ``_would_block``, ``_changed``, ``_pump`` and ``_accepts``.
Both ends of a connection have the same model class, so what one model
schedules on the peer's (``peer._model.deliver``, ``on_ack``) is its own kind.
"""
from __future__ import annotations


class TcpModel:
    """What a socket asks of its TCP model. One instance per socket."""
    __slots__ = ("sock",)

    #: the smallest SO_SNDBUF / SO_RCVBUF a setsockopt can set
    min_sndbuf = 1
    min_rcvbuf = 1

    def __init__(self, sock):
        self.sock = sock

    def handshake(self, server: "TcpModel") -> None:
        """The connection is set up (called on the client's model with the
        server's): exchange the first windows."""
        raise NotImplementedError

    def send_used(self) -> int:
        """How much of ``SO_SNDBUF`` is in use (writable: at most two thirds)."""
        raise NotImplementedError

    def send(self, data) -> int:
        """Take what fits of ``data`` into the send buffer and return how many
        bytes; ``sock._would_block`` when nothing fits. The socket has checked
        its state and errors already."""
        raise NotImplementedError

    def pump(self, peer) -> None:
        """Move unsent bytes onto the link as far as the window allows, then the
        FIN if one is queued behind them. The socket has checked it is
        connected and not reset."""
        raise NotImplementedError

    def consumed(self, n: int) -> None:
        """The application read ``n`` bytes (``sock._read_total`` counts them
        already): free the receive buffer, maybe tell the sender."""
        raise NotImplementedError

    def drop(self) -> None:
        """An RST was sent or received: forget queues and timers (the socket
        empties its own streams)."""
        raise NotImplementedError


class ByteModel(TcpModel):
    """Exact byte counts: a send takes what fits in ``SO_SNDBUF``; the window is
    the receiver's ``SO_RCVBUF`` minus what is in flight or unread there, as
    last reported; every segment is acknowledged after one latency, and every
    read sends a window update."""
    __slots__ = ("peer_read",)

    def __init__(self, sock):
        super().__init__(sock)
        self.peer_read = 0               # the peer's read total, as last reported

    def handshake(self, server):
        pass

    def send_used(self) -> int:
        s = self.sock
        return len(s._unsent) + s._unacked

    def send(self, data) -> int:
        s = self.sock
        free = s.sndbuf - len(s._unsent) - s._unacked
        if free <= 0:
            s._would_block("send")
        n = len(data)
        if n > free:
            n = free
            s._unsent += memoryview(data)[:n]
        else:
            s._unsent += data
        if n:
            s._pump()
            s._changed()
        return n

    def pump(self, peer):
        s = self.sock
        world = s._world
        link = s._link
        unsent = s._unsent
        mss = world.params["mss"]
        while unsent:
            window = peer.rcvbuf - (s._sent_total - self.peer_read)
            if window <= 0:
                return
            n = min(len(unsent), mss, window)
            if n == len(unsent):
                data = bytes(unsent)
                unsent.clear()
            else:
                data = memoryview(unsent)[:n].tobytes()
                del unsent[:n]
            s._sent_total += n
            s._unacked += n
            world.call_at(link.arrival(world, n), peer._model.deliver, data)
        if s._fin_queued and not s._fin_sent:
            s._fin_sent = True
            world.call_at(link.arrival(world, 0), peer._on_fin)

    def deliver(self, data):
        """A segment arrives at this endpoint: its ACK travels back."""
        s = self.sock
        if not s._accepts(data):
            return
        world = s._world
        s._rcv += data
        n = len(data)
        world.record("deliver", s._conn, s._side, n)
        reverse = s._link
        if not reverse.dead:
            world.call_at(reverse.ack_at(world), s._peer._model.on_ack, n, s._read_total)
        s._changed()

    def on_ack(self, n, peer_read):
        s = self.sock
        if s._reset or s._vanished:
            return
        s._unacked -= n
        if peer_read > self.peer_read:
            self.peer_read = peer_read
        s._pump()
        s._changed()

    def on_window(self, peer_read):
        s = self.sock
        if s._reset or s._vanished:
            return
        if peer_read > self.peer_read:
            self.peer_read = peer_read
            s._pump()
            s._changed()

    def consumed(self, n):
        s = self.sock
        peer = s._peer
        world = s._world
        if peer is not None and not s._reset:
            # the window update travels back like an ACK
            reverse = s._link
            if not reverse.dead:
                world.call_at(reverse.ack_at(world), peer._model.on_window, s._read_total)
        s._changed()

    def drop(self):
        pass
