/* blast: the load generator and sink of scripts/bench-relay.sh, cheap enough per packet that
 * the relay under test, not the generator, is what runs out (iperf2 tops out near 130 streams
 * on the 2-core bed; this sends several hundred thousand packets a second from one core).
 *
 *   blast send -d DEST -p BASE -n N -r BIT_PER_S -l PAYLOAD -t SECONDS [-b BIND_ADDR]
 *              [-P] [-f RECORDING -m STAMPS]
 *   blast sink -a ADDR -p BASE -n N -t MAX_SECONDS [-m STAMPS]
 *
 * send: N streams (DEST:BASE+i) of RTP-shaped datagrams (RTP header: seq per stream, SSRC
 * i+1; then the send time, CLOCK_MONOTONIC ns), paced together on one schedule: by time t it
 * has sent floor(t * N * rate / (8 * payload)) packets, round robin over the streams, with
 * sendmmsg of up to 64 from one socket. It never sends ahead of the schedule; when it cannot
 * keep up, "behind" says by how much (a point where it is behind must not be headlined).
 * Prints one JSON line: sent, due, behind (fraction of due not sent when the time was up),
 * eagain (datagrams its own socket refused), seconds.
 *
 * -P (paced): every datagram leaves at its own time, t0 + k / rate, not in the batches a
 * 50 µs nap collects: the sender sleeps (timer slack 1 ns, absolute clock_nanosleep) until
 * the next datagram is due and sends what is due then (one datagram per sendmmsg while it
 * keeps up), so the streams' datagrams reach the relay spread evenly and a socket rarely
 * holds more than one when the relay wakes. "calls" in the JSON line says how many
 * sendmmsg calls carried the datagrams (sent / calls: datagrams per call).
 *
 * -f RECORDING (replay): the datagrams are a real RTP stream instead of RTP-shaped filler:
 * the packets of RECORDING (RFC 4571 framing: a 2-byte big-endian length, then the packet;
 * what tests/golden/media/ holds; RTCP packets in it are skipped) in order, looped, with the
 * sequence number, timestamp and SSRC rewritten per stream: stream i has SSRC
 * 0x56470000 + i, sequence numbers that run on across loops, and timestamps that move on by
 * the recording's length plus one frame at each loop (so every frame keeps one timestamp and
 * the next frame another, as the recording had them). The rate is still -r / (8 * -l)
 * packets per second per stream (the packets keep their recorded sizes). The payload cannot
 * carry the send time, so it goes to STAMPS (-m, a file both sides map: n x 4096 slots of
 * 8 bytes, stream i's datagram with sequence number s in slot i * 4096 + s % 4096, written
 * before the datagram is sent); the sink reads it from there ("bytes" in the JSON line: the
 * payload bytes sent).
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
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define BUF 2048
#define MAXN 10000
#define HIST_US 200000
#define SLOTS 4096 /* send-time slots per stream in the STAMPS file (-m) */
#define MAXPKT 100000
#define SSRC_BASE 0x56470000u

/* The STAMPS file of n streams, mapped shared by both sides (whichever starts first makes it;
 * the caller gives a fresh path per run, so every slot starts at 0). */
static uint64_t *map_stamps(const char *path, int n) {
    size_t len = (size_t)n * SLOTS * sizeof(uint64_t);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
        fprintf(stderr, "blast: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        fprintf(stderr, "blast: mmap %s: %s\n", path, strerror(errno));
        exit(1);
    }
    return m;
}

/* A recording (-f): its RTP packets, back to back, and where each starts. */
struct recording {
    unsigned char *data;
    size_t off[MAXPKT + 1];
    int count;
    uint32_t first_ts, loop_ts; /* loop_ts: how far timestamps move on per loop */
};

