# SPDX-License-Identifier: Apache-2.0
# Sourced by the bench scripts: the two "hosts" their transfers run
# between, as internal/netlab builds them for magnet bench.

# lab_pair NS_A NS_B DEV_A DEV_B NET PREFIX: network namespaces NS_A and
# NS_B joined by a veth pair, DEV_A in NS_A with NET.1/PREFIX and DEV_B in
# NS_B with NET.2/PREFIX, every link up. The caller deletes the
# namespaces (its cleanup trap).
lab_pair() {
	local a=$1 b=$2 da=$3 db=$4 net=$5 prefix=$6
	ip netns add "$a"
	ip netns add "$b"
	ip -n "$a" link add "$da" type veth peer name "$db" netns "$b"
	ip -n "$a" addr add "$net.1/$prefix" dev "$da"
	ip -n "$b" addr add "$net.2/$prefix" dev "$db"
	for n in "$a" "$b"; do ip -n "$n" link set lo up; done
	ip -n "$a" link set "$da" up
	ip -n "$b" link set "$db" up
}
