"""The Linux accounting model (``accounting="linux"``): skbs, truesize and Linux's window.

One ``LinuxModel`` per socket, behind the ``TcpModel`` interface (``model.py``):
the socket keeps the byte streams (what is unsent, unacknowledged, unread) and
asks its model how much a send takes, when segments leave, what window the
receiver offers and when it ACKs. Each method names the Linux function it
mirrors; the constants are in ``constants.py`` with their kernel names.

Linux does not count bytes against a socket's buffers: it counts skbs.
A send appends to the last unsent skb up to a size goal, then starts new
skbs for as long as the queued memory (sk_wmem_queued: payload plus a
fixed truesize overhead per skb) is below SO_SNDBUF -- so one send can
overshoot the buffer by up to one skb, and a send takes whole skbs. The
size goal is bounded by half the largest window the peer ever offered
(tcp_bound_to_half_wnd), and that window comes from the peer's receive
memory (payload plus overhead per skb) scaled by the payload/truesize
ratio it measured (tcp_win_from_space), capped by rcv_ssthresh (which
grows only while the buffer has room for more than it), and never shrunk
once offered. On loopback with 64 KiB pinned (128 KiB effective) buffers
that makes the first skbs 32,741 bytes (half of the SYN's 65,483-byte
window), the window 94,834 bytes once the first segment is measured, and
every later skb 47,417 bytes: S3's 8,000,000-byte write leaves
(8,000,000 - 32,741 - 94,834) mod 47,417 = 1,203 bytes in the last skb.
The ACK rules (quick ACKs, delayed ACKs, ACK on read) decide when the
sender's memory comes back, and with it when a writer wakes.
"""
from __future__ import annotations

from collections import deque

from .constants import (
    CONNECTED, DELACK_S, GSO_MAX_SIZE, MAX_QUICKACKS, MIN_HALF_WND, MIN_TSO_SEGS, PROBE_S,
    RATIO_DEFAULT, RATIO_SHIFT, SOCK_MIN_RCVBUF, SOCK_MIN_SNDBUF, TCP_MSS_DEFAULT,
)
from .model import TcpModel


