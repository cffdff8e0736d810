/*
 * crc32c.c - CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4,
 * TFRecord framing and loom's files: slicing by 8 over tables made once. loom__crc32c(0, p, n) is
 * the CRC of p's n bytes; a CRC may be continued by passing it back with the bytes that follow.
 */
#include "internal.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[8][256];

static void make_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

uint32_t loom__crc32c(uint32_t crc, const void *p, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_tables);
    const unsigned char *b = p;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, b += 8) { /* (little-endian words: x86-64, aarch64) */
        uint32_t lo, hi;
        memcpy(&lo, b, 4), memcpy(&hi, b + 4, 4);
        lo ^= c;
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^
            table[4][lo >> 24] ^ table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^
            table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
    }
    while (n--)
        c = (c >> 8) ^ table[0][(c ^ *b++) & 0xFF];
    return ~c;
}
