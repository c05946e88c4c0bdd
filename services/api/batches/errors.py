"""Not-found errors of files and batches: 404s (subclasses of OutputNotFound, so the API's one
error mapping serves them), in OpenAI's error shape on these paths."""

from shared.errors import OutputNotFound


class FileNotFound(OutputNotFound):
    def __init__(self, file_id: str) -> None:
        super().__init__(f"No such File object: {file_id}")
        self.file_id = file_id


class BatchNotFound(OutputNotFound):
    def __init__(self, batch_id: str) -> None:
        super().__init__(f"No such Batch object: {batch_id}")
        self.batch_id = batch_id
