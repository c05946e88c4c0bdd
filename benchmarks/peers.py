"""Fibermill beside its peers, in one run on one machine, for `make bench`.

    python -m benchmarks.peers [--quick] [--out FILE]

Two models: tiny-gpt2 (16 new tokens a request) and gpt2-6x256 (6 layers x 256 wide, seeded
random weights built at run time into a temporary directory, 64 new tokens), both served with
`max_batch: 32` from a temporary registry. Every request is one prompt, greedy, and makes its
full budget (the peers' `generate` runs with no EOS, benchmarks/hf_generate.py;
Fibermill's rows would stop at one, and the tokens/req column shows they made their budgets
too). The contenders:

- transformers `generate` in process, batches of 32 (the registry's max_batch), left padding;
- Fibermill's engine in process (pipeline + `Engine`, items announced through
  `Engine.arrival` as the worker does), bursts of 32: no HTTP, Redis or Celery;
- LitServe (`max_batch_size` 32, `batch_timeout` 10 ms) in its own process, running the same
  `generate` code (benchmarks/litserve_peer.py), closed-loop clients at c=1 and c=32;
- Fibermill end to end (Redis, API, one CPU worker), closed-loop clients at c=1 and c=32, one
  request per job (`Prefer: wait=60`).

And a mixed-length workload on gpt2-6x256: max_new_tokens uniform in 8..128 (seeded), c=32,
Fibermill end to end against static batching with `generate` (batches of 32 in arrival order,
each run to its longest budget), with the latency of the short requests (budget <= 16) under
that load against the same requests run alone.

Clients are asyncio + aiohttp in this process: they share the two cores with the servers, and
aiohttp's client takes about a quarter of httpx's CPU per request (0.55 against 2.0 ms here),
which would otherwise come out of every server's share. A model's LitServe and Fibermill servers
are up together and measured in turns, never at once (the one not taking its turn frozen with
SIGSTOP: an idle server's polling would stall the other's OpenMP team): their c=32 rounds
alternate (A B, B A, ...) with each other and with `generate` in process, as do static
batching's and Fibermill's mixed rounds, and a ratio between them is the median of the
rounds' ratios. The machine's speed drifts by a third within an hour, so a ratio
of two figures taken minutes apart says more about the hour than about the servers.
"""

import argparse
import asyncio
import heapq
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TypeVar

import aiohttp
import yaml

from benchmarks import gpt2_6x256
from benchmarks.isolated import engine_bursts, isolated, with_engine
from benchmarks.peer_servers import Server, litserve_available, litserve_server
from benchmarks.rounds import alternate, paired_median
from benchmarks.stack import bench_stack
from services.devstack.processes import frozen
from shared.settings import REPO_ROOT

FINAL = {"succeeded", "failed", "canceled"}
PROMPT = "Hello there"
BATCH = 32  # max_batch of both models, LitServe's max_batch_size, generate's batch
LITSERVE_BATCH_TIMEOUT = 0.01
MIXED_RANGE = (8, 128)
MIXED_SEED = 0
SHORT = 16  # a mixed-workload request with at most this many new tokens is "short"
T = TypeVar("T")


@dataclass(frozen=True)
class Case:
    model: str
    new_tokens: int
    load: int = 1  # c=32 runs load x Sizes.c32 requests: a fast model needs more to time
    # Intra-op threads of the model's server process, the same for LitServe's and Fibermill's
    # (FIBERMILL_CPU_THREADS) since both share the cores with their HTTP side and the clients:
    # tiny-gpt2's ops are too short to split, and one thread served it faster in both (LitServe
    # 322 against 207 req/s at c=32, Fibermill 243-276 against 148-158), while two served the
    # 6x256 model faster in LitServe (31.2 against 19.3) and alike in Fibermill. None: every
    # core. In process, generate and the engine have the machine to themselves: every core.
    threads: int | None = None


TINY = Case("tiny-gpt2", 16, load=4, threads=1)
BIG = Case(gpt2_6x256.NAME, 64)
CASES = (TINY, BIG)


