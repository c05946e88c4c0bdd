"""The exception a pipeline raises when its caller asks it to stop early."""


class PipelineStopped(Exception):
    """The caller asked the pipeline to stop between steps."""
