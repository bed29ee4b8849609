/* crelay: the plain C relay the benchmarks hold vgate against (issue 12).
 *
 * What a competent 200-line relay does and nothing more: one UDP socket per gateway port
 * (like vgate's stack mode), one epoll set, recvmmsg of up to BATCH datagrams per call, at
 * most BUDGET calls per readable socket per wakeup, and one sendmmsg per batch from the
 * port's egress socket to its fixed destination. No source check, no RTP accounting, no
 * per-route counters beyond two totals: the floor a user-space socket relay costs.
 *
 *   crelay -a IN_ADDR -p IN_BASE -n N -b OUT_ADDR -e OUT_BASE -d DEST_ADDR -s DEST_BASE
 *          [-o] [-w] [-i IN_IF -I OUT_IF]
 *
 * -o, -w and -i/-I give the C relay what vgate's stack mode does to its sockets, so that a
 * run can tell their kernel cost from vgate's own (A/B in scripts/bench-relay.sh, config
 * `crelay-vgate`): -o asks for SO_RXQ_OVFL (the receive-queue drop counter as a control
 * message with every datagram, which vgate counts), -w watches the egress sockets too (vgate
 * reads every gateway port, also those it sends from, for return media; the kernel then
 * calls the epoll wake-up for every datagram sent, as the socket has a waiter), -i/-I bind
 * the ingress/egress sockets to their interfaces (SO_BINDTODEVICE, as vgate does for a
 * domain with an interface).
 *
 * Stream i: IN_ADDR:IN_BASE+i -> (from OUT_ADDR:OUT_BASE+i) -> DEST_ADDR:DEST_BASE+i.
 * Runs until SIGINT/SIGTERM, then prints "rx=<packets> tx=<packets> send_errors=<n>".
 * Built by scripts/bench-relay.sh with `cc -O2`.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BATCH 32
#define BUDGET 4
#define BUF 2048
#define MAXN 10000

static volatile sig_atomic_t stop;
static void on_signal(int s) { (void)s; stop = 1; }

static void die(const char *what) {
    perror(what);
    exit(1);
}

static int rxq_ovfl;

static int udp_bound(const char *addr, int port, const char *ifname) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket");
    int buf = 4 << 20, one = 1;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (rxq_ovfl)
        setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof one);
    if (ifname && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname, strlen(ifname)) < 0)
        die("SO_BINDTODEVICE");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "crelay: bad address %s\n", addr);
        exit(2);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        fprintf(stderr, "crelay: bind %s:%d: %s\n", addr, port, strerror(errno));
        exit(1);
    }
    return fd;
}

int main(int argc, char **argv) {
    const char *in_addr = NULL, *out_addr = NULL, *dest_addr = NULL, *in_if = NULL, *out_if = NULL;
    int in_base = 0, out_base = 0, dest_base = 0, n = 0, c, watch_tx = 0;
    while ((c = getopt(argc, argv, "a:p:n:b:e:d:s:owi:I:")) != -1) {
        switch (c) {
        case 'a': in_addr = optarg; break;
        case 'p': in_base = atoi(optarg); break;
        case 'n': n = atoi(optarg); break;
        case 'b': out_addr = optarg; break;
        case 'e': out_base = atoi(optarg); break;
        case 'd': dest_addr = optarg; break;
        case 's': dest_base = atoi(optarg); break;
        case 'o': rxq_ovfl = 1; break;
        case 'w': watch_tx = 1; break;
        case 'i': in_if = optarg; break;
        case 'I': out_if = optarg; break;
        default:
            fprintf(stderr, "usage: crelay -a IN_ADDR -p IN_BASE -n N -b OUT_ADDR -e OUT_BASE "
                            "-d DEST_ADDR -s DEST_BASE [-o] [-w] [-i IN_IF -I OUT_IF]\n");
            return 2;
        }
    }
    if (!in_addr || !out_addr || !dest_addr || n < 1 || n > MAXN || in_base < 1 ||
        out_base < 1 || dest_base < 1 || in_base + n > 65536 || out_base + n > 65536 ||
        dest_base + n > 65536) {
        fprintf(stderr, "crelay: give -a -p -n (1..%d) -b -e -d -s\n", MAXN);
        return 2;
    }
    int *rx = calloc(n, sizeof *rx), *tx = calloc(n, sizeof *tx);
    struct sockaddr_in *dest = calloc(n, sizeof *dest);
    if (!rx || !tx || !dest)
        die("calloc");
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    for (int i = 0; i < n; i++) {
        rx[i] = udp_bound(in_addr, in_base + i, in_if);
        tx[i] = udp_bound(out_addr, out_base + i, out_if);
        dest[i].sin_family = AF_INET;
        dest[i].sin_port = htons(dest_base + i);
        inet_pton(AF_INET, dest_addr, &dest[i].sin_addr);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, rx[i], &ev) < 0)
            die("epoll_ctl");
        /* Watched, never read here (nothing comes back in the bench): only the waiter. */
        struct epoll_event txev = {.events = EPOLLIN, .data.u32 = MAXN + i};
        if (watch_tx && epoll_ctl(ep, EPOLL_CTL_ADD, tx[i], &txev) < 0)
            die("epoll_ctl");
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    static char bufs[BATCH][BUF];
    static char ctrl[BATCH][64];
    struct iovec iov[BATCH];
    struct mmsghdr in[BATCH], out[BATCH];
    for (int k = 0; k < BATCH; k++) {
        iov[k].iov_base = bufs[k];
        iov[k].iov_len = BUF;
    }
    unsigned long long nrx = 0, ntx = 0, nerr = 0;
    struct epoll_event evs[64];
    fprintf(stderr, "crelay: %d stream(s) ready\n", n);
    while (!stop) {
        int ne = epoll_wait(ep, evs, 64, 100);
        if (ne < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int e = 0; e < ne; e++) {
            int i = evs[e].data.u32;
            if (i >= MAXN)
                continue;
            for (int b = 0; b < BUDGET; b++) {
                for (int k = 0; k < BATCH; k++) {
                    iov[k].iov_len = BUF;
                    memset(&in[k].msg_hdr, 0, sizeof in[k].msg_hdr);
                    in[k].msg_hdr.msg_iov = &iov[k];
                    in[k].msg_hdr.msg_iovlen = 1;
                    if (rxq_ovfl) {
                        in[k].msg_hdr.msg_control = ctrl[k];
                        in[k].msg_hdr.msg_controllen = sizeof ctrl[k];
                    }
                }
                int got = recvmmsg(rx[i], in, BATCH, MSG_DONTWAIT, NULL);
                if (got <= 0)
                    break;
                nrx += got;
                for (int k = 0; k < got; k++) {
                    iov[k].iov_len = in[k].msg_len;
                    memset(&out[k].msg_hdr, 0, sizeof out[k].msg_hdr);
                    out[k].msg_hdr.msg_name = &dest[i];
                    out[k].msg_hdr.msg_namelen = sizeof dest[i];
                    out[k].msg_hdr.msg_iov = &iov[k];
                    out[k].msg_hdr.msg_iovlen = 1;
                }
                int done = 0;
                while (done < got) {
                    int s = sendmmsg(tx[i], out + done, got - done, MSG_DONTWAIT);
                    if (s < 0) {
                        if (errno == EINTR)
                            continue;
                        nerr += got - done; /* EAGAIN: socket buffer full, counted as lost */
                        break;
                    }
                    done += s;
                }
                ntx += done;
                if (got < BATCH)
                    break;
            }
        }
    }
    printf("rx=%llu tx=%llu send_errors=%llu\n", nrx, ntx, nerr);
    return 0;
}
