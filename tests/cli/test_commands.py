"""`fibermill` commands against a live API and workers."""

import json
import re
import struct
import time

import pytest

from services.devstack.redis_server import free_port
from tests.cli.conftest import run_cli, run_in_pty
from tests.cli.screen import final_screen

pytestmark = pytest.mark.e2e


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def test_submit_wait_json_returns_the_final_job_and_writes_the_images(cli, tmp_path):
    out = tmp_path / "imgs"
    r = cli("submit", "--model", "digits", "--prompt", "7", "--prompt", "3", "-n", "2",
            "--seed", "5", "--wait", "--out", str(out), "--json")
    assert r.code == 0, r.err
    job = json.loads(r.out)
    assert job["status"] == "succeeded" and job["progress"] == {"done": 4, "total": 4}
    assert [o["seed"] for o in job["output"]] == [5, 6, 7, 8]
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [f"{job['id']}-{i}.png" for i in range(4)]
    assert all(_png_size(f.read_bytes()) == (16, 16) for f in files)
    assert "wrote 4 files" in r.err

    # A finished job's outputs can be fetched again later.
    again = cli("status", job["id"], "--out", str(tmp_path / "again"))
    assert again.code == 0
    assert again.out.splitlines()[-4:] == [str(tmp_path / "again" / f.name) for f in files]


def test_failed_job_exits_non_zero(cli):
    r = cli("submit", "-m", "broken-gpt2", "-p", "Hello there", "--wait", "--json")
    assert r.code == 1, (r.out, r.err)
    job = json.loads(r.out)
    assert job["status"] == "failed" and job["error"]["code"] == "model_error"

    human = cli("status", job["id"])
    assert human.code == 1
    assert "failed" in human.out and "model_error" in human.out


def test_cancel_a_running_job(cli, stack):
    r = cli("submit", "-m", "digits", "-p", "4", "--steps", "1000")
    assert r.code == 0, r.err
    job_id = r.out.strip()
    assert len(job_id) == 32 and f"fibermill status {job_id} --wait" in r.err
    deadline = time.time() + 60
    while stack.http.get(f"/v1/jobs/{job_id}").json()["status"] == "queued":
        assert time.time() < deadline
        time.sleep(0.1)

    r = cli("cancel", job_id)
    assert r.code == 0 and f"job {job_id} canceled" in r.out
    assert cli("status", job_id).code == 3
    r = cli("status", job_id, "--wait", "--json")
    assert r.code == 3 and json.loads(r.out)["status"] == "canceled"
    assert f"job {job_id} was already canceled; nothing to cancel" in cli("cancel", job_id).out


def test_progress_bar_on_a_terminal(stack):
    # Long enough (about a second) that the job is still running when the CLI has started and
    # opened its event stream: step events are live only, never replayed.
    args = ["submit", "-m", "digits", "-p", "9", "-n", "2", "--steps", "1000", "--wait"]
    code, screen = run_in_pty(args, stack.base_url)
    assert code == 0, screen
    assert "\x1b[" in screen  # drawn with terminal control codes, not printed as lines
    assert "━" in screen  # rich's bar
    assert re.search(r"output #[12] step", screen)  # the denoise steps were followed live
    # What stays on the screen is the bar's done state, then the job.
    lines = [line for line in final_screen(screen) if line]
    assert "succeeded outputs" in lines[0] and "2/2" in lines[0], lines
    assert lines[1].startswith("job ") and lines[1].endswith(" succeeded"), lines
    assert not any("output #" in line for line in lines), lines


def test_models_and_jobs_for_scripts(cli):
    r = cli("submit", "-m", "tiny-gpt2", "-p", "Hi", "--max-new-tokens", "3", "--wait")
    assert r.code == 0, r.err
    assert "'Hi' →" in r.out and "(length, 3 tokens)" in r.out
    models = json.loads(cli("models", "--json").out)
    digits = next(m for m in models if m["name"] == "digits")
    assert digits["task"] == "image-generation" and digits["available"]
    assert "digits" in cli("models").out
    jobs = json.loads(cli("jobs", "--json", "--limit", "100").out)
    assert jobs and all(set(j) >= {"id", "status", "progress"} for j in jobs)
    human = cli("jobs", "--limit", "1")
    assert human.code == 0 and jobs[0]["id"] in human.out


def test_invalid_input_names_the_field(cli):
    # The problems are in the API's words; the CLI's part is the field and the line.
    r = cli("submit", "-m", "digits", "-p", "7", "--width", "24")
    assert r.code == 4 and r.out == ""
    assert "\n  input.width: " in r.err and "16" in r.err, r.err
    r = cli("submit", "-m", "digits", "-p", "7", "-p", "a cat")
    assert r.code == 4 and "\n  input.prompts.1: " in r.err, r.err


def test_options_of_the_other_task_are_refused(cli):
    r = cli("submit", "-m", "digits", "-p", "7", "--max-new-tokens", "5")
    assert r.code == 2, r.err
    assert "--max-new-tokens does not apply: digits is an image-generation model" in r.err


def test_global_options_before_or_after_the_command(stack):
    nothing_there = f"http://127.0.0.1:{free_port()}"
    before = run_cli(["--url", stack.base_url, "--json", "models"], nothing_there)
    assert before.code == 0, before.err
    assert "digits" in [m["name"] for m in json.loads(before.out)]
    both = run_cli(["--url", nothing_there, "models", "--url", stack.base_url], nothing_there)
    assert both.code == 0 and "digits" in both.out, both.err


def test_a_wrong_url_path_names_the_url_tried(stack):
    r = run_cli(["models"], f"{stack.base_url}/wrong")
    assert r.code == 5 and r.out == ""
    assert (f"GET {stack.base_url}/wrong/v1/models answered 404 Not Found: "
            f"is --url the API's base URL (like {stack.base_url})?") in r.err


def test_unknown_job(cli):
    r = cli("status", "0" * 32)
    assert r.code == 4 and "not found" in r.err


def test_unreachable_api():
    url = f"http://127.0.0.1:{free_port()}"
    r = run_cli(["models"], url, timeout=30)
    assert r.code == 5 and f"cannot reach the API: GET {url}/v1/models failed" in r.err