@dataclass(frozen=True)
class Sizes:
    c1: int = 30  # requests at concurrency 1
    c32: int = 128  # requests at concurrency 32
    reps: int = 4  # at least this many timed batches (generate) or bursts (engine) of 32
    mixed: int = 128  # requests in the mixed-length workload
    warmup: int = 32  # untimed requests before each c=32 measurement
    # Closed-loop c=32 loads and the mixed workload run this many alternating rounds (see
    # `alternate`); the round with the median req/s is reported, and a ratio is the median of
    # the paired rounds' ratios.
    rounds: int = 5


FULL = Sizes()
MIN_SECONDS = 3.0  # in process, batches are repeated for at least this long
QUICK = Sizes(c1=5, c32=32, reps=1, mixed=32, warmup=8, rounds=1)


# Pure helpers ---------------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `xs`, interpolating linearly between the closest ranks."""
    if not xs:
        raise ValueError("percentile of no values")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ratio(a: float | None, b: float | None) -> str:
    """`a / b` as "1.23x", or "-" when either side is missing."""
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def mixed_budgets(n: int, seed: int = MIXED_SEED, lo: int = MIXED_RANGE[0],
                  hi: int = MIXED_RANGE[1]) -> list[int]:
    """`n` budgets drawn uniformly from lo..hi (inclusive); the same seed gives the same list."""
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


def continuous_bound(budgets: Sequence[int], slots: int = BATCH) -> float:
    """The most continuous batching can gain over static batching on `budgets` at equal step
    time: the steps static batches of `slots` take (each to its longest budget) over the steps
    `slots` slots take when each takes the next budget the moment it frees (a closed loop with
    no time between an answer and the next request). With few requests the last ones decode
    with few rows beside them, so this stays well below the endless stream's E[longest of
    `slots`] / E[budget]. On a CPU a step of fewer rows is cheaper, which this leaves out."""
    static = sum(max(budgets[i] for i in batch) for batch in static_batches(budgets, slots))
    free = [0] * min(slots, len(budgets))  # the step at which each slot frees
    end = 0
    for budget in budgets:
        done = heapq.heappop(free) + budget
        end = max(end, done)
        heapq.heappush(free, done)
    return static / end if end else 0.0


def static_batches(xs: Sequence[int], size: int = BATCH) -> list[list[int]]:
    """Indices of `xs` in arrival order, cut into batches of `size` (the last may be short)."""
    return [list(range(i, min(i + size, len(xs)))) for i in range(0, len(xs), size)]


@dataclass
class Load:
    """What one measurement saw: per-request latencies and generated tokens, in request order."""

    seconds: float
    latencies: list[float]
    tokens: list[int | None] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # req/s of every round, when rounds ran

    @property
    def n(self) -> int:
        return len(self.latencies)

    @property
    def rps(self) -> float:
        return self.n / self.seconds

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def mean_tokens(self) -> float | None:
        known = [t for t in self.tokens if t is not None]
        return statistics.fmean(known) if known else None


