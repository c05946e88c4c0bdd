"""An operator: one named step of a pipeline, with a typed input and output.

Operators hold read-only pipeline state only (the loaded model, its config); everything that
belongs to one batch (items, leased buffers, stop flags) comes in through the `Batch` they are
handed, so one operator object serves any number of batches, one after another or overlapped.
"""

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from services.worker.engine.batch import Batch

# "device" operators run a model (or touch the device the model runs on in order with it) and
# go to the model's single device thread; "cpu" operators run on the shared CPU pool, so they
# overlap with another batch's device phase.
ExecutorKind = Literal["device", "cpu"]


class Operator(ABC):
    name: ClassVar[str]
    input_type: ClassVar[type | tuple[type, ...]] = object
    output_type: ClassVar[type | tuple[type, ...]] = object
    executor: ClassVar[ExecutorKind] = "device"

    def can_operate(self, value: Any, batch: "Batch") -> bool:
        """Whether this operator takes `value`; a branch route runs the first that does."""
        return True

    @abstractmethod
    def run(self, value: Any, batch: "Batch") -> Any:
        """Turn this step's input into its output. Runs on an executor thread."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
