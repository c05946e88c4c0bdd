"""The worker's Celery task: a sub-request whose lease or result could not be recorded because
Redis was away goes back to its queue (rejected with requeue), never acknowledged and lost. A
worker whose model cannot load says why in one line and exits."""

import logging
import shutil

import pytest
import yaml
from celery.exceptions import Reject
from redis.exceptions import ConnectionError as RedisConnectionError

from services.worker import celery_app
from services.worker.exits import ExitReason
from shared.messages import Outcome, SubRequest, TextItem
from shared.settings import Settings

SUB = SubRequest(job_id="j", index=0, model="tiny-gpt2",
                 item=TextItem(prompt="a", max_new_tokens=2))


class Runtime:
    """Stands in for the worker runtime: the task's own handling is what is tested here."""

    def __init__(self, outcome=None, error=None) -> None:
        self.outcome, self.error, self.seen = outcome, error, []

    def handle(self, sub):
        self.seen.append(sub)
        if self.error is not None:
            raise self.error
        return self.outcome


def test_a_redis_failure_hands_the_message_back(monkeypatch):
    monkeypatch.setattr(celery_app, "_runtime", Runtime(error=RedisConnectionError("gone")))
    monkeypatch.setattr(celery_app, "REQUEUE_PAUSE_SECONDS", 0)
    with pytest.raises(Reject) as caught:
        celery_app.run_subrequest.run(SUB.task_args()[0])
    assert caught.value.requeue is True


def test_an_outcome_is_returned_as_its_name(monkeypatch):
    runtime = Runtime(outcome=Outcome.SUCCEEDED)
    monkeypatch.setattr(celery_app, "_runtime", runtime)
    assert celery_app.run_subrequest.run(SUB.task_args()[0]) == "succeeded"
    assert runtime.seen == [SUB]


def test_a_model_missing_a_file_stops_the_worker_with_one_line(monkeypatch, caplog, tmp_path,
                                                               model_dir, redis_url):
    folder = tmp_path / "tiny-gpt2"
    shutil.copytree(model_dir / "tiny-gpt2", folder)
    (folder / "tokenizer.json").unlink()
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(
        {"models": {"tiny-gpt2": {"kind": "causal-lm", "path": str(folder)}}}))
    settings = Settings(redis_url=redis_url, model_registry=tmp_path / "registry.yaml")
    monkeypatch.setattr(celery_app, "get_settings", lambda: settings)
    exits = []

    def exit_worker(reason):
        exits.append(reason)
        raise SystemExit(reason.value)

    monkeypatch.setattr(celery_app, "exit_worker", exit_worker)
    with caplog.at_level(logging.CRITICAL), pytest.raises(SystemExit):
        celery_app._load()
    assert exits == [ExitReason.MODELS_FAILED_TO_LOAD]
    (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert record.getMessage() == (f"worker cannot start: model tiny-gpt2: {folder} lacks a "
                                   "tokenizer (tokenizer.json)")
    assert record.exc_info is None  # the line says it all: no traceback
