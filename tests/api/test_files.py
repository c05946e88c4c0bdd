"""/v1/files on the real app: uploads checked line by line, the size limit, a key's own files
only, listing, content, deletion, and the sweep of expired hours of files."""

import json
import time
from typing import BinaryIO, cast

import pytest
from fastapi.testclient import TestClient
from openai.types import FileDeleted, FileObject

from services.api.app import create_app
from services.api.batches.files import file_blob_key, new_file_id
from services.api.sweeper import Sweeper
from shared.blobstore.local import LocalBlobStore
from shared.settings import Settings, get_settings

KEY_A = "fm-test-key-alpha"
KEY_B = "fm-test-key-bravo"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
DAY = 86400


def line(custom_id: str, url: str = "/v1/completions", **body) -> str:
    body = body or {"model": "tiny-gpt2", "prompt": "Hi", "max_tokens": 4}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


GOOD = jsonl(line("a"), line("b", "/v1/chat/completions", model="pydoc-gpt2",
                             messages=[{"role": "user", "content": "hi"}]))


def upload(client: TestClient, content: bytes, headers: dict, purpose: str = "batch",
           name: str = "in.jsonl"):
    return client.post("/v1/files", files={"file": (name, content, "application/jsonl")},
                       data={"purpose": purpose}, headers=headers)


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_API_KEYS", f"{KEY_A},{KEY_B}")
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def test_upload_read_list_and_delete(client):
    resp = upload(client, GOOD, A)
    assert resp.status_code == 200, resp.text
    f = FileObject.model_validate(resp.json())
    assert f.id.startswith("file-") and f.object == "file" and f.purpose == "batch"
    assert f.bytes == len(GOOD) and f.filename == "in.jsonl" and f.status == "processed"
    assert f.expires_at == f.created_at + get_settings().file_ttl_seconds
    assert abs(f.created_at - time.time()) < 5

    assert client.get(f"/v1/files/{f.id}", headers=A).json() == resp.json()
    content = client.get(f"/v1/files/{f.id}/content", headers=A)
    assert content.status_code == 200 and content.content == GOOD

    second = upload(client, GOOD, A, name="two.jsonl").json()
    listed = client.get("/v1/files", headers=A).json()
    assert [x["id"] for x in listed["data"]] == [second["id"], f.id]  # newest first
    assert listed["object"] == "list" and listed["has_more"] is False
    page = client.get("/v1/files", params={"limit": 1}, headers=A).json()
    assert [x["id"] for x in page["data"]] == [second["id"]] and page["has_more"] is True
    rest = client.get("/v1/files", params={"limit": 1, "after": page["last_id"]},
                      headers=A).json()
    assert [x["id"] for x in rest["data"]] == [f.id] and rest["has_more"] is False
    asc = client.get("/v1/files", params={"order": "asc"}, headers=A).json()
    assert [x["id"] for x in asc["data"]] == [f.id, second["id"]]
    assert client.get("/v1/files", params={"purpose": "batch_output"},
                      headers=A).json()["data"] == []

    gone = client.delete(f"/v1/files/{f.id}", headers=A)
    assert FileDeleted.model_validate(gone.json()) == FileDeleted(id=f.id, deleted=True,
                                                                  object="file")
    for path in (f"/v1/files/{f.id}", f"/v1/files/{f.id}/content"):
        missing = client.get(path, headers=A)
        assert missing.status_code == 404
        assert f.id in missing.json()["error"]["message"]
    assert [x["id"] for x in client.get("/v1/files", headers=A).json()["data"]] == [
        second["id"]]


def test_upload_problems_are_named_by_line(client):
    content = jsonl(
        line("a"),
        "{not json",
        "",  # blank lines are skipped, and still counted
        line("a"),
        line("c", "/v1/embeddings"),
        json.dumps({"custom_id": "d", "method": "GET", "url": "/v1/completions", "body": {}}),
        json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": []}),
        "[1, 2]",
        json.dumps({"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {}}),
    )
    resp = upload(client, content, A)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "file" and err["type"] == "invalid_request_error"
    message = err["message"]
    assert "line 2: not valid JSON" in message
    assert "line 4: custom_id 'a' appears again (first on line 1)" in message
    assert "line 5: url must be one of /v1/chat/completions, /v1/completions" in message
    assert 'line 6: method must be "POST"' in message
    assert "line 7: body must be a JSON object, not an array" in message
    assert "line 8: a JSON object is expected, not an array" in message
    assert "line 9: custom_id must be a non-empty string" in message
    assert "line 1:" not in message and "line 3:" not in message
    assert client.get("/v1/files", headers=A).json()["data"] == []  # nothing stored


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"\xff\xfe{}\n"])
def test_an_empty_or_binary_file_is_refused(client, content):
    resp = upload(client, content, A)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"


@pytest.mark.parametrize("purpose", ["fine-tune", "assistants", "batch_output"])
def test_only_batch_files_can_be_uploaded(client, purpose):
    resp = upload(client, GOOD, A, purpose=purpose)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "purpose" and purpose in err["message"]


def test_missing_parts_are_400_naming_them(client):
    resp = client.post("/v1/files", data={"purpose": "batch"}, headers=A)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"
    resp = client.post("/v1/files", files={"file": ("x.jsonl", GOOD)}, headers=A)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "purpose"


def test_a_key_sees_only_its_own_files(client):
    f = upload(client, GOOD, A).json()
    for method, path in (("get", f"/v1/files/{f['id']}"), ("get", f"/v1/files/{f['id']}/content"),
                         ("delete", f"/v1/files/{f['id']}")):
        resp = getattr(client, method)(path, headers=B)
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "not_found"
    assert client.get("/v1/files", headers=B).json()["data"] == []
    assert client.get(f"/v1/files/{f['id']}", headers=A).status_code == 200
    assert client.get("/v1/files/not-an-id", headers=A).status_code == 404


