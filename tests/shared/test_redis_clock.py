"""The Redis server's clock, read by the API for decisions every replica must make alike."""

import time

from shared.redis_clock import redis_now


async def test_it_is_the_servers_time_whatever_this_hosts_clock_says(aredis, monkeypatch):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    seconds, micros = await aredis.time()
    now = await redis_now(aredis)
    assert seconds + micros / 1e6 <= now < seconds + micros / 1e6 + 5
    assert abs(now - real()) < 60  # the server shares this machine's real clock
