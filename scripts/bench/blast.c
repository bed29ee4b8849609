/* blast: the load generator and sink of scripts/bench-relay.sh, cheap enough per packet that
 * the relay under test, not the generator, is what runs out (iperf2 tops out near 130 streams
 * on the 2-core bed; this sends several hundred thousand packets a second from one core).
 *
 *   blast send -d DEST -p BASE -n N -r BIT_PER_S -l PAYLOAD -t SECONDS [-b BIND_ADDR]
 *   blast sink -a ADDR -p BASE -n N -t MAX_SECONDS
 *
 * send: N streams (DEST:BASE+i) of RTP-shaped datagrams (RTP header: seq per stream, SSRC
 * i+1; then the send time, CLOCK_MONOTONIC ns), paced together on one schedule: by time t it
 * has sent floor(t * N * rate / (8 * payload)) packets, round robin over the streams, with
 * sendmmsg of up to 64 from one socket. It never sends ahead of the schedule; when it cannot
 * keep up, "behind" says by how much (a point where it is behind must not be headlined).
 * Prints one JSON line: sent, due, behind (fraction of due not sent when the time was up),
 * eagain (datagrams its own socket refused), seconds.
 *
 * sink: one socket per port (ADDR:BASE+i), epoll, recvmmsg; counts what arrives and the
 * one-way latency from the embedded send time (same host, same clock). Stops on SIGINT or
 * after MAX_SECONDS; prints one JSON line: received, p50_us, p99_us, max_us, first_ns (when
 * the first datagram arrived, CLOCK_MONOTONIC; 0 if none did).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define BUF 2048
#define MAXN 10000
#define HIST_US 200000

static volatile sig_atomic_t stop;
static void on_signal(int s) { (void)s; stop = 1; }

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void addr_or_die(const char *s, struct sockaddr_in *sa, int port) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    if (inet_pton(AF_INET, s, &sa->sin_addr) != 1) {
        fprintf(stderr, "blast: bad address %s\n", s);
        exit(2);
    }
}

static int udp_socket(const char *addr, int port) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        perror("socket");
        exit(1);
    }
    int buf = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    if (addr) {
        struct sockaddr_in sa;
        addr_or_die(addr, &sa, port);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
            fprintf(stderr, "blast: bind %s:%d: %s\n", addr, port, strerror(errno));
            exit(1);
        }
    }
    return fd;
}

static int send_main(const char *dest, const char *bind_addr, int base, int n, double rate,
                     int payload, double secs) {
    struct sockaddr_in *to = calloc(n, sizeof *to);
    uint16_t *seq = calloc(n, sizeof *seq);
    if (!to || !seq)
        return 1;
    for (int i = 0; i < n; i++)
        addr_or_die(dest, &to[i], base + i);
    int fd = udp_socket(bind_addr, 0);
    static unsigned char bufs[BATCH][BUF];
    struct iovec iov[BATCH];
    struct mmsghdr m[BATCH];
    double pps = n * rate / (8.0 * payload);
    uint64_t sent = 0, due = 0, eagain = 0, next = 0;
    uint64_t t0 = mono_ns(), end = t0 + (uint64_t)(secs * 1e9);
    for (;;) {
        uint64_t now = mono_ns();
        if (now >= end || stop) {
            due = (uint64_t)((double)(end - t0) / 1e9 * pps);
            break;
        }
        due = (uint64_t)((double)(now - t0) / 1e9 * pps);
        if (sent >= due) {
            struct timespec nap = {0, 50000};
            nanosleep(&nap, NULL);
            continue;
        }
        int k = due - sent > BATCH ? BATCH : (int)(due - sent);
        uint64_t stamp = mono_ns();
        for (int j = 0; j < k; j++) {
            int i = next;
            next = next + 1 == (uint64_t)n ? 0 : next + 1;
            unsigned char *b = bufs[j];
            b[0] = 0x80;
            b[1] = 33;
            b[2] = seq[i] >> 8;
            b[3] = seq[i] & 0xff;
            seq[i]++;
            uint32_t ts = htonl((uint32_t)(stamp / 11111)), ssrc = htonl(i + 1);
            memcpy(b + 4, &ts, 4);
            memcpy(b + 8, &ssrc, 4);
            memcpy(b + 12, &stamp, 8);
            iov[j].iov_base = b;
            iov[j].iov_len = payload;
            memset(&m[j].msg_hdr, 0, sizeof m[j].msg_hdr);
            m[j].msg_hdr.msg_name = &to[i];
            m[j].msg_hdr.msg_namelen = sizeof to[i];
            m[j].msg_hdr.msg_iov = &iov[j];
            m[j].msg_hdr.msg_iovlen = 1;
        }
        int done = 0;
        while (done < k) {
            int s = sendmmsg(fd, m + done, k - done, 0);
            if (s < 0) {
                if (errno == EINTR)
                    continue;
                eagain += k - done; /* our own socket refused: the generator's loss */
                break;
            }
            done += s;
        }
        sent += k;
    }
    double behind = due ? (double)(due > sent ? due - sent : 0) / (double)due : 0.0;
    printf("{\"sent\": %llu, \"due\": %llu, \"behind\": %.6f, \"eagain\": %llu, \"seconds\": %.3f}\n",
           (unsigned long long)(sent - eagain), (unsigned long long)due, behind,
           (unsigned long long)eagain, (double)(mono_ns() - t0) / 1e9);
    return 0;
}

