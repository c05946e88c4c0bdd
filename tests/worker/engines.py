"""One engine per loaded pipeline, as a worker holds one per model: the tests that share a
pipeline share its engine, and so its decoder's state and preallocated slots."""

from services.worker.engine.engine import Engine
from services.worker.engine.model_code import Servable

_engines: dict[int, Engine] = {}


def engine_for(pipeline: Servable) -> Engine:
    engine = _engines.get(id(pipeline))
    if engine is None or engine.pipeline is not pipeline:
        engine = _engines[id(pipeline)] = Engine(pipeline)
    return engine
