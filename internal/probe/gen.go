// SPDX-License-Identifier: Apache-2.0

package probe

// The generated magnet_bpfel.{go,o} are committed; CI regenerates them and
// fails when they differ, so the object always matches bpf/. genevents runs
// first: it writes bpf/events_btf.h, which the object includes, and the Go
// constants and layouts that events.h defines (see tools/genevents).
//go:generate go run ../../tools/genevents -root ../..
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel magnet ../../bpf/magnet.bpf.c -- -I../../bpf -I../../bpf/include
// The synthetic events' object, for the tests of the rings only (the
// _test suffix keeps it out of the product; magnet-lab has its own copy).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -output-suffix _test synthevent ../../bpf/synthevent.bpf.c -- -I../../bpf -I../../bpf/include