def median_round(loads: Sequence[Load]) -> Load:
    """The load with the median req/s (the lower middle of an even count), holding every
    round's req/s in run order; a single round is returned as it is."""
    if not loads:
        raise ValueError("median of no rounds")
    if len(loads) == 1:
        return loads[0]
    return _kept(sorted(loads, key=lambda load: load.rps)[(len(loads) - 1) // 2], loads)


def fastest(loads: Sequence[Load]) -> Load:
    """The load with the highest req/s, holding every sitting's req/s in run order."""
    if not loads:
        raise ValueError("fastest of no loads")
    return _kept(max(loads, key=lambda load: load.rps), loads)


def _kept(chosen: Load, loads: Sequence[Load]) -> Load:
    """`chosen`, holding the req/s of every one of `loads`."""
    return Load(chosen.seconds, chosen.latencies, chosen.tokens,
                rounds=[load.rps for load in loads])


# Registry and model files ---------------------------------------------------------------------


def write_registry(path: Path, big_dir: Path) -> Path:
    """A registry with tiny-gpt2 (as in models/registry.yaml, max_batch 32) and gpt2-6x256."""
    source = REPO_ROOT / "models" / "registry.yaml"
    tiny = dict(yaml.safe_load(source.read_text())["models"][TINY.model])
    tiny_path = Path(tiny.get("path", TINY.model))
    tiny["path"] = str(tiny_path if tiny_path.is_absolute() else source.parent / tiny_path)
    tiny["max_batch"] = BATCH
    big = {
        "kind": "causal-lm",
        "path": str(big_dir),
        "description": "GPT-2, 6 layers x 256 wide, seeded random weights (benchmarks)",
        "defaults": {"max_new_tokens": 64},
        "limits": {"max_new_tokens": 128},
        "max_batch": BATCH,
    }
    path.write_text(yaml.safe_dump({"models": {TINY.model: tiny, BIG.model: big}},
                                   sort_keys=False))
    return path


# Closed-loop clients --------------------------------------------------------------------------


async def closed_loop(send: Callable[[int], Awaitable[int | None]], budgets: Sequence[int],
                      concurrency: int) -> Load:
    """`concurrency` clients, each sending the next budget once its previous answer is in."""
    latencies: list[float] = [0.0] * len(budgets)
    tokens: list[int | None] = [None] * len(budgets)
    next_index = iter(range(len(budgets)))

    async def client() -> None:
        for i in next_index:
            t = time.perf_counter()
            tokens[i] = await send(budgets[i])
            latencies[i] = time.perf_counter() - t

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(min(concurrency, len(budgets)))))
    return Load(time.perf_counter() - t0, latencies, tokens)


def run_loads(make_send: Callable[[aiohttp.ClientSession], Callable[[int], Awaitable[int | None]]],
              base_url: str, plan: Sequence[tuple[str, Sequence[int], int, Sequence[int]]]
              ) -> dict[str, Load]:
    """Run each (name, warm-up budgets, concurrency, budgets) in turn against one server."""

    async def main() -> dict[str, Load]:
        connector = aiohttp.TCPConnector(limit=BATCH + 8)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as http:
            send = make_send(http)
            out = {}
            for name, warmup, concurrency, budgets in plan:
                if warmup:
                    await closed_loop(send, warmup, concurrency)
                out[name] = await closed_loop(send, budgets, concurrency)
            return out

    return asyncio.run(main())


async def final_job(http: aiohttp.ClientSession, job: dict) -> dict:
    """`job` once final: GET with `Prefer: wait` (a long poll), so that a job running longer
    than one wait costs a request a minute rather than ten a second (32 clients polling every
    0.1 s took 38-55 s of the API's CPU in a 110-180 s run of the Qwen-shaped model on the
    2-core machine the model runs on, 3.3-3.9 s with the long poll)."""
    while job["status"] not in FINAL:
        async with http.get(f"/v1/jobs/{job['id']}", headers={"Prefer": "wait=60"}) as r:
            r.raise_for_status()
            job = await r.json()
    return job


def fibermill_send(model: str):
    def make(http: aiohttp.ClientSession):
        async def send(budget: int) -> int | None:
            body = {"task": "text-generation", "model": model,
                    "input": {"prompts": [PROMPT], "max_new_tokens": budget}}
            async with http.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"}) as r:
                r.raise_for_status()
                job = await r.json()
            job = await final_job(http, job)
            if job["status"] != "succeeded":
                raise RuntimeError(f"job {job['id']} {job['status']}: {job.get('error')}")
            return (job.get("output") or [{}])[0].get("tokens")

        return send

    return make


def litserve_send(http: aiohttp.ClientSession):
    async def send(budget: int) -> int | None:
        async with http.post("/predict",
                             json={"prompt": PROMPT, "max_new_tokens": budget}) as r:
            r.raise_for_status()
            return (await r.json()).get("tokens")

    return send


# In process -----------------------------------------------------------------------------------


def measure_generate(model_dir: Path, new_tokens: int, reps: int) -> Load:
    """transformers `generate`: batches of 32 one-prompt requests after one warm-up, `reps` of
    them and at least MIN_SECONDS' worth (see `timed_batches`)."""
    from benchmarks import hf_generate

    model, tokenizer = hf_generate.load(model_dir)
    prompts, budgets = [PROMPT] * BATCH, [new_tokens] * BATCH
    hf_generate.generate(model, tokenizer, prompts, budgets)

    def batch() -> list[int | None]:
        return [n for _, n in hf_generate.generate(model, tokenizer, prompts, budgets)]

    return timed_batches(batch, reps)


