#!/usr/bin/env bash
# test_mpi_hosts.sh MPIEXEC LOOM - two hosts on one machine: two network namespaces joined by a
# veth pair (10.77.x.1 and 10.77.x.2), one MPI process in each, MPI over TCP between them (the
# launcher reaches the second namespace through `ip netns exec`, as it would reach a machine
# through ssh). `loom train` across them must save bitwise the weights of the same run with both
# processes on one host, and the test accuracy must be the same. Skipped (exit 77, one line)
# where namespaces cannot be made (not root, no iproute2).
set -u
mpiexec="$1" loom="$2"
tmp="${LOOM_TEST_TMP:-/tmp}/hosts.$$"
sub=$(($$ % 200 + 20))
a="loomA$$" b="loomB$$" ipa="10.77.$sub.1" ipb="10.77.$sub.2"
mkdir -p "$tmp"
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
if ! { ip netns add "$a" && ip netns add "$b" && ip link add "va$$" type veth peer name "vb$$" &&
       ip link set "va$$" netns "$a" && ip link set "vb$$" netns "$b" &&
       ip -n "$a" addr add "$ipa/24" dev "va$$" && ip -n "$b" addr add "$ipb/24" dev "vb$$" &&
       ip -n "$a" link set "va$$" up && ip -n "$b" link set "vb$$" up &&
       ip -n "$a" link set lo up && ip -n "$b" link set lo up; } 2>"$tmp/ns.err"; then
    echo "skipped: cannot make network namespaces here: $(head -1 "$tmp/ns.err")"
    exit 77
fi
# the launcher's "ssh" to the other host: the other namespace
cat >"$tmp/rsh" <<RSH
#!/bin/sh
host=\$1; shift
case "\$host" in $ipa) ns=$a ;; $ipb) ns=$b ;; *) echo "rsh: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec "\$ns" sh -c "\$*"
RSH
chmod +x "$tmp/rsh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
train="$loom train fmnist-mlp --devices 1 --steps 20 --no-shuffle --timeout 30"
fails=0
if ! timeout 300 ip netns exec "$a" "$mpiexec" --mca plm_rsh_agent "$tmp/rsh" --host "$ipa,$ipb" -np 2 \
        --mca btl self,tcp --mca btl_tcp_if_include "10.77.$sub.0/24" --mca oob_tcp_if_include "10.77.$sub.0/24" \
        $train --save "$tmp/two-hosts.st" >"$tmp/two-hosts.log" 2>&1; then
    echo "FAIL: across two namespaces: $(tail -5 "$tmp/two-hosts.log")"; fails=1
elif ! OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 \
        timeout 300 "$mpiexec" -np 2 $train --save "$tmp/one-host.st" >"$tmp/one-host.log" 2>&1; then
    echo "FAIL: on one host: $(tail -5 "$tmp/one-host.log")"; fails=1
else
    acc2=$(grep '^test accuracy' "$tmp/two-hosts.log") acc1=$(grep '^test accuracy' "$tmp/one-host.log")
    if cmp -s "$tmp/two-hosts.st" "$tmp/one-host.st" && [ -n "$acc1" ] && [ "$acc1" = "$acc2" ]; then
        echo "ok   two hosts ($ipa in $a, $ipb in $b, MPI over TCP) save bitwise the weights of one host; $acc2"
    else
        echo "FAIL: two hosts differ from one: $acc2 / $acc1"; fails=1
    fi
fi
[ "$fails" -eq 0 ]
