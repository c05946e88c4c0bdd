"""Building the scheduling for what a pipeline offers (model_code.py): a dynamic batcher over
a graph runner for graph models, a continuous decoder for step models."""

from services.worker.engine.batcher import Batcher
from services.worker.engine.decoder import Decoder
from services.worker.engine.graph_runner import GraphRunner
from services.worker.engine.model_code import GraphCode, ModelCode, StepCode
from services.worker.engine.scheduling import Scheduling
from services.worker.engine.start import OnStart


def build_scheduling(code: ModelCode, max_batch: int,
                     on_start: OnStart | None = None) -> Scheduling:
    """`max_batch` caps a batch (images) or the running rows (text)."""
    match code:
        case GraphCode(model):
            spec = model.spec
            runner = GraphRunner(model, on_start)
            return Batcher(runner.run_group, max_batch, spec.max_wait_ms / 1000,
                           linger_s=spec.linger_ms / 1000, key=model.batch_key,
                           together=runner.run)
        case StepCode(model):
            return Decoder(model, max_batch, model.spec.max_wait_ms / 1000, on_start)
