"""The worker service: Celery app, device launcher, model pipelines."""