@pytest.fixture
def small_files(settings_env, monkeypatch):
    """Files up to 4 KiB, any other body up to 2 KiB."""
    monkeypatch.setenv("FIBERMILL_MAX_FILE_BYTES", "4096")
    monkeypatch.setenv("FIBERMILL_MAX_BODY_BYTES", "2048")
    monkeypatch.delenv("FIBERMILL_API_KEYS", raising=False)
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def _lines_of(size: int) -> bytes:
    out = b""
    n = 0
    while len(out) < size:
        out += (line(f"id-{n}") + "\n").encode()
        n += 1
    return out


def test_files_have_their_own_size_limit(small_files):
    # Over the general body limit, under the file limit: accepted.
    fits = _lines_of(3000)
    assert 2048 < len(fits) <= 4096
    assert upload(small_files, fits, {}).status_code == 200
    # Other routes keep theirs.
    job = {"model": "tiny-gpt2", "input": {"prompts": ["x" * 3000]}}
    assert small_files.post("/v1/jobs", json=job).status_code == 413
    # Over the file limit (within the multipart slack): the route refuses it.
    big = _lines_of(5000)
    resp = upload(small_files, big, {})
    assert resp.status_code == 413, resp.text
    err = resp.json()["error"]
    assert "4096" in err["message"] and err["code"] == "payload_too_large"
    # Far over it: the body limit refuses it before the app reads it, naming the file limit.
    huge = _lines_of(200_000)
    resp = upload(small_files, huge, {})
    assert resp.status_code == 413 and "4096" in resp.json()["error"]["message"]
    assert small_files.get("/v1/files").json()["data"][0]["bytes"] == len(fits)


async def test_expired_hours_of_files_are_swept(tmp_path, aredis):
    blobs = LocalBlobStore(tmp_path)
    now = time.time()
    old = [file_blob_key(new_file_id(now - 31 * DAY), "k1"),
           file_blob_key(new_file_id(now - 32 * DAY), None)]
    kept = [file_blob_key(new_file_id(now - 29 * DAY), "k1"),
            file_blob_key(new_file_id(now), "k1")]
    for key in old + kept:
        await blobs.put(key, b"{}\n")
    await blobs.put("files/notes.txt", b"not an hour")
    sweeper = Sweeper(blobs, Settings(file_ttl_seconds=30 * DAY), aredis)
    assert await sweeper.sweep_files(now) == 2
    assert sorted([k async for k in blobs.keys("")]) == sorted([*kept, "files/notes.txt"])
    await blobs.close()


def test_a_line_nested_too_deep_is_refused_naming_the_line_and_the_limit(client):
    """50,000 levels would overflow the parser's recursion: the check counts them first."""
    deep = json.dumps({"custom_id": "d", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "tiny-gpt2", "prompt": "x"}})
    deep = deep[:-1] + ', "extra": ' + "[" * 50_000 + "]" * 50_000 + "}"
    content = jsonl(line("a"), deep, line("c", prompt="[" * 100 + " brackets in a string"))
    resp = upload(client, content, A)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "file"
    assert "line 2: nested deeper than 64 levels (the most a line may nest)" in err["message"]
    assert "line 1" not in err["message"] and "line 3" not in err["message"]
    # 64 levels are allowed; the brackets of a string are not levels.
    ok = line("a", model="tiny-gpt2", prompt="p", x=json.loads("[" * 62 + "]" * 62))
    assert upload(client, jsonl(ok, line("c", prompt="[" * 100)), A).status_code == 200


def test_a_line_longer_than_a_request_may_be_is_refused(small_files):
    long = line("b", prompt="x" * 2100)
    resp = upload(small_files, jsonl(line("a"), long, line("c")), {})
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert ("line 2: longer than 2048 bytes (the largest request, FIBERMILL_MAX_BODY_BYTES)"
            in message)
    assert "line 1" not in message and "line 3" not in message


def test_an_upload_is_checked_and_stored_a_chunk_at_a_time(client, monkeypatch):
    """Neither the route nor the store reads the upload whole: the file (several MiB, so on
    disk) is read in chunks by the check and by the store's put_file, never UploadFile.read
    or a put of the whole bytes."""
    from starlette.datastructures import UploadFile

    from services.api.batches import checker

    reads: list[int] = []
    real_check = checker.check_file

    class Spy:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            assert n is not None and 0 < n <= checker.READ_BYTES, n
            data = self.f.read(n)
            reads.append(len(data))
            return data

        def seek(self, *args):
            return self.f.seek(*args)

    async def whole(*args, **kwargs):
        raise AssertionError("the upload was read whole")

    monkeypatch.setattr(UploadFile, "read", whole)
    monkeypatch.setattr(checker, "check_file",
                        lambda f, *a: real_check(cast(BinaryIO, Spy(f)), *a))
    puts: list[int] = []
    blobs = client.app.state.blobs
    real_put = blobs.put

    async def put(key, data, content_type=None):
        puts.append(len(data))
        return await real_put(key, data, content_type)

    monkeypatch.setattr(blobs, "put", put)
    content = b"".join((line(f"id-{n}", prompt="p" * 150) + "\n").encode()
                       for n in range(30_000))
    assert len(content) > 5 * 1024 * 1024
    resp = upload(client, content, A)
    assert resp.status_code == 200, resp.text
    assert sum(reads) == len(content) and len(reads) >= len(content) // checker.READ_BYTES
    assert puts == []  # stored with put_file, from the spooled file
    f = resp.json()
    assert f["bytes"] == len(content)
    assert client.get(f"/v1/files/{f['id']}/content", headers=A).content == content