static int sink_main(const char *addr, int base, int n, double secs) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int *fds = calloc(n, sizeof *fds);
    uint32_t *hist = calloc(HIST_US + 1, sizeof *hist);
    if (ep < 0 || !fds || !hist)
        return 1;
    for (int i = 0; i < n; i++) {
        fds[i] = udp_socket(addr, base + i);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
    }
    static unsigned char bufs[BATCH][BUF];
    struct iovec iov[BATCH];
    struct mmsghdr m[BATCH];
    uint64_t got = 0, first = 0, end = mono_ns() + (uint64_t)(secs * 1e9);
    struct epoll_event evs[64];
    fprintf(stderr, "blast sink: %d port(s) ready\n", n);
    while (!stop && mono_ns() < end) {
        int ne = epoll_wait(ep, evs, 64, 100);
        for (int e = 0; e < ne; e++) {
            int fd = fds[evs[e].data.u32];
            for (;;) {
                for (int k = 0; k < BATCH; k++) {
                    iov[k].iov_base = bufs[k];
                    iov[k].iov_len = BUF;
                    memset(&m[k].msg_hdr, 0, sizeof m[k].msg_hdr);
                    m[k].msg_hdr.msg_iov = &iov[k];
                    m[k].msg_hdr.msg_iovlen = 1;
                }
                int r = recvmmsg(fd, m, BATCH, MSG_DONTWAIT, NULL);
                if (r <= 0)
                    break;
                uint64_t now = mono_ns();
                if (!first)
                    first = now;
                for (int k = 0; k < r; k++) {
                    got++;
                    if (m[k].msg_len < 20)
                        continue;
                    uint64_t stamp;
                    memcpy(&stamp, bufs[k] + 12, 8);
                    uint64_t us = now > stamp ? (now - stamp) / 1000 : 0;
                    hist[us > HIST_US ? HIST_US : us]++;
                }
                if (r < BATCH)
                    break;
            }
        }
    }
    uint64_t acc = 0, p50 = 0, p99 = 0, max = 0;
    int have50 = 0, have99 = 0;
    for (uint64_t us = 0; us <= HIST_US; us++) {
        if (!hist[us])
            continue;
        acc += hist[us];
        max = us;
        if (!have50 && acc * 2 >= got) { p50 = us; have50 = 1; }
        if (!have99 && acc * 100 >= got * 99) { p99 = us; have99 = 1; }
    }
    printf("{\"received\": %llu, \"p50_us\": %llu, \"p99_us\": %llu, \"max_us\": %llu, "
           "\"first_ns\": %llu}\n",
           (unsigned long long)got, (unsigned long long)p50, (unsigned long long)p99,
           (unsigned long long)max, (unsigned long long)first);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: blast send|sink ...\n");
        return 2;
    }
    const char *mode = argv[1], *dest = NULL, *addr = NULL, *bind_addr = NULL;
    int base = 0, n = 0, payload = 1316, c;
    double rate = 10e6, secs = 3;
    optind = 2;
    while ((c = getopt(argc, argv, "d:a:b:p:n:r:l:t:")) != -1) {
        switch (c) {
        case 'd': dest = optarg; break;
        case 'a': addr = optarg; break;
        case 'b': bind_addr = optarg; break;
        case 'p': base = atoi(optarg); break;
        case 'n': n = atoi(optarg); break;
        case 'r': rate = atof(optarg); break;
        case 'l': payload = atoi(optarg); break;
        case 't': secs = atof(optarg); break;
        default: return 2;
        }
    }
    if (n < 1 || n > MAXN || base < 1 || base + n > 65536 || payload < 20 || payload > BUF ||
        secs <= 0 || secs > 600 || rate <= 0) {
        fprintf(stderr, "blast: bad arguments (n 1..%d, payload 20..%d, seconds 0..600)\n",
                MAXN, BUF);
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (!strcmp(mode, "send") && dest)
        return send_main(dest, bind_addr, base, n, rate, payload, secs);
    if (!strcmp(mode, "sink") && addr)
        return sink_main(addr, base, n, secs);
    fprintf(stderr, "blast: send needs -d, sink needs -a\n");
    return 2;
}
