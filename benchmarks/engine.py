"""Engine benchmarks for `make bench`: batching on / off, end to end / in-process, pool health.

Each figure is a ratio of two measurements taken in the same run on the same machine:
- throughput of a burst of one-prompt jobs through a real stack with batching on, over the same
  burst with batching off (`FIBERMILL_BATCHING=false`: every sub-request a batch of one);
- the end-to-end throughput over the same burst run in-process through the same engine (batcher
  and operator graph), without HTTP, Redis or Celery: what the queue costs;
  every throughput is the median of `ROUNDS` bursts after a warm-up one; in process, each model
  is measured in a fresh interpreter (`isolated` says why), with one intra-op
  thread and with every core, the faster kept: the limit the stack is held to;
- after warm-up, p99/p50 text job latency and ad-hoc image buffer leases (goal 0) under
  steady load.
"""

import asyncio
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import httpx

from benchmarks.isolated import engine_bursts, isolated
from benchmarks.rounds import alternate, paired_median
from benchmarks.stack import BenchStack, bench_stack
from services.devstack.processes import frozen

FINAL = {"succeeded", "failed", "canceled"}
ROUNDS = 3  # timed bursts per figure, after a warm-up one; the median is reported
MIN_SECONDS = 3.0  # in process, bursts are repeated for at least this long
# Intra-op threads of the stack's worker, per model (None: every core). tiny-gpt2's and
# tiny-sd's ops are too short to split while the API, Redis and the load generator share the
# two cores: one thread served tiny-sd bursts faster (86 against 46-52 jobs/s), as it did
# tiny-gpt2 (peers.Case.threads); digits' batches of 16 are worth both cores (9.1-10.2
# against 7.5). Models with the same setting share a stack.
STACK_THREADS = {"tiny-gpt2": 1, "tiny-sd": 1, "digits": None}


def run_job(http: httpx.Client, body: dict) -> float:
    t0 = time.perf_counter()
    # One request per job (the API answers when the job is final): a client polling from 32
    # threads would take the CPU the stack runs on.
    job = http.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"}).json()
    while job["status"] not in FINAL:
        time.sleep(0.05)
        job = http.get(f"/v1/jobs/{job['id']}").json()
    assert job["status"] == "succeeded", job
    return time.perf_counter() - t0


async def _run_job_async(http: aiohttp.ClientSession, body: dict) -> None:
    async with http.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"}) as r:
        job = await r.json()
    while job["status"] not in FINAL:
        await asyncio.sleep(0.05)
        async with http.get(f"/v1/jobs/{job['id']}") as r:
            job = await r.json()
    assert job["status"] == "succeeded", job


