"""The soak's own measuring parts, without a stack: Redis memory grouped by key shape, and the
local store outage that it injects and takes back."""

import redis

from benchmarks.soak import Outage, _memory_by_key_kind
from shared.job_ids import new_job_id


def test_memory_is_summed_over_keys_of_the_same_shape(redis_url):
    with redis.Redis.from_url(redis_url) as r:
        _check_grouping(r)


def _check_grouping(r: redis.Redis) -> None:
    ids = [new_job_id() for _ in range(3)]
    for job_id in ids:
        r.hset(f"fm:job:{job_id}", mapping={"status": "succeeded", "output": "x" * 200})
        r.hset(f"fm:job:{job_id}:results", mapping={"0": "y" * 100})
    r.set("fm:other", "z")

    kinds = _memory_by_key_kind(r)
    assert kinds["fm:job:{id}"]["keys"] == 3
    assert kinds["fm:job:{id}:results"]["keys"] == 3
    assert kinds["fm:other"]["keys"] == 1
    one = r.memory_usage(f"fm:job:{ids[0]}", samples=0)
    assert kinds["fm:job:{id}"]["bytes"] == 3 * one


def test_a_local_outage_makes_the_folder_unusable_and_gives_it_back_whole(tmp_path):
    blobs = tmp_path / "blobs"
    (blobs / "outputs").mkdir(parents=True)
    (blobs / "outputs" / "a.png").write_bytes(b"png")
    outage = Outage("local", None, blobs)
    outage.begin()
    assert blobs.is_file()
    outage.end()
    assert (blobs / "outputs" / "a.png").read_bytes() == b"png"
