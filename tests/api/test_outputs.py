"""GET /v1/jobs/{id}/outputs/{i} for images in the blob store: streamed from an S3 server, or
a redirect to a presigned URL when the setting is on."""

import asyncio
import uuid

import httpx
import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.blobstore.keys import output_key
from shared.jobstore import JobStore
from shared.messages import GeneratedImage, SubResult
from tests.shared.conftest import S3_KEY_ID, S3_SECRET, S3Server, new_s3_store

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2000  # ~0.5 MB: several chunks


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    server.start()
    yield server
    server.kill()


@pytest.fixture
def bucket(s3, settings_env, monkeypatch):
    name = f"fm-{uuid.uuid4().hex[:12]}"
    for key, value in {"BLOB_BACKEND": "s3", "S3_ENDPOINT_URL": s3.url, "S3_BUCKET": name,
                       "S3_ACCESS_KEY_ID": S3_KEY_ID, "S3_SECRET_ACCESS_KEY": S3_SECRET,
                       "S3_CREATE_BUCKET": "true"}.items():
        monkeypatch.setenv(f"FIBERMILL_{key}", value)
    return name


def _client(monkeypatch, redirect: bool) -> TestClient:
    monkeypatch.setenv("FIBERMILL_BLOB_PRESIGNED_REDIRECT", str(redirect).lower())
    from shared.settings import get_settings

    get_settings.cache_clear()
    return TestClient(create_app(), follow_redirects=False)


def _image_job(client: TestClient, s3: S3Server, bucket: str, aredis_url: str) -> str:
    """A one-image job whose output a worker has written: its PNG in the bucket, its
    sub-result (with the key) in Redis."""
    job_id = client.post("/v1/jobs", json={"model": "digits",
                                           "input": {"prompts": ["3"]}}).json()["id"]

    async def write():
        import redis.asyncio as aioredis

        store = new_s3_store(s3, bucket=bucket)
        await store.put(output_key(job_id, 0, None), PNG, "image/png")
        await store.close()
        r = aioredis.Redis.from_url(aredis_url)
        await JobStore(r).store_result(job_id, SubResult(
            index=0, output=GeneratedImage(seed=1, width=16, height=16),
            blob=output_key(job_id, 0, None), worker="w1"))
        await r.aclose()

    asyncio.run(write())
    return job_id


def test_an_image_is_streamed_from_the_bucket(s3, bucket, redis_url, monkeypatch):
    with _client(monkeypatch, redirect=False) as client:
        job_id = _image_job(client, s3, bucket, redis_url)
        resp = client.get(f"/v1/jobs/{job_id}/outputs/0")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "image/png"
        assert resp.headers["content-length"] == str(len(PNG))
        assert resp.content == PNG


def test_with_redirects_on_the_client_gets_a_presigned_url(s3, bucket, redis_url,
                                                          monkeypatch):
    with _client(monkeypatch, redirect=True) as client:
        job_id = _image_job(client, s3, bucket, redis_url)
        resp = client.get(f"/v1/jobs/{job_id}/outputs/0")
        assert resp.status_code == 307
        location = resp.headers["location"]
        assert location.startswith(f"{s3.url}/{bucket}/{output_key(job_id, 0, None)}?")
        assert httpx.get(location).content == PNG  # a plain GET, with no credentials


def test_a_final_jobs_outputs_come_from_its_record(redis_url, settings_env, monkeypatch):
    """Once final, a job's sub-results expire within minutes: its record's output serves it,
    text as JSON and an image from where its id and owner file it."""
    import redis.asyncio as aioredis

    from shared import names
    from shared.blobstore.local import LocalBlobStore
    from shared.messages import GeneratedText
    from shared.settings import get_settings

    with _client(monkeypatch, redirect=False) as client:
        text_id = client.post("/v1/jobs", json={"model": "tiny-gpt2",
                                                "input": {"prompts": ["a"]}}).json()["id"]
        image_id = client.post("/v1/jobs", json={"model": "digits",
                                                 "input": {"prompts": ["3"]}}).json()["id"]

        async def finish():
            await LocalBlobStore(get_settings().blob_dir).put(
                output_key(image_id, 0, None), PNG, "image/png")
            r = aioredis.Redis.from_url(redis_url)
            store = JobStore(r)
            await store.store_result(text_id, SubResult(index=0, worker="w1", output=GeneratedText(
                text="hello", finish_reason="length", tokens=2)))
            await store.store_result(image_id, SubResult(
                index=0, output=GeneratedImage(seed=1, width=16, height=16),
                blob=output_key(image_id, 0, None), worker="w1"))
            for job_id in (text_id, image_id):
                for _ in range(200):
                    if (await store.get(job_id)).final:
                        break
                    await asyncio.sleep(0.05)
                await r.delete(names.results_key(job_id))  # as once they expired
            await r.aclose()

        asyncio.run(finish())
        text = client.get(f"/v1/jobs/{text_id}/outputs/0")
        assert text.status_code == 200, text.text
        assert text.json() == {"output": {"text": "hello", "finish_reason": "length",
                                          "tokens": 2, "prompt_tokens": None}}
        image = client.get(f"/v1/jobs/{image_id}/outputs/0")
        assert image.status_code == 200 and image.content == PNG
