"""Images go from the worker to the blob store and from there to the client: nothing of them
passes through Redis."""

from shared import names


def test_images_are_stored_in_the_blob_store_not_in_redis(stack):
    job = stack.submit({"model": "digits", "input": {"prompts": ["3", "8"], "seed": 5}})
    done = stack.wait(job["id"])
    assert done["status"] == "succeeded", done
    assert not stack.redis.exists(names.blobs_key(job["id"]))
    folder = stack.log_dir / "blobs" / "outputs" / job["id"]
    assert sorted(p.name for p in folder.iterdir()) == ["0.png", "1.png"]
    for i in range(2):
        served = stack.http.get(f"/v1/jobs/{job['id']}/outputs/{i}")
        assert served.status_code == 200
        assert served.content == (folder / f"{i}.png").read_bytes()
        assert served.content.startswith(b"\x89PNG")
    # Redis holds only the small record: the sub-results name their keys.
    raw = stack.redis.hget(names.results_key(job["id"]), 0)
    assert f'"blob":"outputs/{job["id"]}/0.png"'.encode() in raw
