/* sockopt-cost: what stack mode's socket options cost the kernel per datagram, A/B in one
 * process (issue 12, docs/bench-relay.md). Over loopback, one thread sends a 1316-byte
 * datagram with sendmmsg and reads it back with recvmmsg, ROUNDS times PER datagrams per
 * variant, the variants interleaved round by round so that the machine's load falls on all
 * alike; the thread's own CPU time (CLOCK_THREAD_CPUTIME_ID) per datagram is compared with
 * the plain pair's:
 *   tx-watched    the sending socket is in an epoll set (vgate reads every gateway port, so
 *                 the kernel calls the epoll wake-up for every datagram sent and freed);
 *   rxq_ovfl      SO_RXQ_OVFL on the receiving socket, with a control buffer (the drop
 *                 counter as a control message with every datagram);
 *   bindtodevice  both sockets bound to "lo" (SO_BINDTODEVICE).
 *
 *   cc -O2 -o sockopt-cost scripts/bench/sockopt-cost.c && taskset -c 1 ./sockopt-cost 40 5000
 * Needs CAP_NET_RAW for SO_BINDTODEVICE; uses 127.0.0.1 ports 31000-31003 and 32000-32003.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static double tcpu(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int sock(int port, int ovfl){int fd=socket(AF_INET,SOCK_DGRAM|SOCK_NONBLOCK,0);int b=4<<20,one=1;setsockopt(fd,SOL_SOCKET,SO_RCVBUF,&b,4);setsockopt(fd,SOL_SOCKET,SO_SNDBUF,&b,4);if(ovfl)setsockopt(fd,SOL_SOCKET,SO_RXQ_OVFL,&one,4);struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(port)};a.sin_addr.s_addr=htonl(0x7f000001);if(bind(fd,(void*)&a,sizeof a)){perror("bind");exit(1);}return fd;}
int main(int argc,char**argv){
  if(argc<3){fprintf(stderr,"usage: sockopt-cost ROUNDS PER\n");return 2;}
  int rounds=atoi(argv[1]), per=atoi(argv[2]);
  /* variant 0: plain; 1: tx watched by epoll; 2: rx SO_RXQ_OVFL with control buffer */
  int tx[4],rx[4],ep=epoll_create1(0);
  for(int v=0;v<4;v++){tx[v]=sock(31000+v,0);rx[v]=sock(32000+v,v==2);}
  setsockopt(tx[3],SOL_SOCKET,SO_BINDTODEVICE,"lo",2);setsockopt(rx[3],SOL_SOCKET,SO_BINDTODEVICE,"lo",2);
  struct epoll_event ev={.events=EPOLLIN};ev.data.u32=1;epoll_ctl(ep,EPOLL_CTL_ADD,tx[1],&ev);
  static char buf[1316],rb[1400],ctrl[64];
  double tot[4]={0};
  for(int r=0;r<rounds;r++) for(int v=0;v<4;v++){
    struct sockaddr_in d={.sin_family=AF_INET,.sin_port=htons(32000+v)};d.sin_addr.s_addr=htonl(0x7f000001);
    double t0=tcpu();
    for(int i=0;i<per;i++){
      struct iovec io={buf,sizeof buf};struct mmsghdr m={.msg_hdr={.msg_name=&d,.msg_namelen=sizeof d,.msg_iov=&io,.msg_iovlen=1}};
      if(sendmmsg(tx[v],&m,1,0)!=1){perror("send");exit(1);}
      struct iovec ri={rb,sizeof rb};struct sockaddr_in src;struct mmsghdr h={.msg_hdr={.msg_name=&src,.msg_namelen=sizeof src,.msg_iov=&ri,.msg_iovlen=1}};
      if(v==2){h.msg_hdr.msg_control=ctrl;h.msg_hdr.msg_controllen=sizeof ctrl;}
      int k=0; while(recvmmsg(rx[v],&h,1,MSG_DONTWAIT,NULL)!=1){ if(++k>100000){perror("recv");exit(1);} }
    }
    tot[v]+=tcpu()-t0;
  }
  double n=(double)rounds*per;
  printf("per send+recv us: plain %.3f  tx-watched %+.3f  rxq_ovfl %+.3f  bindtodevice %+.3f\n",tot[0]/n*1e6,(tot[1]-tot[0])/n*1e6,(tot[2]-tot[0])/n*1e6,(tot[3]-tot[0])/n*1e6);
}
