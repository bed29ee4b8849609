// Attaches a two-instruction XDP program that returns XDP_PASS to an interface, in driver
// (native) mode, through netlink — so the attachment outlives this process and goes with the
// interface (or `xdppass -d IFNAME` removes it). For the bench bed only
// (scripts/bench/bed-lib.sh, `nic_feed`): on veth, a receiving end with an XDP program copies
// every frame of a locally built skb into a page-pool page with 256 bytes of headroom before
// the program runs (`veth_convert_skb_to_xdp_buff` → `skb_pp_cow_data`); the skb that leaves
// such a hop is the kind a NIC driver hands up (page-backed head, headroom 256), so the next
// veth's XDP program runs on it in place, as on a NIC.
//
//   cc -O2 -o xdppass xdppass.c
//   ip netns exec NS ./xdppass IFNAME        attach (prints the program id)
//   ip netns exec NS ./xdppass -d IFNAME     detach
#include <errno.h>
#include <linux/bpf.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static int sys_bpf(int cmd, union bpf_attr *a) { return (int)syscall(__NR_bpf, cmd, a, sizeof(*a)); }

static int load_pass(void) {
    struct bpf_insn insns[2] = {
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 0, .imm = XDP_PASS},
        {.code = BPF_JMP | BPF_EXIT},
    };
    char log[4096] = "";
    union bpf_attr a;
    memset(&a, 0, sizeof(a));
    a.prog_type = BPF_PROG_TYPE_XDP;
    a.insns = (uint64_t)(uintptr_t)insns;
    a.insn_cnt = 2;
    a.license = (uint64_t)(uintptr_t)"GPL";
    a.log_buf = (uint64_t)(uintptr_t)log;
    a.log_size = sizeof(log);
    a.log_level = 1;
    strncpy(a.prog_name, "bed_xdp_pass", sizeof(a.prog_name) - 1);
    int fd = sys_bpf(BPF_PROG_LOAD, &a);
    if (fd < 0) fprintf(stderr, "xdppass: BPF_PROG_LOAD: %s\n%s", strerror(errno), log);
    return fd;
}

// RTM_SETLINK ifindex { IFLA_XDP { IFLA_XDP_FD fd, IFLA_XDP_FLAGS XDP_FLAGS_DRV_MODE } }.
static int set_xdp(int ifindex, int fd) {
    struct {
        struct nlmsghdr nh;
        struct ifinfomsg ifi;
        char attrs[64];
    } req;
    memset(&req, 0, sizeof(req));
    req.nh.nlmsg_type = RTM_SETLINK;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
    req.nh.nlmsg_seq = 1;
    req.ifi.ifi_family = AF_UNSPEC;
    req.ifi.ifi_index = ifindex;
    struct rtattr *xdp = (struct rtattr *)req.attrs;
    xdp->rta_type = IFLA_XDP | NLA_F_NESTED;
    struct rtattr *a = (struct rtattr *)((char *)xdp + RTA_LENGTH(0));
    a->rta_type = IFLA_XDP_FD;
    a->rta_len = RTA_LENGTH(sizeof(int));
    memcpy(RTA_DATA(a), &fd, sizeof(int));
    struct rtattr *f = (struct rtattr *)((char *)a + RTA_ALIGN(a->rta_len));
    f->rta_type = IFLA_XDP_FLAGS;
    f->rta_len = RTA_LENGTH(sizeof(uint32_t));
    uint32_t flags = XDP_FLAGS_DRV_MODE;
    memcpy(RTA_DATA(f), &flags, sizeof(flags));
    xdp->rta_len = RTA_LENGTH(0) + RTA_ALIGN(a->rta_len) + RTA_ALIGN(f->rta_len);
    req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(req.ifi)) + RTA_ALIGN(xdp->rta_len);

    int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (s < 0) return -errno;
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    if (sendto(s, &req, req.nh.nlmsg_len, 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        close(s);
        return -e;
    }
    char buf[4096];
    ssize_t n = recv(s, buf, sizeof(buf), 0);
    close(s);
    if (n < (ssize_t)sizeof(struct nlmsghdr)) return -EIO;
    struct nlmsghdr *h = (struct nlmsghdr *)buf;
    if (h->nlmsg_type != NLMSG_ERROR) return -EIO;
    return ((struct nlmsgerr *)NLMSG_DATA(h))->error;
}

int main(int argc, char **argv) {
    int detach = argc == 3 && strcmp(argv[1], "-d") == 0;
    if (argc != 2 && !detach) {
        fprintf(stderr, "usage: xdppass [-d] IFNAME\n");
        return 2;
    }
    const char *ifname = argv[argc - 1];
    int ifindex = (int)if_nametoindex(ifname);
    if (!ifindex) {
        fprintf(stderr, "xdppass: no interface %s\n", ifname);
        return 1;
    }
    int fd = detach ? -1 : load_pass();
    if (!detach && fd < 0) return 1;
    int rc = set_xdp(ifindex, fd);
    if (rc < 0) {
        fprintf(stderr, "xdppass: attaching to %s: %s\n", ifname, strerror(-rc));
        return 1;
    }
    if (!detach) {
        struct bpf_prog_info info;
        memset(&info, 0, sizeof(info));
        union bpf_attr a;
        memset(&a, 0, sizeof(a));
        a.info.bpf_fd = (uint32_t)fd;
        a.info.info_len = sizeof(info);
        a.info.info = (uint64_t)(uintptr_t)&info;
        if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &a) == 0) printf("%u\n", info.id);
    }
    return 0;
}
