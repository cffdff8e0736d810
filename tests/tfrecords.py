"""tfrecords.py FILE - whether FILE is whole TFRecord records (TensorBoard's framing): each a
uint64 length, the masked CRC-32C of those 8 bytes, the data and its masked CRC-32C, the file
ending on a record's end. Prints the count; exit 1 naming the first bad byte otherwise."""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


raw = open(sys.argv[1], 'rb').read()
at = count = 0
while at < len(raw):
    head = raw[at:at + 12]
    if len(head) < 12 or struct.unpack('<I', head[8:])[0] != masked(head[:8]):
        sys.exit(f'bad record header at byte {at}')
    n = struct.unpack('<Q', head[:8])[0]
    data, tail = raw[at + 12:at + 12 + n], raw[at + 12 + n:at + 16 + n]
    if len(tail) < 4 or struct.unpack('<I', tail)[0] != masked(data):
        sys.exit(f'bad record data at byte {at + 12}')
    at += 16 + n
    count += 1
print(f'{count} whole records')
