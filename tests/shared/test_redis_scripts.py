"""The Lua scripts as files: each script a wrapper declares, and each fragment it includes, is
found where the loader reads it, and ships in the wheel the images install."""

import re
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

from shared.redis_scripts import backlog, batches, claims, jobs, leases, queue, quotas, webhooks  # noqa: F401
from shared.redis_scripts.loader import ALL, FRAGMENTS_DIR, SCRIPTS_DIR, includes, source
from shared.settings import REPO_ROOT

PACKAGE = "shared.redis_scripts"
PACKAGE_DIR = Path(*PACKAGE.split("."))


def _referenced() -> set[str]:
    """Every .lua file a wrapper's script needs, relative to the package."""
    files: set[str] = set()
    pending = [f"{SCRIPTS_DIR}/{s.name}.lua" for s in ALL]
    while pending:
        path = pending.pop()
        if path in files:
            continue
        files.add(path)
        text = resources.files(PACKAGE).joinpath(path).read_text()
        pending += [f"{FRAGMENTS_DIR}/{name}.lua" for name in includes(text)]
    return files


def test_every_script_composes_with_its_fragments_and_no_file_is_left_unused():
    for script in ALL:
        text = source(script.name)
        assert not includes(text), f"{script.name}: an include left unexpanded"
        # A fragment is composed in once, however many of its includers a script names.
        for name in re.findall(r"^local function (\w+)", text, re.MULTILINE):
            assert text.count(f"local function {name}(") == 1, (script.name, name)
    on_disk = {str(p.relative_to(REPO_ROOT / PACKAGE_DIR))
               for p in (REPO_ROOT / PACKAGE_DIR).rglob("*.lua")}
    assert _referenced() == on_disk


def test_the_wheel_carries_every_referenced_lua_file(tmp_path):
    """Built as the images build it (a non-editable install of the project's pyproject.toml)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    shutil.copytree(REPO_ROOT / "shared", src / "shared",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", str(tmp_path / "dist"), str(src)],
        check=True, capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as whl:
        shipped = set(whl.namelist())
    missing = {f for f in _referenced() if f"{PACKAGE_DIR.as_posix()}/{f}" not in shipped}
    assert not missing, f"not in the wheel: {sorted(missing)}"