class LinuxModel(TcpModel):
    """Linux's TCP accounting for one socket (see the module docstring)."""
    __slots__ = ("wq", "rtx", "wmem", "wnd_end", "max_window", "snd_wnd", "pushed_seq",
                 "last_tx", "srtt", "persist", "rq", "rmem", "rcv_nxt", "rcv_wup", "rcv_wnd",
                 "ssthresh", "clamp", "ratio", "rcv_mss", "wscale", "ack_pending", "ack_pushed",
                 "ack_started", "quick", "delack_ev")
    min_sndbuf = SOCK_MIN_SNDBUF
    min_rcvbuf = SOCK_MIN_RCVBUF

    def __init__(self, sock):
        super().__init__(sock)
        self.wq = deque()                # unsent skbs' lengths, oldest first (sum: sock._unsent)
        self.rtx = deque()               # sent, unacknowledged skbs: (length, sent at)
        self.wmem = 0                    # sk_wmem_queued: both queues' data + overhead per skb
        self.wnd_end = 0                 # the peer's window's right edge, in our send offsets
        self.max_window = 0              # the largest window the peer ever offered
        self.snd_wnd = 0                 # the window it offered last
        self.pushed_seq = 0              # send offset of the last push (forced_push)
        self.last_tx = -1.0              # when we last sent a segment
        self.srtt = 0.0                  # smoothed round trip, from ACKs
        self.persist = None              # the persist timer, while armed
        self.rq = deque()                # received skbs not wholly read: [unread, truesize]
        self.rmem = 0                    # sk_rmem_alloc: their truesize
        self.rcv_nxt = 0                 # bytes received
        self.rcv_wup = 0                 # rcv_nxt when the window was last advertised
        self.rcv_wnd = 0                 # the window advertised then
        self.ssthresh = 0                # rcv_ssthresh: how far the window may grow now
        self.clamp = 0                   # window_clamp: the window for the whole buffer
        self.ratio = RATIO_DEFAULT       # scaling_ratio: payload per byte of truesize, x256
        self.rcv_mss = TCP_MSS_DEFAULT   # the peer's segment size, as measured
        self.wscale = 0                  # our receive window's scale (granularity 2**this)
        self.ack_pending = False         # data received and not yet ACKed
        self.ack_pushed = False          # ... some of it in a short segment
        self.ack_started = False         # any data received yet
        self.quick = 0                   # quick ACKs left (ACK every segment)
        self.delack_ev = None            # the delayed-ACK timer, while armed

    def handshake(self, server):
        """Each side's first window: the SYN's (ours) and the SYN-ACK's (the server's)."""
        self.wnd_end = self.max_window = self.snd_wnd = server.open()
        server.wnd_end = server.max_window = server.snd_wnd = self.open()
        self.srtt = server.srtt = 2 * self.sock._link.latency     # the handshake's

    def send_used(self) -> int:
        return self.wmem

    def open(self) -> int:
        """The handshake: set up this end's receive side and return the window
        its SYN (or SYN-ACK) offers (tcp_select_initial_window)."""
        s = self.sock
        mss = s._world.params["mss"]
        space = (s.rcvbuf * RATIO_DEFAULT) >> RATIO_SHIFT
        self.ratio = RATIO_DEFAULT
        self.clamp = space
        self.wscale = min(14, max(0, space.bit_length() - 16))
        wnd = space - space % mss if space > mss else space
        wnd = min(wnd, 65535)                 # a SYN's window is never scaled
        self.rcv_wnd = self.ssthresh = wnd
        self.rcv_mss = TCP_MSS_DEFAULT
        return wnd

    def mss_now(self):
        """(segment size, size goal) for what we send now (tcp_current_mss,
        tcp_xmit_size_goal): both bounded by half the peer's largest window."""
        s = self.sock
        mss = s._world.params["mss"]
        w = self.max_window
        cutoff = w >> 1 if w > TCP_MSS_DEFAULT else w
        if cutoff and mss > cutoff:
            mss = max(cutoff, MIN_HALF_WND)
        goal = GSO_MAX_SIZE
        if cutoff and goal > cutoff:
            goal = max(cutoff, MIN_HALF_WND)
        return mss, max(mss, goal // mss * mss)

    def send(self, data) -> int:
        """tcp_sendmsg: fill the last unsent skb up to the size goal, then new
        skbs while sk_wmem_queued < SO_SNDBUF. A full skb goes out at once if
        it is the first unsent one (tcp_push_one), and everything queued does
        every half window (forced_push) and at the end."""
        s = self.sock
        n = len(data)
        if not n:
            return 0
        goal = self.mss_now()[1]
        over = s._world.params["skb_overhead"]
        peer = s._peer
        wq = self.wq
        # A view's slices are not copies: each chunk is copied once, into the
        # send queue (a slice of bytes or a bytearray would be copied twice).
        # Released before returning: a view left on the caller's bytearray
        # (a transport's buffer) would forbid resizing it.
        view = memoryview(data).cast("B")
        taken = 0
        try:
            while taken < n:
                if wq and wq[-1] < goal:
                    copy = min(goal - wq[-1], n - taken)
                    wq[-1] += copy
                elif self.wmem >= s.sndbuf:
                    break
                else:
                    copy = min(goal, n - taken)
                    wq.append(copy)
                    self.wmem += over
                self.wmem += copy
                s._unsent += view[taken:taken + copy]
                taken += copy
                if taken < n and wq[-1] >= goal:
                    write_seq = s._sent_total + len(s._unsent)
                    if write_seq > self.pushed_seq + (self.max_window >> 1):
                        self.pushed_seq = write_seq
                        self.pump(peer)
                    elif len(wq) == 1:
                        self.pump(peer, push_one=True)
        finally:
            view.release()
        if not taken:
            s._would_block("send")
        self.pushed_seq = s._sent_total + len(s._unsent)
        self.pump(peer)
        s._changed()
        return taken

    def pump(self, peer, push_one=False):
        """tcp_write_xmit: the first unsent skb takes bytes from those behind
        it up to a GSO packet (tcp_grow_skb), goes out if its first segment fits
        the window (tcp_snd_wnd_test) unless it is better to wait for the ACK
        under way (tcp_tso_should_defer), and is split at the window's edge."""
        s = self.sock
        world = s._world
        link = s._link
        wq = self.wq
        over = world.params["skb_overhead"]
        mss_now = self.mss_now()[0]
        max_len = max(MIN_TSO_SEGS, GSO_MAX_SIZE // mss_now) * mss_now
        while wq:
            head = wq[0]
            while head < max_len and len(wq) > 1:
                take = min(max_len - head, wq[1])
                head += take
                if take == wq[1]:
                    del wq[1]
                    self.wmem -= over        # the emptied skb is freed
                else:
                    wq[1] -= take
            wq[0] = head
            room = self.wnd_end - s._sent_total
            if room < (head if head < mss_now else mss_now):
                if room > 0 and not self.rtx and self.persist is None and not link.dead:
                    # too small a window and nothing in flight to bring a bigger one
                    self.persist = world.call_at(world.now + PROBE_S, self.persist_fires)
                return
            if not push_one and head > mss_now and self.defer(head, room, max_len, len(wq) == 1):
                return
            n = head if head < max_len else max_len
            if n > room:
                n = room
            if n < head:
                wq[0] = head - n
                self.wmem += over            # the rest becomes an skb of its own
            else:
                wq.popleft()
            self.transmit(peer, n, mss_now)
            if push_one:
                return
        if s._fin_queued and not s._fin_sent:
            s._fin_sent = True
            world.call_at(link.arrival(world, 0), peer._on_fin)

    def defer(self, head, room, max_len, is_tail) -> bool:
        """tcp_tso_should_defer, without congestion control: hold a packet the
        window cannot take whole when an ACK (and with it more window) is due
        within min(1 ms, srtt/2) and something was sent within the last 1 ms."""
        s = self.sock
        now = s._world.now
        if now - self.last_tx > 1e-3 or room >= max_len or (not is_tail and room >= head):
            return False
        if room >= self.snd_wnd // 3 or not self.rtx or (s._fin_queued and is_tail):
            return False
        srtt = self.srtt
        return self.rtx[0][1] + srtt - now <= min(srtt / 2, 1e-3)

    def transmit(self, peer, n, mss_now):
        s = self.sock
        world = s._world
        unsent = s._unsent
        if n == len(unsent):
            data = bytes(unsent)
            unsent.clear()
        else:
            data = memoryview(unsent)[:n].tobytes()
            del unsent[:n]
        s._sent_total += n
        s._unacked += n
        now = world.now
        self.last_tx = now
        link = s._link
        at = link.arrival(world, n)
        # a segment the loss fault delayed: its RTT sample is from the try
        # that got through (TCP timestamps echo that try's time)
        self.rtx.append((n, now if link.faults is None else now + link.resent))
        if self.ack_pending:
            self.send_ack()               # the segment carries it
        world.call_at(at, peer._model.deliver, data, mss_now if n > mss_now else n)

    def persist_fires(self):
        """The persist timer: a window too small for the next segment and
        nothing in flight. Send what fits (tcp_write_wakeup); its ACK brings
        the window back."""
        s = self.sock
        self.persist = None
        peer = s._peer
        if (self.rtx or not self.wq or peer is None or s._reset
                or s._state != CONNECTED or s._link.dead):
            return
        room = self.wnd_end - s._sent_total
        if room <= 0:
            return
        mss_now = self.mss_now()[0]
        n = min(room, mss_now, self.wq[0])
        if n < self.wq[0]:
            self.wq[0] -= n
            self.wmem += s._world.params["skb_overhead"]
        else:
            self.wq.popleft()
        s._world.record("probe", s._conn, s._side, n)
        self.transmit(peer, n, mss_now)

    def deliver(self, data, gso):
        """A segment arrives: queue it as one skb, measure it (tcp_measure_rcv_mss,
        tcp_grow_window), and ACK now or later (__tcp_ack_snd_check)."""
        s = self.sock
        if not s._accepts(data):
            return
        world = s._world
        n = len(data)
        truesize = n + world.params["skb_overhead"]
        s._rcv += data
        self.rcv_nxt += n
        self.rq.append([n, truesize])
        self.rmem += truesize
        if gso >= self.rcv_mss:
            if gso != self.rcv_mss:
                ratio = (n << RATIO_SHIFT) // truesize or 1
                if ratio != self.ratio:
                    self.ratio = ratio
                    self.clamp = (s.rcvbuf * ratio) >> RATIO_SHIFT
                    if self.clamp < self.ssthresh:
                        self.ssthresh = self.clamp
            self.rcv_mss = min(gso, world.params["mss"])
        else:
            self.ack_pushed = True           # a short segment: ACK once it is all read
        if not self.ack_started:
            # the first data: quick ACKs for about a window's worth (tcp_incr_quickack)
            self.ack_started = True
            self.quick = max(self.quick, min(MAX_QUICKACKS,
                                               self.rcv_wnd // (2 * self.rcv_mss) or 2))
        if n >= 128:
            space = ((s.rcvbuf - self.rmem) * self.ratio) >> RATIO_SHIFT
            room = min(self.clamp, space) - self.ssthresh
            if room > 0:
                self.ssthresh += min(room, max(2 * self.rcv_mss, 2 * n))
                self.quick |= 1
        world.record("deliver", s._conn, s._side, n)
        self.ack_pending = True
        if self.quick or (self.rcv_nxt - self.rcv_wup > self.rcv_mss
                           and self.free_window() >= self.rcv_wnd):
            self.send_ack()
        elif self.delack_ev is None:
            self.delack_ev = world.call_at(world.now + DELACK_S, self.delack_fires)
        s._changed()

    def send_ack(self):
        """An ACK of everything received, with the window we can offer now."""
        s = self.sock
        if self.ack_pending and self.quick:
            self.quick -= 1
        self.ack_pending = self.ack_pushed = False
        if self.delack_ev is not None:
            self.delack_ev.cancel()
            self.delack_ev = None
        wnd = self.select_window()
        peer = s._peer
        if peer is not None and not s._reset and not s._link.dead:
            world = s._world
            world.call_at(s._link.ack_at(world), peer._model.on_ack, self.rcv_nxt,
                          self.rcv_nxt + wnd, wnd)

    def delack_fires(self):
        s = self.sock
        self.delack_ev = None
        if self.ack_pending and s._state == CONNECTED:
            self.send_ack()

    def free_window(self) -> int:
        """__tcp_select_window: the window our free receive memory allows."""
        s = self.sock
        ratio = self.ratio
        free = ((s.rcvbuf - self.rmem) * ratio) >> RATIO_SHIFT
        allowed = (s.rcvbuf * ratio) >> RATIO_SHIFT
        full = min(self.clamp, allowed)
        mss = min(self.rcv_mss, full)
        if mss <= 0:
            return 0
        grain = 1 << self.wscale
        if free < full >> 1:
            if free < 0:
                return 0
            free -= free % grain
            if free < allowed >> 4 or free < mss:
                return 0
        if free > self.ssthresh:
            free = self.ssthresh
        return -(-free // grain) * grain

    def select_window(self) -> int:
        """tcp_select_window: never take back a window once offered."""
        cur = self.rcv_wup + self.rcv_wnd - self.rcv_nxt
        new = self.free_window()
        if new < cur:
            grain = 1 << self.wscale
            new = -(-cur // grain) * grain
        self.rcv_wnd = new
        self.rcv_wup = self.rcv_nxt
        return new

    def consumed(self, n):
        """A read frees the skbs it emptied; a partly read skb keeps all its
        memory. Then an ACK if more than a segment waits for one, or if the
        window can now at least double (tcp_cleanup_rbuf)."""
        s = self.sock
        rq = self.rq
        while n and rq:
            head = rq[0]
            if n >= head[0]:
                n -= head[0]
                self.rmem -= head[1]
                rq.popleft()
            else:
                head[0] -= n
                n = 0
        if s._peer is not None and not s._reset and not s._link.dead:
            if self.ack_pending and (self.rcv_nxt - self.rcv_wup > self.rcv_mss
                                      or (self.ack_pushed and not self.rmem)):
                self.send_ack()
            else:
                now_wnd = self.rcv_wup + self.rcv_wnd - self.rcv_nxt
                if now_wnd < 0:
                    now_wnd = 0
                if 2 * now_wnd <= self.clamp:
                    new = self.free_window()
                    if new and new >= 2 * now_wnd:
                        self.send_ack()
        s._changed()

    def on_ack(self, ack, wnd_end, wnd):
        """An ACK (or a window update) arrives: free the skbs it covers (a
        partly covered one loses the covered bytes), take the window."""
        s = self.sock
        if s._reset or s._vanished:
            return
        acked = ack - (s._sent_total - s._unacked)
        if acked > 0:
            s._unacked -= acked
            over = s._world.params["skb_overhead"]
            rtx = self.rtx
            first = None
            while acked and rtx:
                sent, t = rtx[0]
                if first is None:
                    first = t
                if sent <= acked:
                    rtx.popleft()
                    acked -= sent
                    self.wmem -= sent + over
                else:
                    rtx[0] = (sent - acked, t)
                    self.wmem -= acked
                    acked = 0
            self.srtt += (s._world.now - first - self.srtt) / 8
        self.snd_wnd = wnd
        if wnd > self.max_window:
            self.max_window = wnd
        if wnd_end > self.wnd_end:
            self.wnd_end = wnd_end
        s._pump()
        s._changed()

    def drop(self):
        self.wq.clear()
        self.rtx.clear()
        self.wmem = 0
        if self.persist is not None:
            self.persist.cancel()
            self.persist = None
        if self.delack_ev is not None:
            self.delack_ev.cancel()
            self.delack_ev = None
        self.ack_pending = False
