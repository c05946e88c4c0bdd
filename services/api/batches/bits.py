"""A set of line indices as a bitmap in Redis's layout (SETBIT/GETBIT: bit 0 is the high bit
of byte 0), so a batch's done lines cost a bit each, in Redis and in its driver."""


class Bits:
    def __init__(self, data: bytes = b"") -> None:
        self._bytes = bytearray(data)
        self._count = int.from_bytes(self._bytes, "big").bit_count()

    def __contains__(self, i: object) -> bool:
        if not isinstance(i, int) or i < 0:
            return False
        byte = i >> 3
        return byte < len(self._bytes) and bool(self._bytes[byte] & (0x80 >> (i & 7)))

    def add(self, i: int) -> None:
        if i in self:
            return
        byte = i >> 3
        if byte >= len(self._bytes):
            self._bytes.extend(bytes(byte + 1 - len(self._bytes)))
        self._bytes[byte] |= 0x80 >> (i & 7)
        self._count += 1

    def __len__(self) -> int:
        return self._count
