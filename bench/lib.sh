# bench/lib.sh - shell helpers the benchmark scripts source. Not run on its own.

# The median of the numbers given as arguments (the mean of the middle two for an even count).
median() {
    printf '%s\n' "$@" | sort -g |
        awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# PyTorch's DDP peer (gloo) on this machine's loopback: without it gloo picks the interface of the
# host name, which these machines may not have (its processes then abort).
export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-lo}"
