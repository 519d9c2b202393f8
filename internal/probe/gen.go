// SPDX-License-Identifier: Apache-2.0

package probe

// The generated magnet_bpfel.{go,o} are committed; CI regenerates them and
// fails when they differ, so the object always matches bpf/.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel magnet ../../bpf/magnet.bpf.c -- -I../../bpf -I../../bpf/include
