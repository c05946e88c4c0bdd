"""`make run` with FIBERMILL_REDIS_SENTINELS: it starts no Redis of its own, names the primary
the sentinels give, and its stop reads the running jobs through them."""

from services.devstack import run
from services.devstack.redis_sentinel import SentinelGroup
from services.devstack.stopping import running_jobs
from shared.settings import Settings


def test_the_banner_names_the_primary_and_the_stop_reads_through_the_sentinels(tmp_path,
                                                                              capsys):
    group = SentinelGroup(tmp_path, replicas=1)
    group.start()
    try:
        settings = Settings(**{k.removeprefix("FIBERMILL_").lower(): v
                               for k, v in group.env().items()})
        hint = run._sentinel_banner(settings)
        primary = group.primary_port()
        out = capsys.readouterr().out
        assert f"now 127.0.0.1:{primary}" in out and group.sentinel_addresses in out
        assert hint == f"redis-cli -h 127.0.0.1 -p {primary}"
        assert running_jobs(settings) == {}
        group.kill(group.primary())
        new = group.wait_failover(primary)
        assert run._sentinel_banner(settings) == f"redis-cli -h 127.0.0.1 -p {new}"
    finally:
        group.stop()
