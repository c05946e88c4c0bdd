"""The model's own tests load it as the worker tests do, through their fixture."""

from tests.worker.conftest import digits_pipeline

__all__ = ["digits_pipeline"]
