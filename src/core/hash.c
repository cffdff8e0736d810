/*
 * hash.c - the 64-bit structural hash used for program identity: FNV-1a over 64-bit words with a
 * splitmix64 finaliser. Callers hash values (ops, shapes, attributes), never pointers.
 */
#include "internal.h"

#include <string.h>

void loom__hash_init(loom__hash *h) {
    h->h = 0xcbf29ce484222325ull;
}

void loom__hash_u64(loom__hash *h, uint64_t v) {
    h->h ^= v;
    h->h *= 0x100000001b3ull;
    h->h ^= h->h >> 29;
}

void loom__hash_bytes(loom__hash *h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h->h ^= b[i];
        h->h *= 0x100000001b3ull;
    }
    loom__hash_u64(h, n);
}

void loom__hash_large(loom__hash *h, const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t lane[4] = {1, 2, 3, 4}, w[4];
    size_t i = 0;
    for (; i + sizeof w <= n; i += sizeof w) {
        memcpy(w, b + i, sizeof w);
        for (int k = 0; k < 4; k++)
            lane[k] = (lane[k] ^ w[k]) * 0x100000001b3ull;
    }
    for (int k = 0; k < 4; k++)
        loom__hash_u64(h, lane[k]);
    loom__hash_bytes(h, b + i, n - i);
    loom__hash_u64(h, n);
}

uint64_t loom__hash_final(const loom__hash *h) {
    uint64_t z = h->h + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