def timed_batches(batch: Callable[[], list[int | None]], reps: int) -> Load:
    """Run `batch` (32 requests) at least `reps` times and for at least MIN_SECONDS; the Load
    has the median batch time for every batch, since on a shared 2-core machine one slow batch
    in a few would otherwise decide the figure."""
    times: list[float] = []
    tokens: list[int | None] = []
    t_start = time.perf_counter()
    while len(times) < reps or time.perf_counter() - t_start < MIN_SECONDS:
        t = time.perf_counter()
        tokens += batch()
        times.append(time.perf_counter() - t)
    return median_load(times, tokens)


def median_load(times: list[float], tokens: list[int | None]) -> Load:
    """Every batch of 32 counted at the median batch time."""
    median = statistics.median(times)
    return Load(median * len(times), [median] * (BATCH * len(times)), tokens)


def measure_static_mixed(model_dir: Path, budgets: list[int]) -> Load:
    """Static batching of the mixed workload with `generate`: batches of 32 in arrival order,
    each run to its longest budget, after a warm-up batch. A request's latency is its batch's
    time."""
    from benchmarks import hf_generate

    model, tokenizer = hf_generate.load(model_dir)
    hf_generate.generate(model, tokenizer, [PROMPT] * BATCH, [max(budgets)] * BATCH)
    latencies = [0.0] * len(budgets)
    tokens: list[int | None] = [None] * len(budgets)
    t0 = time.perf_counter()
    for batch in static_batches(budgets):
        t = time.perf_counter()
        out = hf_generate.generate(model, tokenizer, [PROMPT] * len(batch),
                                   [budgets[i] for i in batch])
        took = time.perf_counter() - t
        for i, (_, n) in zip(batch, out, strict=True):
            latencies[i], tokens[i] = took, n
    return Load(time.perf_counter() - t0, latencies, tokens)


def measure_alone(model_dir: Path, budgets: list[int]) -> Load:
    """Each budget alone with `generate` (a batch of one), after a warm-up."""
    from benchmarks import hf_generate

    model, tokenizer = hf_generate.load(model_dir)
    hf_generate.generate(model, tokenizer, [PROMPT], [budgets[0]])
    latencies: list[float] = []
    tokens: list[int | None] = []
    t0 = time.perf_counter()
    for b in budgets:
        t = time.perf_counter()
        tokens.append(hf_generate.generate(model, tokenizer, [PROMPT], [b])[0][1])
        latencies.append(time.perf_counter() - t)
    return Load(time.perf_counter() - t0, latencies, tokens)


def measure_engine_mixed(registry: Path, budgets: list[int]) -> Load:
    """The mixed workload on Fibermill's engine fed directly (isolated.with_engine): the same
    32 closed-loop clients awaiting the engine, no HTTP, Redis or Celery between them, after a
    warm-up pass of 32 requests."""
    from shared.messages import TextItem
    from shared.registry import ModelRegistry

    spec = ModelRegistry.load(registry).get(BIG.model)

    async def main(engine) -> Load:
        async def send(budget: int) -> int:
            return (await engine.submit(TextItem(prompt=PROMPT, max_new_tokens=budget))).tokens

        await closed_loop(send, budgets[:BATCH], BATCH)
        return await closed_loop(send, budgets, BATCH)

    return with_engine(spec, main)


def measure_engine(registry: Path, model: str, new_tokens: int, reps: int) -> Load:
    """Fibermill's engine fed directly (isolated.engine_bursts): bursts of 32 items, at least
    `reps` of them and MIN_SECONDS' worth. A request's latency is its burst's."""
    from shared.messages import TextItem
    from shared.registry import ModelRegistry

    spec = ModelRegistry.load(registry).get(model)
    item = TextItem(prompt=PROMPT, max_new_tokens=new_tokens)
    bursts = engine_bursts(spec, item, BATCH, reps, MIN_SECONDS)
    return median_load(bursts.times, [getattr(r, "tokens", None) for r in bursts.results])


# The run --------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def paired_ratio(a: Load | None, b: Load | None) -> float | None:
    """The median over rounds of `a`'s req/s over `b`'s, round i with round i (they ran side by
    side, see `alternate`); without paired rounds, the ratio of the two loads."""
    if a is None or b is None:
        return None
    if a.rounds and len(a.rounds) == len(b.rounds):
        return paired_median(a.rounds, b.rounds)
    return a.rps / b.rps if b.rps else None


def run(sizes: Sizes = FULL) -> dict:
    """Every measurement, in one run. Keys: (model, contender) -> Load, "mixed" -> {...}."""
    out: dict = {"sizes": sizes, "errors": []}
    budgets = mixed_budgets(sizes.mixed)
    out["mixed_budgets"] = budgets
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fibermill-peers-") as tmp_name:
        tmp = Path(tmp_name)
        big_dir = gpt2_6x256.build(tmp / BIG.model)
        registry = write_registry(tmp / "registry.yaml", big_dir)
        dirs = {TINY.model: REPO_ROOT / "models" / TINY.model, BIG.model: big_dir}

        def in_process(when: str) -> None:
            """generate and the engine in process, at the start and again at the end of the
            run, with no server up; each is reported by its faster sitting (the machine's
            speed drifts over a run, and the limit is what it could do)."""
            for case in CASES:
                n = case.new_tokens
                for key, measure, args in (
                        ("generate", measure_generate, (dirs[case.model], n, sizes.reps)),
                        ("engine", measure_engine, (registry, case.model, n, sizes.reps))):
                    _log(f"{case.model}: {key} in process ({when})")
                    keep_faster((case.model, key), isolated(measure, *args))
            _log(f"mixed workload: engine in process ({when})")
            keep_faster(("mixed", "engine"), isolated(measure_engine_mixed, registry, budgets))

        def keep_faster(key: tuple[str, str], load: Load) -> None:
            earlier = out.get(key)
            out[key] = load if earlier is None else fastest([earlier, load])

        in_process("start")
        if not litserve_available():
            out["errors"].append("LitServe is not installed (pip install -e '.[bench]')")
        # One stack per model, as LitServe serves one: a worker serving both would run two
        # device threads, each with its own OpenMP team on the same two cores.
        for case in CASES:
            env = {"FIBERMILL_MODEL_REGISTRY": str(registry), "FIBERMILL_CPU_WORKERS": "1"}
            with bench_stack(case.model, threads=case.threads, env=env, logdir=tmp) as st:
                stack = Server(st.url, st.procs)
                _serve(case, dirs[case.model], tmp, stack, sizes, out)
                if case is BIG:
                    _mixed(big_dir, stack, budgets, sizes, out)
        in_process("end")
    out["seconds"] = time.perf_counter() - t_start
    return out


def _turn(run: Callable[[], T], idle: Sequence[Server]) -> Callable[[], T]:
    """`run`, with the servers in `idle` frozen while it runs (processes.frozen says why)."""
    def turn() -> T:
        with frozen([proc for server in idle for proc in server.procs]):
            return run()

    return turn


def _serve(case: Case, model_dir: Path, tmp: Path, stack: Server, sizes: Sizes,
           out: dict) -> None:
    """c=1 and c=32 against LitServe and the Fibermill `stack`, both up together and measured
    in turns (the one frozen while the other runs), the c=32 rounds alternating with each
    other and with sittings of `generate` in process (both servers frozen)."""
    n = case.new_tokens
    c32 = [n] * sizes.c32 * case.load

    def c32_round(send, url: str) -> Callable[[], Load]:
        return lambda: run_loads(send, url, [("c32", [], BATCH, c32)])["c32"]

    with ExitStack() as servers:
        contenders = [("fibermill", fibermill_send(case.model), stack)]
        if litserve_available():
            try:
                litserve = servers.enter_context(litserve_server(
                    model_dir, tmp, BATCH, LITSERVE_BATCH_TIMEOUT, case.threads))
                contenders.append(("litserve", litserve_send, litserve))
            except Exception as exc:  # report it and go on with Fibermill
                out["errors"].append(f"LitServe on {case.model}: {exc!r}")
        up = [server for _, _, server in contenders]
        for key, send, server in contenders:
            _log(f"{case.model}: {key} c=1, c=32 warm-up")
            others = [s for s in up if s is not server]
            loads = _turn(partial(run_loads, send, server.url, [
                ("c1", [n] * 3, 1, [n] * sizes.c1),
                ("warm", [], BATCH, [n] * sizes.warmup)]), others)()
            out[(case.model, f"{key} c1")] = loads["c1"]
        turns = [_turn(c32_round(send, server.url), [s for s in up if s is not server])
                 for _, send, server in contenders]
        turns.append(_turn(lambda: isolated(measure_generate, model_dir, n, sizes.reps), up))
        _log(f"{case.model}: c=32, {sizes.rounds} alternating rounds")
        rounds = alternate(sizes.rounds, turns)
        keys = [k for k, _, _ in contenders] + ["generate"]
        for key, sittings in zip(keys, rounds, strict=True):
            out[(case.model, f"{key} c32")] = median_round(sittings)


def _mixed(big_dir: Path, stack: Server, budgets: list[int], sizes: Sizes, out: dict) -> None:
    """The mixed-length workload: static batching with `generate` (each round in a fresh
    interpreter, the stack frozen) and the `stack`, rounds alternating; then the short
    requests alone on both."""
    _log(f"mixed workload: {sizes.rounds} alternating rounds, static generate and Fibermill")
    send = fibermill_send(BIG.model)
    run_loads(send, stack.url, [("warm", [], BATCH, budgets[: sizes.warmup])])
    static, mixed = alternate(sizes.rounds, [
        _turn(lambda: isolated(measure_static_mixed, big_dir, budgets), [stack]),
        lambda: run_loads(send, stack.url, [("mixed", [], BATCH, budgets)])["mixed"]])
    out[("mixed", "generate")] = median_round(static)
    out[("mixed", "fibermill")] = median_round(mixed)
    shorts = [b for b in budgets if b <= SHORT]
    if shorts:
        out[("mixed", "generate alone")] = _turn(
            lambda: isolated(measure_alone, big_dir, shorts), [stack])()
        out[("mixed", "fibermill alone")] = run_loads(
            send, stack.url, [("alone", shorts[:1], 1, shorts)])["alone"]


# The report -----------------------------------------------------------------------------------


def _cells(load: Load | None) -> str:
    if load is None:
        return "- | - | - | - | -"
    tokens = load.mean_tokens
    return (f"{load.n} | {load.rps:.1f} | {load.p50 * 1000:.1f} | "
            f"{'-' if tokens is None else f'{tokens:.0f}'} | {_rounds(load)}")


def _rounds(load: Load) -> str:
    return ", ".join(f"{x:.1f}" for x in load.rounds) if load.rounds else "-"


def _pairs(a: Load | None, b: Load | None) -> str:
    """Round i of `a` over round i of `b`, for every round both ran."""
    if a is None or b is None or not a.rounds or len(a.rounds) != len(b.rounds):
        return "-"
    return ", ".join(f"{x / y:.2f}" for x, y in zip(a.rounds, b.rounds, strict=True))


def _short_p50(load: Load | None, budgets: Sequence[int]) -> float | None:
    if load is None:
        return None
    xs = [lat for lat, b in zip(load.latencies, budgets, strict=True) if b <= SHORT]
    return percentile(xs, 0.5) if xs else None


