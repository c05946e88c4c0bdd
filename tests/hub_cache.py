"""A Hugging Face cache written by hand, in the hub's layout, with nothing downloaded:

    <cache>/models--<org>--<name>/blobs/<sha256>          the files' contents
    <cache>/models--<org>--<name>/snapshots/<commit>/...  links into blobs/
    <cache>/models--<org>--<name>/refs/main               the commit
"""

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_hub_cache(files: Path, cache: Path, repo_id: str, commit: str = COMMIT) -> Path:
    """The folder's files as `repo_id`'s snapshot `commit` (refs/main) in `cache`; the repo's
    folder (`models--org--name`)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for source in sorted(p for p in files.rglob("*") if p.is_file()):
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / source.relative_to(files)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo
