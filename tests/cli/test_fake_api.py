"""`fibermill` as a real process against a scripted API: event sequences chosen by the test,
and answers in the shape of the API's next version."""

import subprocess
import threading

import pytest

from tests.cli.conftest import CLI, cli_env, run_cli, run_in_pty
from tests.cli.screen import final_screen

JOB_ID = "f" * 32
EVENTS = f"/v1/jobs/{JOB_ID}/events"

# /v1/models as the next API version gives it: defaults and limits of the model's own task
# only, and `parameters` besides.
MODELS = [
    {"name": "digits", "task": "image-generation", "kind": "ddpm", "classes": ["0", "1"],
     "description": "handwritten digits", "workers": ["w1"], "available": True,
     "defaults": {"steps": 50, "width": 16, "height": 16}, "limits": {"max_steps": 1000},
     "parameters": {"steps": {"type": "integer", "default": 50, "minimum": 1,
                              "maximum": 1000, "description": "denoise steps"}}},
    {"name": "tiny-gpt2", "task": "text-generation", "kind": "gpt2", "classes": None,
     "description": "noise", "workers": [], "available": False,
     "defaults": {"max_new_tokens": 16}, "limits": {"max_new_tokens": 64},
     "parameters": {"max_new_tokens": {"type": "integer", "default": 16, "minimum": 1,
                                       "maximum": 64, "description": "tokens"}}},
]


def job(status: str, done: int, total: int = 2) -> dict:
    output = [{"seed": i, "width": 16, "height": 16, "url": f"/v1/jobs/{JOB_ID}/outputs/{i}"}
              for i in range(done)] if status == "succeeded" else None
    return {"id": JOB_ID, "status": status, "model": "digits", "task": "image-generation",
            "input": {"prompts": ["9"], "num_images_per_prompt": 2},
            "progress": {"done": done, "total": total}, "metrics": {}, "error": None,
            "output": output}


def step(index: int, at: int) -> tuple[str, dict]:
    return "step", {"index": index, "step": at, "steps": 100}


@pytest.fixture
def running_job(fake_api):
    """A job that is queued when read, and whose stream goes on to succeed; the stream holds
    after output #2's step 37 of 100 until the test opens `gate`."""
    gate = threading.Event()
    fake_api.answer("GET", f"/v1/jobs/{JOB_ID}", job("queued", 0))
    fake_api.stream(EVENTS, [
        ("status", job("queued", 0)), ("status", job("running", 0)), step(0, 60),
        ("progress", {"done": 1, "total": 2}), step(1, 37), gate,
        ("progress", {"done": 2, "total": 2}), ("status", job("succeeded", 2))])
    yield gate
    gate.set()


def test_the_progress_bar_ends_complete_on_a_terminal(fake_api, running_job):
    # The gate opens only once the step bar was drawn at 37/100, so the end has to redraw it.
    code, screen = run_in_pty(["status", JOB_ID, "--wait"], fake_api.url,
                              when="37/100", then=running_job.set)
    assert code == 0, screen
    lines = [line for line in final_screen(screen) if line]
    bar = next(line for line in lines if "outputs" in line and "━" in line)
    assert "succeeded outputs" in bar and "2/2" in bar, lines
    # A complete bar is one colour; rich draws the not-done part with a second one.
    drawn = screen[screen.rindex("succeeded outputs"):]
    assert "╺" not in drawn.split("\n")[0] and "╸" not in drawn.split("\n")[0], drawn
    assert not any("output #" in line or "/100" in line for line in lines), lines
    assert lines[lines.index(bar) + 1].startswith(f"job {JOB_ID} succeeded"), lines


def test_wait_on_a_pipe_prints_the_final_status_once(fake_api, running_job):
    running_job.set()
    proc = subprocess.run([*CLI, "status", JOB_ID, "--wait"], env=cli_env(fake_api.url),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout
    # Stdout and stderr in one pipe: one status line in all, the final one, then the result.
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("job ")] == [f"job {JOB_ID} succeeded"]
    assert lines[0] == f"job {JOB_ID} succeeded" and len(lines) == 4, lines


def test_every_problem_of_a_422_is_printed_on_its_line_with_its_field(fake_api):
    fake_api.answer("POST", "/v1/jobs", status=422, body={"detail": [
        {"loc": ["body", "input", "max_new_tokens"], "msg": "must be at most 64", "type": "x"},
        {"loc": ["body", "input", "prompts", 0], "msg": "must not be empty", "type": "x"},
        {"loc": ["body", "input", "max_new_tokens"], "msg": "must be even", "type": "x"},
        {"loc": ["body"], "msg": "too much at once", "type": "x"}]})
    r = run_cli(["submit", "-m", "tiny-gpt2", "--task", "text-generation", "-p", "",
                 "--max-new-tokens", "99"], fake_api.url, timeout=60)
    assert r.code == 4 and r.out == ""
    assert r.err.splitlines() == [
        "fibermill: the API refused the request (422):",
        "  input.max_new_tokens: must be at most 64",
        "  input.prompts.0: must not be empty",
        "  input.max_new_tokens: must be even",
        "  request: too much at once"]


def test_models_with_only_their_own_tasks_defaults_are_listed_and_used(fake_api):
    fake_api.answer("GET", "/v1/models", {"models": MODELS})
    fake_api.answer("POST", "/v1/jobs", status=202, body=job("queued", 0))
    table = run_cli(["models"], fake_api.url, timeout=60)
    assert table.code == 0, table.err
    assert [line.split()[:4] for line in table.out.splitlines()[1:]] == [
        ["digits", "image-generation", "ddpm", "1"], ["tiny-gpt2", "text-generation", "gpt2", "0"]]

    r = run_cli(["submit", "-m", "tiny-gpt2", "-p", "Hi", "--max-new-tokens", "5"],
                fake_api.url, timeout=60)
    assert r.code == 0 and r.out == f"{JOB_ID}\n", r.err
    assert "no worker serves tiny-gpt2" in r.err
    assert fake_api.bodies[-1] == {"task": "text-generation", "model": "tiny-gpt2",
                                   "input": {"prompts": ["Hi"], "max_new_tokens": 5}}


def test_options_of_the_other_task_are_refused_in_words_that_agree(fake_api):
    fake_api.answer("GET", "/v1/models", {"models": MODELS})
    one = run_cli(["submit", "-m", "digits", "-p", "7", "--max-new-tokens", "5"], fake_api.url)
    assert one.code == 2
    assert "--max-new-tokens does not apply: digits is an image-generation model" in one.err
    two = run_cli(["submit", "-m", "tiny-gpt2", "-p", "Hi", "--steps", "3", "--width", "8"],
                  fake_api.url)
    assert two.code == 2
    assert "--steps and --width do not apply: tiny-gpt2 is a text-generation model" in two.err
    assert fake_api.bodies == []


def test_a_path_the_api_does_not_serve_names_the_url_tried(fake_api):
    r = run_cli(["models"], f"{fake_api.url}/wrong", timeout=60)
    assert r.code == 5 and r.out == ""
    assert r.err.strip() == (
        f"fibermill: GET {fake_api.url}/wrong/v1/models answered 404 Not Found: "
        f"is --url the API's base URL (like {fake_api.url})?")