class BurstClient:
    """Bursts of jobs from one asyncio client on aiohttp (which takes less of the CPU the
    stack runs on than httpx does; peers.py measures its loads the same way), its session
    kept open on an event loop of its own between bursts, so other work can run in turns."""

    def __init__(self, base_url: str, n: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.session = self.loop.run_until_complete(self._open(base_url, n))

    @staticmethod
    async def _open(base_url: str, n: int) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(base_url, connector=aiohttp.TCPConnector(limit=n),
                                     timeout=aiohttp.ClientTimeout(total=120))

    def burst(self, body: dict, n: int) -> float:
        """Jobs per second for `n` jobs submitted at once."""
        async def once() -> float:
            t0 = time.perf_counter()
            await asyncio.gather(*(_run_job_async(self.session, body) for _ in range(n)))
            return time.perf_counter() - t0

        return n / self.loop.run_until_complete(once())

    def settle(self, seconds: float = 0.5) -> None:
        """Run the client's loop for a moment, so that connections the server closed while
        nothing ran it (a thawed server's keep-alive timers ran on through its freeze, and
        fire at once) are seen closed and not reused: a burst sent on one fails with
        ServerDisconnectedError."""
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def __enter__(self) -> "BurstClient":
        return self

    def __exit__(self, *exc) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.close()


def burst(http: httpx.Client, body: dict, n: int) -> float:
    """Jobs per second for `n` jobs submitted at once, the median of ROUNDS bursts after a
    warm-up one."""
    with BurstClient(str(http.base_url), n) as client:
        client.burst(body, n)
        return statistics.median(client.burst(body, n) for _ in range(ROUNDS))


def paired(st: BenchStack, body: dict, n: int, model: str, item, threads: int | None
           ) -> tuple[list[float], list[float]]:
    """Bursts through the stack and sittings of the engine in process (a fresh interpreter,
    the stack frozen: processes.frozen says why) in alternating rounds, after a warm-up burst:
    jobs/s of each, by round."""

    with BurstClient(st.url, n) as client:
        def sitting() -> float:
            with frozen(st.procs):
                rate = isolated(_in_process, model, item, n, threads)
            client.settle()
            return rate

        client.burst(body, n)
        stack_rates, in_process_rates = alternate(ROUNDS, [lambda: client.burst(body, n),
                                                           sitting])
    return stack_rates, in_process_rates


def in_process(model: str, item, n: int) -> tuple[float, int | None]:
    """Jobs per second for `n` items submitted at once to the engine in process, and the
    intra-op threads that gave it: the faster of one and every core (None), each in a fresh
    interpreter."""
    rates = {threads: isolated(_in_process, model, item, n, threads) for threads in (1, None)}
    best = max(rates, key=lambda threads: rates[threads])
    return rates[best], best


def _in_process(model: str, item, n: int, threads: int | None) -> float:
    """Jobs per second: the median of bursts of `n` items (at least ROUNDS of them and
    MIN_SECONDS' worth) after three warm-up bursts."""
    from shared.registry import load_registry
    from shared.settings import get_settings

    spec = load_registry(get_settings().model_registry).get(model)
    return n / statistics.median(engine_bursts(spec, item, n, ROUNDS, MIN_SECONDS, threads).times)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def mean_batch(before: str, after: str, model: str) -> float:
    """The model's mean batch size over the batches run between two scrapes (0 for none)."""
    count = (metric(after, "fibermill_batch_size_count", model=model)
             - metric(before, "fibermill_batch_size_count", model=model))
    total = (metric(after, "fibermill_batch_size_sum", model=model)
             - metric(before, "fibermill_batch_size_sum", model=model))
    return total / count if count > 0 else 0.0


def steady(http: httpx.Client, body: dict, clients: int, n: int) -> list[float]:
    with ThreadPoolExecutor(clients) as pool:
        return sorted(pool.map(lambda _: run_job(http, body), range(n)))


def percentile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def text_body() -> dict:
    return {"task": "text-generation", "model": "tiny-gpt2",
            "input": {"prompts": ["Hello there"], "max_new_tokens": 16}}


def image_body() -> dict:
    return {"task": "image-generation", "model": "tiny-sd",
            "input": {"prompts": ["a red cube"], "width": 64, "height": 64, "steps": 4,
                      "seed": 1}}


def digits_body() -> dict:
    return {"task": "image-generation", "model": "digits",
            "input": {"prompts": ["7"], "steps": 50, "seed": 1}}


def run(n: int = 32, steady_jobs: int = 600) -> dict:
    from shared.messages import ImageItem, TextItem

    cases = {
        "text": ("tiny-gpt2", text_body(), TextItem(prompt="Hello there", max_new_tokens=16)),
        "image": ("tiny-sd", image_body(),
                  ImageItem(prompt="a red cube", width=64, height=64, steps=4, seed=1,
                            guidance_scale=7.5)),
        # A model that takes longer per item, to show where the end-to-end ratio goes when the
        # model, not the queue path, dominates (batching on only: off would take minutes).
        "digits": ("digits", digits_body(),
                   ImageItem(prompt="7", width=16, height=16, steps=50, seed=1,
                             guidance_scale=2.0, class_label=7)),
    }
    only_on = {"digits"}
    out: dict = {"n": n}
    # In process, the faster of one intra-op thread and every core, chosen before the stacks.
    for name, (model, _, item) in cases.items():
        out[(name, "in-process threads")] = in_process(model, item, n)[1]
    groups: dict[int | None, list[str]] = {}
    for name, (model, _, _) in cases.items():
        groups.setdefault(STACK_THREADS[model], []).append(name)
    for batching in (False, True):
        for threads, names in groups.items():
            here = [x for x in names if batching or x not in only_on]
            if not here:
                continue
            models = ",".join(cases[x][0] for x in here)
            with (bench_stack(models, batching, threads) as st,
                  httpx.Client(base_url=st.url, timeout=120) as http):
                metrics_url = st.metrics_url
                for name in here:
                    model, body, item = cases[name]
                    before = scrape(metrics_url)
                    if batching:
                        rates = paired(st, body, n, model, item,
                                       out[(name, "in-process threads")])
                        out[(name, True)] = statistics.median(rates[0])
                        out[(name, "in-process")] = statistics.median(rates[1])
                        out[(name, "paired")] = paired_median(*rates)
                    else:
                        out[(name, False)] = burst(http, body, n)
                    after = scrape(metrics_url)
                    out[(name, batching, "batch")] = mean_batch(before, after, model)
                if batching and "text" in here and "image" in here:
                    out["steady"] = steady_load(http, metrics_url, cases["text"][1],
                                                cases["image"][1], steady_jobs)
    return out


def steady_load(http: httpx.Client, metrics_url: str, text: dict, image: dict,
                jobs: int) -> dict:
    """Text job latency under steady load from 4 clients, and the image pool's leases under
    the same kind of load (text decodes in fixed cache slots: it leases nothing)."""
    steady(http, text, 4, 20)  # warm-up
    lat = steady(http, text, 4, jobs)
    steady(http, image, 4, 20)
    before = scrape(metrics_url)
    steady(http, image, 4, jobs // 3)
    after = scrape(metrics_url)

    def leases(outcome: str) -> float:
        return (metric(after, "fibermill_buffer_leases_total", outcome=outcome)
                - metric(before, "fibermill_buffer_leases_total", outcome=outcome))

    return {"jobs": jobs, "image_jobs": jobs // 3, "clients": 4,
            "p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99),
            "adhoc": leases("adhoc"), "pooled": leases("pooled")}


def _threads(threads: int | None) -> str:
    return "every core" if threads is None else f"{threads}"


def report(r: dict) -> list[str]:
    n = r["n"]
    lines = [
        f"Engine, {n} one-prompt jobs submitted at once (jobs/s; ratios from the same run):", "",
        "| model | stack threads | batching off | batching on | mean batch | on / off "
        "| in-process (threads) | end to end / in-process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, model, label in (("text", "tiny-gpt2", "tiny-gpt2, 16 new tokens"),
                               ("image", "tiny-sd", "tiny-sd, 64x64, 4 steps"),
                               ("digits", "digits", "digits, 16x16, 50 steps")):
        on, inproc = r[(name, True)], r[(name, "in-process")]
        off = r.get((name, False))
        off_cells = f"{off:.1f}" if off else "-"
        ratio = f"{on / off:.2f}x" if off else "-"
        lines.append(f"| {label} | {_threads(STACK_THREADS[model])} | {off_cells} | {on:.1f} | "
                     f"{r[(name, True, 'batch')]:.1f} | {ratio} | {inproc:.1f} "
                     f"({_threads(r[(name, 'in-process threads')])}) | "
                     f"{r.get((name, 'paired'), on / inproc):.2f}x |")
    lines += [
        "",
        "For text, batching off means one cache slot (every sub-request decoded alone) and the",
        "mean batch is the rows prefilled together; they then decode continuously beside others.",
        "In-process is the same engine (batcher or decoder, pools) fed directly: no HTTP,",
        "Redis or Celery; each sitting in a fresh interpreter, after three warm-up bursts, with",
        "the faster of one intra-op thread and every core (chosen before the stacks run), in",
        "turns with the stack's bursts (stack, in process; in process, stack; ...: the machine's",
        "speed drifts), and end to end / in-process is the median of the rounds' ratios (the",
        "stack is frozen, SIGSTOP, while the engine runs in process). End to end, the API, Redis,",
        "the load generator and the model share the machine's cores (the stack's threads per",
        "model: STACK_THREADS says why); with a model this small the per-job cost of the queue",
        "path (HTTP, Celery publish, leases, results, joining) is what the ratio measures.",
        f"Every figure is the median of {ROUNDS} bursts or sittings (a sitting: the median of",
        f"at least {ROUNDS} bursts and {MIN_SECONDS:g} s' worth) after a warm-up burst.",
    ]
    s = r["steady"]
    lines += ["", f"Steady load from {s['clients']} clients, after warm-up: latency of "
              f"{s['jobs']} tiny-gpt2 jobs, buffer leases of {s['image_jobs']} tiny-sd jobs:", "",
              "| text p50 (s) | text p99 (s) | p99 / p50 | image ad-hoc leases | "
              "image pooled leases |",
              "|---|---|---|---|---|",
              f"| {s['p50']:.3f} | {s['p99']:.3f} | {s['p99'] / s['p50']:.2f} | "
              f"{s['adhoc']:.0f} | {s['pooled']:.0f} |"]
    return lines


if __name__ == "__main__":
    print("\n".join(report(run())))
