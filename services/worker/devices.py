"""Find the GPUs this host offers without initialising CUDA in the launcher."""

import os
import shutil
import subprocess


def visible_gpus() -> list[str]:
    """GPU ids to pin one worker each to: CUDA_VISIBLE_DEVICES if set, else nvidia-smi's list."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]