static struct recording *load_recording(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "blast: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    struct recording *r = calloc(1, sizeof *r);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    r->data = malloc(size > 0 ? (size_t)size : 1);
    if (!r->data || fread(r->data, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "blast: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    size_t in = 0, out = 0;
    uint32_t last_ts = 0, frame = 0;
    while (in + 2 <= (size_t)size && r->count < MAXPKT) {
        size_t len = (size_t)r->data[in] << 8 | r->data[in + 1];
        in += 2;
        if (in + len > (size_t)size)
            break;
        unsigned char *p = r->data + in;
        in += len;
        /* RTP only: version 2, at least a header, not an RTCP packet type (RFC 5761). */
        if (len < 12 || len > BUF || (p[0] >> 6) != 2 || (p[1] >= 192 && p[1] <= 223))
            continue;
        memmove(r->data + out, p, len);
        p = r->data + out; /* the source may overlap what was moved */
        uint32_t ts = (uint32_t)p[4] << 24 | (uint32_t)p[5] << 16 | (uint32_t)p[6] << 8 | p[7];
        if (r->count == 0)
            r->first_ts = ts;
        else if (ts != last_ts)
            frame = ts - last_ts;
        last_ts = ts;
        r->off[r->count++] = out;
        out += len;
    }
    r->off[r->count] = out;
    if (r->count == 0) {
        fprintf(stderr, "blast: %s holds no RTP packet\n", path);
        exit(1);
    }
    r->loop_ts = last_ts - r->first_ts + (frame ? frame : 3600);
    return r;
}

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
                     int payload, double secs, int paced, const char *rec_path,
                     const char *stamps_path) {
    struct sockaddr_in *to = calloc(n, sizeof *to);
    uint16_t *seq = calloc(n, sizeof *seq);
    int *pos = calloc(n, sizeof *pos);
    uint32_t *loops = calloc(n, sizeof *loops);
    if (!to || !seq || !pos || !loops)
        return 1;
    struct recording *rec = rec_path ? load_recording(rec_path) : NULL;
    uint64_t *stamps = stamps_path ? map_stamps(stamps_path, n) : NULL;
    if (rec && !stamps) {
        fprintf(stderr, "blast: -f needs -m (the payload cannot carry the send time)\n");
        return 2;
    }
    for (int i = 0; i < n; i++)
        seq[i] = (uint16_t)(i * 1000);
    if (paced)
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    for (int i = 0; i < n; i++)
        addr_or_die(dest, &to[i], base + i);
    int fd = udp_socket(bind_addr, 0);
    static unsigned char bufs[BATCH][BUF];
    struct iovec iov[BATCH];
    struct mmsghdr m[BATCH];
    double pps = n * rate / (8.0 * payload);
    uint64_t sent = 0, due = 0, eagain = 0, next = 0, calls = 0, bytes = 0;
    uint64_t t0 = mono_ns(), end = t0 + (uint64_t)(secs * 1e9);
    for (;;) {
        uint64_t now = mono_ns();
        if (now >= end || stop) {
            due = (uint64_t)((double)(end - t0) / 1e9 * pps);
            break;
        }
        due = (uint64_t)((double)(now - t0) / 1e9 * pps);
        if (sent >= due) {
            if (paced) {
                /* Until the next datagram is due (the first ns of its slot). */
                uint64_t at = t0 + (uint64_t)((double)(sent + 1) * 1e9 / pps) + 1;
                struct timespec ts = {(time_t)(at / 1000000000ull), (long)(at % 1000000000ull)};
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            } else {
                struct timespec nap = {0, 50000};
                nanosleep(&nap, NULL);
            }
            continue;
        }
        int k = due - sent > BATCH ? BATCH : (int)(due - sent);
        uint64_t stamp = mono_ns();
        for (int j = 0; j < k; j++) {
            int i = next;
            next = next + 1 == (uint64_t)n ? 0 : next + 1;
            unsigned char *b = bufs[j];
            size_t len = payload;
            if (rec) {
                /* The recording's next packet for stream i, renumbered for it. */
                const unsigned char *p = rec->data + rec->off[pos[i]];
                len = rec->off[pos[i] + 1] - rec->off[pos[i]];
                memcpy(b, p, len);
                uint32_t ots = (uint32_t)p[4] << 24 | (uint32_t)p[5] << 16 | (uint32_t)p[6] << 8 | p[7];
                uint32_t ts = htonl(ots - rec->first_ts + loops[i] * rec->loop_ts + (uint32_t)i * 7919u);
                uint32_t ssrc = htonl(SSRC_BASE + (uint32_t)i);
                b[2] = seq[i] >> 8;
                b[3] = seq[i] & 0xff;
                memcpy(b + 4, &ts, 4);
                memcpy(b + 8, &ssrc, 4);
                stamps[(size_t)i * SLOTS + seq[i] % SLOTS] = stamp;
                seq[i]++;
                if (++pos[i] == rec->count) {
                    pos[i] = 0;
                    loops[i]++;
                }
            } else {
                b[0] = 0x80;
                b[1] = 33;
                b[2] = seq[i] >> 8;
                b[3] = seq[i] & 0xff;
                seq[i]++;
                uint32_t ts = htonl((uint32_t)(stamp / 11111)), ssrc = htonl(i + 1);
                memcpy(b + 4, &ts, 4);
                memcpy(b + 8, &ssrc, 4);
                memcpy(b + 12, &stamp, 8);
            }
            bytes += len;
            iov[j].iov_base = b;
            iov[j].iov_len = len;
            memset(&m[j].msg_hdr, 0, sizeof m[j].msg_hdr);
            m[j].msg_hdr.msg_name = &to[i];
            m[j].msg_hdr.msg_namelen = sizeof to[i];
            m[j].msg_hdr.msg_iov = &iov[j];
            m[j].msg_hdr.msg_iovlen = 1;
        }
        int done = 0;
        while (done < k) {
            int s = sendmmsg(fd, m + done, k - done, 0);
            calls++;
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
    printf("{\"sent\": %llu, \"due\": %llu, \"behind\": %.6f, \"eagain\": %llu, \"seconds\": %.3f, "
           "\"calls\": %llu, \"bytes\": %llu, \"paced\": %s, \"replay\": %s}\n",
           (unsigned long long)(sent - eagain), (unsigned long long)due, behind,
           (unsigned long long)eagain, (double)(mono_ns() - t0) / 1e9, (unsigned long long)calls,
           (unsigned long long)bytes, paced ? "true" : "false", rec ? "true" : "false");
    return 0;
}

static int sink_main(const char *addr, int base, int n, double secs, const char *stamps_path) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int *fds = calloc(n, sizeof *fds);
    uint32_t *hist = calloc(HIST_US + 1, sizeof *hist);
    if (ep < 0 || !fds || !hist)
        return 1;
    /* Replay (-m): the send times are in the STAMPS file, by stream and sequence number. */
    uint64_t *stamps = stamps_path ? map_stamps(stamps_path, n) : NULL;
    uint64_t unstamped = 0;
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
            int idx = evs[e].data.u32, fd = fds[idx];
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
                    uint64_t stamp;
                    if (stamps) {
                        if (m[k].msg_len < 12)
                            continue;
                        uint16_t s = (uint16_t)(bufs[k][2] << 8 | bufs[k][3]);
                        stamp = stamps[(size_t)idx * SLOTS + s % SLOTS];
                        if (!stamp) {
                            unstamped++;
                            continue;
                        }
                    } else {
                        if (m[k].msg_len < 20)
                            continue;
                        memcpy(&stamp, bufs[k] + 12, 8);
                    }
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
           "\"first_ns\": %llu, \"unstamped\": %llu}\n",
           (unsigned long long)got, (unsigned long long)p50, (unsigned long long)p99,
           (unsigned long long)max, (unsigned long long)first, (unsigned long long)unstamped);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: blast send|sink ...\n");
        return 2;
    }
    const char *mode = argv[1], *dest = NULL, *addr = NULL, *bind_addr = NULL, *rec = NULL,
               *stamps = NULL;
    int base = 0, n = 0, payload = 1316, c, paced = 0;
    double rate = 10e6, secs = 3;
    optind = 2;
    while ((c = getopt(argc, argv, "d:a:b:p:n:r:l:t:Pf:m:")) != -1) {
        switch (c) {
        case 'd': dest = optarg; break;
        case 'a': addr = optarg; break;
        case 'b': bind_addr = optarg; break;
        case 'p': base = atoi(optarg); break;
        case 'n': n = atoi(optarg); break;
        case 'r': rate = atof(optarg); break;
        case 'l': payload = atoi(optarg); break;
        case 't': secs = atof(optarg); break;
        case 'P': paced = 1; break;
        case 'f': rec = optarg; break;
        case 'm': stamps = optarg; break;
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
        return send_main(dest, bind_addr, base, n, rate, payload, secs, paced, rec, stamps);
    if (!strcmp(mode, "sink") && addr)
        return sink_main(addr, base, n, secs, stamps);
    fprintf(stderr, "blast: send needs -d, sink needs -a\n");
    return 2;
}
