"""The worker's Celery task: a sub-request whose lease or result could not be recorded because
Redis was away goes back to its queue (rejected with requeue), never acknowledged and lost."""

import pytest
from celery.exceptions import Reject
from redis.exceptions import ConnectionError as RedisConnectionError

from services.worker import celery_app
from shared.messages import Outcome, SubRequest, TextItem

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