def _stream_bound(slots: int = BATCH, lo: int = MIXED_RANGE[0], hi: int = MIXED_RANGE[1]
                  ) -> float:
    """E[longest of `slots` budgets] / E[budget] for budgets uniform in lo..hi: what
    continuous batching gains on an endless stream at equal step time."""
    values = range(lo, hi + 1)
    span = len(values)
    longest = sum(v * (((v - lo + 1) / span) ** slots - ((v - lo) / span) ** slots)
                  for v in values)
    return longest / statistics.fmean(values)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def report(r: dict, header: bool = False, machine: str | None = None) -> list[str]:
    """The peers section as markdown lines (with the machine and date when `header`)."""
    sizes: Sizes = r["sizes"]
    lines = ["## Peers: plain `generate` and LitServe beside Fibermill", ""]
    if header:
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines += [f"Machine: {machine or 'unknown'}. Date: {when}.", ""]
    lines += [
        "Produced by benchmarks/peers.py, every figure in the same run. One-prompt",
        f"requests (\"{PROMPT}\"), greedy, every row making its full budget; batches of at most",
        f"{BATCH} everywhere (the registry's max_batch, LitServe's max_batch_size with a "
        f"{LITSERVE_BATCH_TIMEOUT * 1000:.0f} ms",
        "batch timeout). generate: transformers `generate` in process, batches of 32, left",
        "padding. Engine: Fibermill's worker engine fed directly, bursts of 32 announced through",
        "`Engine.arrival`. LitServe runs the same `generate` code in its own process. Fibermill:",
        "Redis, API and one CPU worker, one request per job (`Prefer: wait=60`). c=N: N",
        "closed-loop clients (asyncio + aiohttp), each sending its next request when its answer",
        "is in. In process, a request's latency is its batch's (or burst's) time. gpt2-6x256 is",
        "GPT-2 with 6 layers x 256 wide (4 heads, tiny-gpt2's 1000-token vocabulary), seeded",
        "random weights built at run time. Intra-op threads of the servers (LitServe's and",
        "Fibermill's alike): " + ", ".join(
            f"{c.model} {c.threads or 'every core'}" for c in CASES) + " (Case.threads says why);",
        "in process, every core.",
        "",
    ]
    rows = [("transformers `generate`, batches of 32, in process, best sitting", "generate"),
            ("transformers `generate`, the same, in turns with the servers", "generate c32"),
            ("Fibermill engine, bursts of 32, in process", "engine"),
            ("LitServe, c=1", "litserve c1"), ("LitServe, c=32", "litserve c32"),
            ("Fibermill end to end, c=1", "fibermill c1"),
            ("Fibermill end to end, c=32", "fibermill c32")]
    for case in CASES:
        lines += [f"{case.model}, {case.new_tokens} new tokens:", "",
                  "| contender | requests | req/s | p50 (ms) | tokens/req | rounds (req/s) |",
                  "|---|---|---|---|---|---|"]
        for label, key in rows:
            lines.append(f"| {label} | {_cells(r.get((case.model, key)))} |")
        lines.append("")

    def rps(model: str, key: str) -> float | None:
        load = r.get((model, key))
        return None if load is None else load.rps

    def p50(model: str, key: str) -> float | None:
        load = r.get((model, key))
        return None if load is None else load.p50

    lines += ["Ratios (req/s over req/s; for latency, Fibermill's p50 over LitServe's, lower is",
              "better for Fibermill):", "",
              "| ratio | " + " | ".join(c.model for c in CASES) + " |",
              "|---|" + "---|" * len(CASES)]
    ratios = [
        ("Fibermill c=32 / generate (median of paired rounds)",
         lambda m: ratio(paired_ratio(r.get((m, "fibermill c32")), r.get((m, "generate c32"))),
                         1.0)),
        ("the paired rounds' ratios", lambda m: _pairs(r.get((m, "fibermill c32")),
                                                       r.get((m, "generate c32")))),
        ("Fibermill c=32 / LitServe c=32 (median of paired rounds)",
         lambda m: ratio(paired_ratio(r.get((m, "fibermill c32")), r.get((m, "litserve c32"))),
                         1.0)),
        ("the paired rounds' ratios", lambda m: _pairs(r.get((m, "fibermill c32")),
                                                       r.get((m, "litserve c32")))),
        ("engine in process / generate", lambda m: ratio(rps(m, "engine"), rps(m, "generate"))),
        ("c=1 p50, Fibermill / LitServe",
         lambda m: ratio(p50(m, "fibermill c1"), p50(m, "litserve c1"))),
    ]
    for label, cell in ratios:
        lines.append(f"| {label} | " + " | ".join(cell(c.model) for c in CASES) + " |")

    budgets = r["mixed_budgets"]
    n_short = sum(1 for b in budgets if b <= SHORT)
    lo, hi = MIXED_RANGE
    lines += ["", f"Mixed lengths on {BIG.model}: {len(budgets)} requests, max_new_tokens uniform "
              f"in {lo}..{hi} (seed {MIXED_SEED}, {sum(budgets)} tokens in all), {n_short} short "
              f"(<= {SHORT}).",
              "generate: static batches of 32 in arrival order, each padded to its longest "
              "budget. Fibermill: end to end,",
              "c=32 closed loop; its engine in process: the same 32 closed-loop clients awaiting "
              "the engine directly (faster",
              "sitting of the run's start and end). Short alone: the same short requests one at a "
              "time (generate: a batch of",
              "one; Fibermill: c=1).", "",
              "| contender | req/s | useful tokens/s | short p50 under load (ms) | "
              "short p50 alone (ms) | under load / alone | rounds (req/s) |",
              "|---|---|---|---|---|---|---|"]
    for label, key in (("transformers `generate`, static batches of 32", "generate"),
                       ("Fibermill engine, in process, c=32", "engine"),
                       ("Fibermill end to end, c=32", "fibermill")):
        load, alone = r.get(("mixed", key)), r.get(("mixed", f"{key} alone"))
        if load is None:
            lines.append(f"| {label} | - | - | - | - | - | - |")
            continue
        under = _short_p50(load, budgets)
        alone_p50 = alone.p50 if alone is not None and alone.n else None
        lines.append(f"| {label} | {load.rps:.1f} | {sum(budgets) / load.seconds:.0f} | "
                     f"{_ms(under)} | {_ms(alone_p50)} | {ratio(under, alone_p50)} | "
                     f"{_rounds(load)} |")
    g, f = r.get(("mixed", "generate")), r.get(("mixed", "fibermill"))
    mixed_ratio = ratio(paired_ratio(f, g), 1.0)
    engine = r.get(("mixed", "engine"))
    lines += ["", f"Mixed-length throughput, Fibermill / static `generate` (median of paired "
              f"rounds): {mixed_ratio}; the rounds' ratios: {_pairs(f, g)}. The engine in "
              f"process / static `generate`: {ratio(engine and engine.rps, g and g.rps)}. "
              f"The most continuous batching can gain on these {len(budgets)} requests at "
              f"equal step time (`continuous_bound`: the last requests decode with few rows "
              f"beside them): {continuous_bound(budgets):.2f}x; on an endless stream of such "
              f"budgets, about {_stream_bound():.2f}x."]
    lines += ["", f"Requests per measurement: c=1 {sizes.c1}, c=32 {sizes.c32} x the model's "
              f"load factor ({', '.join(f'{c.model} {c.load}' for c in CASES)}; after "
              f"{sizes.warmup} warm-up). A model's LitServe and Fibermill (Redis, API, worker: "
              f"a stack of its own per model) are up together and measured in turns, the "
              f"ones not taking their turn frozen (SIGSTOP): "
              f"{sizes.rounds} c=32 rounds each, alternating with each other and with a sitting "
              f"of `generate` in process (A B C, C B A, ...), as are static "
              f"batching's mixed rounds (each in a fresh interpreter) and "
              f"Fibermill's; the round with the median req/s is reported (its latencies too), "
              f"and a ratio between contenders that ran in turns is the median of their rounds' "
              f"ratios. In process (generate's best sitting, the engine): measured at the "
              f"start and at the end of the run with no server up, the faster sitting "
              f"reported; after warm-up (generate: one batch; the engine: three bursts), "
              f"batches of {BATCH} repeated at least {sizes.reps} times and for "
              f"at least {MIN_SECONDS:g} s, each counted at the median batch time, and each "
              f"contender in a fresh interpreter of its own. The peers section took "
              f"{r.get('seconds', 0):.0f} s."]
    for err in r.get("errors", []):
        lines += ["", f"Not measured: {err}"]
    return lines


def main() -> None:
    from benchmarks.machine import machine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run (few requests)")
    ap.add_argument("--out", type=Path, help="also write the report to this file")
    args = ap.parse_args()
    lines = report(run(QUICK if args.quick else FULL), header=True, machine=machine())
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
