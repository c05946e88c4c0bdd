"""The exception a pipeline raises when its caller asks it to stop early."""


class PipelineStopped(Exception):
    """The caller asked the pipeline to stop between steps; `partial` is what the item had
    made by then, where the pipeline can tell."""

    def __init__(self, partial: object | None = None) -> None:
        super().__init__()
        self.partial = partial
