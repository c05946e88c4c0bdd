"""The one tree of domain errors. The API maps it to HTTP in services/api/errors.py."""


class FibermillError(Exception):
    """Base of every error Fibermill raises on purpose."""

    code = "internal_error"


class InvalidInput(FibermillError):
    """A request field is out of bounds or not understood."""

    code = "invalid_input"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownModel(InvalidInput):
    code = "unknown_model"

    def __init__(self, model: str, known: list[str]) -> None:
        super().__init__("model", f"unknown model {model!r}; known models: {', '.join(known)}")


class JobNotFound(FibermillError):
    code = "not_found"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class OutputNotFound(FibermillError):
    code = "not_found"


class InvalidTransition(FibermillError):
    """A status change that the job's current status does not allow (e.g. leaving a final state)."""

    code = "invalid_transition"


class ServiceUnavailable(FibermillError):
    code = "unavailable"


class ModelError(FibermillError):
    """A model raised while running a sub-request."""

    code = "model_error"


class DeadLettered(FibermillError):
    """A sub-request exhausted its attempts (each one killed or lost its worker)."""

    code = "dead_lettered"


class TimeLimitExceeded(FibermillError):
    code = "time_limit_exceeded"
