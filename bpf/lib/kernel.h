/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* BPF-only helpers of magnet: constants vmlinux.h lacks (they are macros in
 * the kernel) and small readers of kernel structures. */
#ifndef MAGNET_LIB_KERNEL_H
#define MAGNET_LIB_KERNEL_H

#define AF_INET 2
#define AF_INET6 10
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17

#define TCP_ESTABLISHED_ 1
#define TCP_FIN_WAIT1_ 4
#define TCP_FIN_WAIT2_ 5
#define TCP_TIME_WAIT_ 6
#define TCP_CLOSE_ 7
#define TCP_CLOSE_WAIT_ 8
#define TCP_LAST_ACK_ 9
#define TCP_LISTEN_ 10
#define TCP_CLOSING_ 11
#define TCP_NEW_SYN_RECV_ 12

#define TCPHDR_FIN 0x01
#define TCPHDR_SYN 0x02

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF


#define FILTERED ((__u64)-1)

#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

static __always_inline int seq_before(__u32 a, __u32 b)
{
	return (__s32)(a - b) < 0;
}

#endif
