"""Bits reads Redis's bitmaps (SETBIT's bit order) and counts what it holds."""

from services.api.batches.bits import Bits


async def test_bits_read_a_redis_bitmap(aredis):
    for i in (0, 7, 8, 1000):
        await aredis.setbit("bits", i, 1)
    bits = Bits(await aredis.get("bits"))
    assert [i for i in range(1100) if i in bits] == [0, 7, 8, 1000]
    assert len(bits) == 4
    bits.add(5000)
    bits.add(7)
    assert len(bits) == 5 and 5000 in bits and 4999 not in bits and -1 not in bits
    assert len(Bits()) == 0 and 3 not in Bits()
