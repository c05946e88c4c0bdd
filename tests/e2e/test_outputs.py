"""Images go from the worker to the blob store and from there to the client: nothing of them
passes through Redis. The API replicas' sweepers delete the hours of outputs whose retention
ended, and leave the rest."""

import time

from shared import names
from shared.blobstore.keys import output_key
from shared.job_ids import new_job_id


def test_images_are_stored_in_the_blob_store_not_in_redis(stack):
    job = stack.submit({"model": "digits", "input": {"prompts": ["3", "8"], "seed": 5}})
    done = stack.wait(job["id"])
    assert done["status"] == "succeeded", done
    root = stack.log_dir / "blobs"
    keys = [output_key(job["id"], i, None) for i in range(2)]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob(f"{job['id']}/*")) == keys
    for i, key in enumerate(keys):
        served = stack.http.get(f"/v1/jobs/{job['id']}/outputs/{i}")
        assert served.status_code == 200
        assert served.content == (root / key).read_bytes()
        assert served.content.startswith(b"\x89PNG")
    # Redis holds only the small record: the sub-results name their keys, no key holds a PNG.
    raw = stack.redis.hget(names.results_key(job["id"]), 0)
    assert f'"blob":"{keys[0]}"'.encode() in raw
    for key in stack.redis.scan_iter(match=f"*{job['id']}*"):
        kind = stack.redis.type(key)
        values = (stack.redis.hvals(key) if kind == b"hash" else
                  [stack.redis.get(key)] if kind == b"string" else [])
        assert not any(v and b"\x89PNG" in v for v in values), key


def test_the_sweeper_deletes_expired_hours_and_keeps_the_rest(stack):
    root = stack.log_dir / "blobs"
    expired = root / output_key(new_job_id(time.time() - 8 * 86400), 0, None)
    expired.parent.mkdir(parents=True)
    expired.write_bytes(b"\x89PNG old")
    job = stack.submit({"model": "digits", "input": {"prompts": ["1"], "seed": 1}})
    assert stack.wait(job["id"])["status"] == "succeeded"

    deadline = time.monotonic() + 30
    while expired.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not expired.exists()
    assert not expired.parent.parent.parent.exists()  # the whole hour folder went
    assert (root / output_key(job["id"], 0, None)).exists()
    resp = stack.http.get(f"/v1/jobs/{job['id']}/outputs/0")
    assert resp.status_code == 200
