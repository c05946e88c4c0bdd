"""Routers and the scheduler's walk: linear chains, branches, SPLIT/JOIN ordering."""

import asyncio
import itertools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.worker.engine.batch import Batch
from services.worker.engine.graph import Graph
from services.worker.engine.operator import Operator
from services.worker.engine.router import END, JOIN, START, Branch, Router, Split
from services.worker.engine.scheduler import Scheduler
from shared.errors import GraphError


class Fn(Operator):
    """An operator made from a function (the operators' own logic is not under test here)."""

    def __init__(self, name, fn, executor="cpu", accepts=None, input_type=object):
        self.name = name
        self.fn = fn
        self.executor = executor
        self.accepts = accepts
        self.input_type = input_type
        self.calls = []

    def can_operate(self, value, batch):
        return self.accepts is None or self.accepts(value)

    def run(self, value, batch):
        self.calls.append((value, threading.current_thread().name))
        return self.fn(value)


def linear(*names):
    """A router for START -> first -> ... -> last -> END."""
    return Router(dict(itertools.pairwise([START, *names, END])))


@pytest.fixture(scope="module")
def scheduler():
    device = ThreadPoolExecutor(1, thread_name_prefix="device")
    cpu = ThreadPoolExecutor(4, thread_name_prefix="cpu")
    phases = []
    s = Scheduler(device, cpu, "m", lambda model, phase, secs: phases.append(phase))
    s.phases = phases
    yield s
    device.shutdown()
    cpu.shutdown()


def run(scheduler, graph, value):
    return asyncio.run(scheduler.run_async(graph, value, Batch([value])))


def test_linear_chain_runs_in_order(scheduler):
    ops = [Fn("a", lambda x: [*x, 1]), Fn("b", lambda x: [*x, 2]), Fn("c", lambda x: [*x, 3])]
    graph = Graph(ops, linear("a", "b", "c"))
    assert run(scheduler, graph, []) == [1, 2, 3]


def test_device_operators_run_on_the_device_thread_only(scheduler):
    dev = Fn("dev", lambda x: x, executor="device")
    host = Fn("host", lambda x: x, executor="cpu")
    graph = Graph([host, dev], linear("host", "dev"))
    for i in range(5):
        run(scheduler, graph, i)
    assert {thread for _, thread in dev.calls} == {"device_0"}
    assert all(thread.startswith("cpu") for _, thread in host.calls)


def test_branch_takes_the_first_operator_that_can_operate(scheduler):
    ops = [
        Fn("start", lambda x: x),
        Fn("small", lambda x: f"small {x}", accepts=lambda x: x < 10),
        Fn("big", lambda x: f"big {x}"),
        Fn("end", lambda x: x.upper()),
    ]
    router = Router(
        {START: "start", "start": Branch("small", "big"), "small": "end", "big": "end",
         "end": END}
    )
    graph = Graph(ops, router)
    assert run(scheduler, graph, 3) == "SMALL 3"
    assert run(scheduler, graph, 30) == "BIG 30"


def test_branch_with_no_taker_is_an_error(scheduler):
    ops = [Fn("only", lambda x: x, accepts=lambda x: False)]
    graph = Graph(ops, Router({START: Branch("only"), "only": END}))
    with pytest.raises(GraphError, match="no operator"):
        run(scheduler, graph, 1)


def slow_square(x):
    # Later elements finish first: the join must still put them back in input order.
    time.sleep(0.02 * (5 - x) + random.random() * 0.005)
    return x * x


def test_split_join_keeps_input_order_when_items_finish_out_of_order(scheduler):
    finished = []

    def square(x):
        y = slow_square(x)
        finished.append(x)
        return y

    ops = [
        Fn("explode", lambda n: list(range(n))),
        Fn("square", square),
        Fn("plus1", lambda x: x + 1),
        Fn("total", lambda xs: xs),
    ]
    router = Router(
        {START: "explode", "explode": Split(each="square", then="total"), "square": "plus1",
         "plus1": JOIN, "total": END}
    )
    assert run(scheduler, Graph(ops, router), 5) == [1, 2, 5, 10, 17]
    assert finished != sorted(finished)  # they really did finish out of order


def test_split_elements_run_concurrently(scheduler):
    ops = [Fn("explode", lambda n: list(range(n))), Fn("nap", lambda x: time.sleep(0.2) or x)]
    router = Router({START: "explode", "explode": Split(each="nap", then=END), "nap": JOIN})
    t0 = time.perf_counter()
    assert run(scheduler, Graph(ops, router), 4) == [0, 1, 2, 3]
    assert time.perf_counter() - t0 < 0.6  # four 0.2 s naps, not one after another


def test_a_failing_element_fails_the_split(scheduler):
    def boom(x):
        if x == 2:
            raise RuntimeError("element 2 failed")
        return x

    ops = [Fn("explode", lambda n: list(range(n))), Fn("maybe", boom)]
    router = Router({START: "explode", "explode": Split(each="maybe", then=END), "maybe": JOIN})
    with pytest.raises(RuntimeError, match="element 2"):
        run(scheduler, Graph(ops, router), 4)


def test_wrong_input_type_is_caught_at_the_operator(scheduler):
    ops = [Fn("a", lambda x: str(x)), Fn("b", lambda x: x, input_type=int)]
    with pytest.raises(GraphError, match="b takes"):
        run(scheduler, Graph(ops, linear("a", "b")), 1)


def test_every_operator_is_timed(scheduler):
    scheduler.phases.clear()
    ops = [Fn("x", lambda v: v), Fn("y", lambda v: v)]
    run(scheduler, Graph(ops, linear("x", "y")), 0)
    assert scheduler.phases == ["x", "y"]


def test_graph_refuses_routes_to_unknown_operators():
    with pytest.raises(GraphError, match="unknown"):
        Graph([Fn("a", lambda x: x)], linear("a", "missing"))
    with pytest.raises(GraphError, match="START"):
        Router({"a": END})


def test_join_outside_a_split_is_an_error(scheduler):
    graph = Graph([Fn("a", lambda x: x)], Router({START: "a", "a": JOIN}))
    with pytest.raises(GraphError, match="outside"):
        run(scheduler, graph, 1)
