/* The echo load client of `looplab bench`: one thread, epoll, non-blocking sockets.
 *
 * Each connection sends one message, waits for every byte to come back (checking each),
 * then sends the next. It prints "W" when the counted window opens, then one JSON line.
 * Latencies go into a 1-microsecond histogram up to 1 s (4 MB), so percentiles are exact
 * to the microsecond. looplab compiles it at run time with the machine's C compiler into
 * a cache folder (~/.cache/looplab), keyed by a hash of this file.
 *
 * usage: echo_client HOST PORT CONNS MESSAGE_BYTES WARMUP_S DURATION_S
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HIST_US 1000000
static uint32_t hist[HIST_US + 1];
struct conn { int fd; size_t sent, recvd; uint64_t t0; int out_armed, dead; };
static int ep; static unsigned char *msg; static size_t size;
static uint64_t win_start, win_end, count, lat_sum_ns, lat_max_ns, mismatches, dead_count;
static char errbuf[160];

static uint64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static void kill_conn(struct conn *c, const char *why) {
    if (c->dead) return;
    c->dead = 1; dead_count++;
    if (!errbuf[0]) snprintf(errbuf, sizeof errbuf, "%s", why);
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
}
static void arm_out(struct conn *c, int on) {
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    if (c->out_armed != on) { epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev); c->out_armed = on; }
}
static void do_send(struct conn *c) {
    while (c->sent < size) {
        ssize_t n = send(c->fd, msg + c->sent, size - c->sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) { arm_out(c, 1); return; }
            if (errno == EINTR) continue;
            kill_conn(c, strerror(errno)); return;
        }
        c->sent += (size_t)n;
    }
    arm_out(c, 0);
}
static void do_recv(struct conn *c, unsigned char *buf) {
    for (;;) {
        ssize_t n = recv(c->fd, buf, 262144, 0);
        if (n == 0) { kill_conn(c, "server closed the connection"); return; }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            kill_conn(c, strerror(errno)); return;
        }
        if (c->recvd + (size_t)n > c->sent) { mismatches++; kill_conn(c, "more bytes came back than were sent"); return; }
        if (memcmp(buf, msg + c->recvd, (size_t)n) != 0) mismatches++;
        c->recvd += (size_t)n;
        if (c->recvd == size) {
            uint64_t t = now_ns();
            if (t >= win_start && t < win_end) {
                uint64_t lat = t - c->t0, us = lat / 1000;
                hist[us > HIST_US ? HIST_US : us]++;
                count++; lat_sum_ns += lat;
                if (lat > lat_max_ns) lat_max_ns = lat;
            }
            c->sent = c->recvd = 0; c->t0 = t;
            do_send(c);
            if (c->dead) return;
        }
    }
}
static double pct(double q) {
    if (!count) return -1;
    uint64_t want = (uint64_t)(q * (double)count), acc = 0;
    if (want >= count) want = count - 1;
    for (int i = 0; i <= HIST_US; i++) { acc += hist[i]; if (acc > want) return (i + 0.5) / 1e6; }
    return HIST_US / 1e6;
}
int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: %s HOST PORT CONNS MESSAGE_BYTES WARMUP_S DURATION_S\n", argv[0]); return 2; }
    const char *host = argv[1]; int port = atoi(argv[2]); int nconn = atoi(argv[3]);
    size = (size_t)atol(argv[4]); double warmup = atof(argv[5]), duration = atof(argv[6]);
    if (nconn < 1 || size < 1 || port < 1 || duration <= 0 || warmup < 0) { fprintf(stderr, "bad arguments\n"); return 2; }
    msg = malloc(size); unsigned char *buf = malloc(262144);
    for (size_t i = 0; i < size; i++) msg[i] = (unsigned char)((i * 131 + 7) & 0xff);
    struct conn *conns = calloc((size_t)nconn, sizeof *conns);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) { fprintf(stderr, "bad host %s\n", host); return 2; }
    ep = epoll_create1(0);
    for (int i = 0; i < nconn; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
            printf("W\n{\"error\": \"connect %d: %s\"}\n", i, strerror(errno)); return 1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        conns[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &conns[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    uint64_t start = now_ns();
    win_start = start + (uint64_t)(warmup * 1e9);
    win_end = win_start + (uint64_t)(duration * 1e9);
    for (int i = 0; i < nconn; i++) { conns[i].t0 = now_ns(); do_send(&conns[i]); }
    struct epoll_event evs[256];
    int announced = 0;
    for (;;) {
        uint64_t t = now_ns();
        if (!announced && t >= win_start) { printf("W\n"); fflush(stdout); announced = 1; }
        if (t >= win_end || dead_count == (uint64_t)nconn) break;
        uint64_t until = announced ? win_end : win_start;
        int timeout = (int)((until - t) / 1000000) + 1;
        if (timeout > 100) timeout = 100;
        int n = epoll_wait(ep, evs, 256, timeout);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c->dead) continue;
            if (evs[i].events & EPOLLIN) do_recv(c, buf);
            if (!c->dead && (evs[i].events & EPOLLOUT)) do_send(c);
            if (!c->dead && (evs[i].events & (EPOLLERR | EPOLLHUP)) && !(evs[i].events & EPOLLIN))
                kill_conn(c, "connection error");
        }
    }
    uint64_t end = now_ns();
    if (end > win_end) end = win_end;
    double window = end > win_start ? (double)(end - win_start) / 1e9 : 0.0;
    if (!announced) printf("W\n");
    printf("{\"client\": \"c-epoll\", \"requests\": %llu, \"window_s\": %.6f, \"latency_p50_s\": %.9g, "
           "\"latency_p99_s\": %.9g, \"latency_max_s\": %.9g, \"latency_mean_s\": %.9g, "
           "\"mismatches\": %llu, \"dead_connections\": %llu, \"error\": ",
           (unsigned long long)count, window, pct(0.50), pct(0.99), lat_max_ns / 1e9,
           count ? (double)lat_sum_ns / (double)count / 1e9 : -1.0,
           (unsigned long long)mismatches, (unsigned long long)dead_count);
    if (errbuf[0]) printf("\"%s\"}\n", errbuf); else printf("null}\n");
    fflush(stdout);
    for (int i = 0; i < nconn; i++) close(conns[i].fd);
    return 0;
}
