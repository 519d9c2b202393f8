// SPDX-License-Identifier: Apache-2.0

package kevent

// The generated kevent_bpfel.{go,o} are committed, as probe's are. A uprobe
// reads the argument registers as x86-64 lays out pt_regs: on other
// architectures uprobes are refused at run time (see Load).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3 -D__TARGET_ARCH_x86" -target bpfel kevent ../../bpf/kevent.bpf.c -- -I../../bpf -I../../bpf/include
