"""Split a job into sub-requests and send each to its model's Celery queue by task name (a new
job's are pushed by the job store as it stores the job: `messages`)."""

from celery import Celery

from shared.inputs import ImageGenerationInput, TextGenerationInput
from shared.job import DEFAULT_PRIORITY
from shared.jobstore import Enqueue, JobRecord
from shared.messages import SubRequest
from shared.registry import ModelRegistry
from shared.sending import TaskMessages, send_subrequests
from shared.subrequest import split_items


class Dispatcher:
    def __init__(self, celery: Celery, registry: ModelRegistry) -> None:
        self.celery = celery
        self.registry = registry
        self._messages = TaskMessages(celery)

    def subrequests(self, job: JobRecord) -> list[SubRequest]:
        """The job's sub-requests, rebuilt from its stored input (the same every time)."""
        spec = self.registry.get(job.model)
        cls = TextGenerationInput if job.task == "text-generation" else ImageGenerationInput
        inp = cls.model_validate(job.input)
        items = split_items(spec, inp, seed=inp.seed or 0)
        return [
            SubRequest(job_id=job.id, index=i, model=job.model, item=item, owner=job.meta.owner,
                       traceparent=job.meta.traceparent)
            for i, item in enumerate(items)
        ]

    def messages(self, subs: list[SubRequest], priority: int = DEFAULT_PRIORITY) -> Enqueue:
        """A new job's sub-request messages, for the job store to enqueue as it stores the job."""
        return self._messages.build(subs, priority)

    async def send(self, subs: list[SubRequest], priority: int = DEFAULT_PRIORITY) -> None:
        await send_subrequests(self.celery, subs, priority)
