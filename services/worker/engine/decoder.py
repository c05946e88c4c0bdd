"""Continuous (iteration-level) batching for causal language models.

The decoder is a `Scheduling` (scheduling.py): it drives model code the text pipeline offers
(`StepModel`, model_code.py) and knows nothing else of it. One decoder per text engine runs
rows of any age together. Between iterations it admits waiting items (their prompts are
prefilled together and join the running rows' step) and retires every row that ended (EOS, a
stop string, its own budget, or asked to stop), settling its sub-request there and then.
`max_batch` caps the running rows; the KV cache is one pool of pages (`PagedCache`), handed
to rows as they grow. An item is admitted when the pool has the pages for its prompt and its
next steps, else it waits; nothing is allocated past the pool. A running row that needs a page
when none is free makes room: the youngest rows give theirs back and go to the front of the
queue, to be prefilled again later from their prompt and the tokens they made, their draws
continuing where they were (so their tokens do not change).

An iteration, on the model's device thread:

    admit (prefill the new rows) -> up to `STEPS_PER_READ` decode steps (fewer when an item
    arriving for a free slot would wait long for the rest: `_joins_sooner`) -> one read of
    the tokens made (the only host read, counted in `sync`) -> push them through each row's
    EOS / stop / budget rules on the host -> tell each row's `on_text` hook what it has now
    (text_stream.py) -> retire the rows that ended

Rows never take more steps than the smallest budget left among them, so no row runs past its
budget and its cache columns always fit. Greedy rows give `generate`'s tokens, sampled rows
their own seeded stream: a row's tokens do not depend on its neighbours or on when it joined.
Only floating-point rounding can tell: the kernels' results for a row differ in the last bits
with the batch's shapes (how many rows, how long a window; at most 3e-7 in tiny-gpt2's
logits), so a seeded draw landing within that of the boundary between two tokens would pick
the other one. The tests' draws lie at least 1e-5 from a boundary, and staggered arrivals
give every row (2,400 of them, 827 sampled) exactly its tokens alone.
"""

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import torch

from services.worker import metrics
from services.worker.engine import device_faults, sync
from services.worker.engine.batch import Batch
from services.worker.engine.decoder_rows import Running, Settle, Waiting
from services.worker.engine.grammar_mask import apply_masks, fill_masks, new_bitmask
from services.worker.engine.grammar_row import RowMatcher
from services.worker.engine.growth import GrowthEstimate
from services.worker.engine.model_code import StepModel
from services.worker.engine.prefix_pages import page_digests
from services.worker.engine.results import Result, TextResult
from services.worker.engine.run_stops import RunStops
from services.worker.engine.scheduling import PLAIN, Ticket
from services.worker.engine.settle import settle
from services.worker.engine.start import OnStart, announce_start
from services.worker.engine.stopped import PipelineStopped
from services.worker.engine.text_cache import PAGE_TOKENS, pages_for
from services.worker.engine.text_rows import Score, Sequence
from services.worker.engine.text_sampling import N_PARAMS, params_of, pick, uniforms_of
from services.worker.engine.text_stream import OnText, TextUpdate
from shared.messages import MAX_TOP_LOGPROBS, FinishReason

log = logging.getLogger(__name__)

# Decode steps between two reads of the tokens: a row that ended waits at most this many
# steps to retire, and an arrival to join (`_joins_sooner` ends an iteration early for it).
STEPS_PER_READ = 4
# An arrival for a free slot ends the iteration after the step under way when the rest of the
# iteration would take at least this long: about what an extra iteration costs the host
# (its read, its pass through the event loop, a prefill of fewer rows).
JOIN_SOONER_S = 0.002


class Decoder:
    def __init__(self, model: StepModel, slots: int, max_wait_s: float,
                 on_start: OnStart | None = None) -> None:
        """`on_start` hears the tags of the items about to start on the device, before they
        start (start.py)."""
        self.p = model
        self.slots = slots
        self.max_wait_s = max_wait_s
        self._pages_gauge = metrics.KV_PAGES_USED.labels(model.spec.name)
        self._tokens_gauge = metrics.KV_TOKENS.labels(model.spec.name)
        # Made on the device thread, the only one that runs the model's torch work: on the
        # CPU each thread that runs torch ops gets an OpenMP team of its own, and with these
        # made on the event loop's thread a burst of 32 tiny-gpt2 rows took 2.6x as long
        # (pipelines/base.py `setup` says the same of loading).
        model.device_executor.submit(self._allocate).result()
        self.admitted = 0  # rows admitted so far: a row's `order`
        # Rows a free row slot was there for that wait for pages (the last admission's count),
        # and rows to go back to the front of the queue after the iteration (held back or
        # preempted on the device thread; the queue belongs to the loop).
        self.short_of_pages = 0
        self.returned: list[Waiting] = []
        self.growth = GrowthEstimate()
        self.waiting: deque[Waiting] = deque()
        self.running: list[Running] = []
        self.expected = 0  # sub-requests on their way (taken from the queue, not yet here)
        self.rounds = 0  # stop-hook rounds so far (one per prefill or decode step)
        # A decode step's time, read included (on a GPU the read waits for the device), as
        # the last iteration measured it.
        self.step_seconds = 0.0
        self.on_start = on_start
        self._task: asyncio.Task | None = None
        # Set by every pump (an arrival, a withdrawal, an announced arrival that will not
        # come): ends a burst wait at once instead of polling for it.
        self._woken = asyncio.Event()

    def _allocate(self) -> None:
        slots, device = self.slots, self.p.device
        self.cache = self.p.kv_cache(slots)
        self.next_ids = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        self.made = torch.zeros(slots, dtype=torch.long, device=device)  # tokens per row
        self.params = torch.zeros((N_PARAMS, slots), dtype=torch.float32, device=device)
        self.uniforms = torch.zeros((slots, self.cache.length), dtype=torch.float32,
                                    device=device)
        self.tokens = torch.zeros((STEPS_PER_READ + 1, slots), dtype=torch.long, device=device)
        self.tokens_host = sync.pinned((STEPS_PER_READ + 1, slots), torch.long, device)
        # Key positions of a decode step's window: a row attends to those up to its own.
        self.window = torch.arange(self.cache.row_pages * PAGE_TOKENS, device=device)
        # An iteration with a row that asked for log-probabilities reads, in place of the
        # tokens, each step's and row's token, its log-probability and the alternatives' ids
        # and log-probabilities, in one float64 tensor (token ids are exact in it): still
        # one host read.
        width = 2 + 2 * MAX_TOP_LOGPROBS
        self.scores = torch.zeros((STEPS_PER_READ + 1, slots, width), dtype=torch.float64,
                                  device=device)
        self.scores_host = sync.pinned((STEPS_PER_READ + 1, slots, width), torch.float64,
                                       device)
        self.scoring: int | None = None  # alternatives this iteration scores; None: none
        # The grammar masks of rows under a `response_format`, filled on a thread of their
        # own: made with the first such row.
        self._bitmask: torch.Tensor | None = None
        self._mask_thread: ThreadPoolExecutor | None = None

    # Event loop side -----------------------------------------------------------------------

    def submit(self, item: Any, ticket: Ticket = PLAIN) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.append(Waiting(item, ticket.should_stop, future, loop,
                                    withdrawn=ticket.withdrawn, isolate=ticket.isolate,
                                    tag=ticket.tag, charged=ticket.charged,
                                    on_text=ticket.on_text, cache_scope=ticket.cache_scope,
                                    on_batch=ticket.on_batch))
        self.pump()
        return future

    async def run_together(self, batch: Batch) -> list[Result]:
        """Run a batch's items through the decoder together. An item that stopped gives what
        it had made; the run raises PipelineStopped when every item stopped or `stop_all`
        said so."""
        stops = RunStops(batch, lambda: self.rounds)
        futures = [self.submit(item, Ticket(should_stop=stops.hook(i)))
                   for i, item in enumerate(batch.items)]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        results: list[Result] = []
        for o in outcomes:
            if isinstance(o, PipelineStopped):
                # What a stopped row had made: its TextResult (`_retire`).
                results.append(cast(TextResult, o.partial))
            elif isinstance(o, BaseException):
                raise o
            else:
                results.append(o)
        if stops.all_stopped or all(isinstance(o, PipelineStopped) for o in outcomes):
            raise PipelineStopped
        return results

    def starts_soon(self) -> bool:
        """Whether an item announced now (counted in `expected`) would join the next
        iteration: a slot is free for it and for everything ahead of it, and no isolated row
        runs or waits. The worker then charges its attempt with its lease (engine/start.py).
        A guess: one that turns out wrong only charges an item that waits an iteration or
        more."""
        if self._runs_isolated() or any(w.isolate for w in self.waiting) or self.short_of_pages:
            return False
        return len(self.running) + len(self.waiting) + self.expected <= self.slots

    def pump(self) -> None:
        """Make sure the loop runs while there is work; called on arrivals, departures and
        withdrawals."""
        self._withdraw()
        self._woken.set()
        if (self._task is None or self._task.done()) and self.waiting:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def _withdraw(self) -> None:
        """Waiting items whose sub-request was stopped leave at once."""
        for w in [w for w in self.waiting if w.gone]:
            self.waiting.remove(w)
            if not w.future.done():
                w.loop.call_soon_threadsafe(settle, w.future, None, PipelineStopped())

    def _requeue(self) -> None:
        """The rows the iteration held back or preempted go back to the front of the queue,
        in the order they were in."""
        for w in reversed(self.returned):
            self.waiting.appendleft(w)
        self.returned.clear()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.waiting or self.running:
            self._withdraw()
            if not self.running and not await self._burst_gathered():
                continue
            admit = self._admissible()
            await announce_start(self.on_start, admit, len(self.running) + len(admit))
            try:
                settles = await loop.run_in_executor(self.p.device_executor, self._iterate,
                                                     admit)
            except Exception as exc:
                self._requeue()
                if device_faults.is_sticky(exc):
                    settles = self._lost(admit, exc)
                else:
                    settles = self._failed(admit, exc)
            else:
                self._requeue()
            for waiting, result, error in settles:
                if waiting.loop is loop:
                    settle(waiting.future, result, error)
                else:  # submitted from another loop (a test's or a benchmark's own)
                    waiting.loop.call_soon_threadsafe(settle, waiting.future, result, error)

    async def _burst_gathered(self) -> bool:
        """An idle decoder starts at once, unless more sub-requests are on their way: then it
        waits for them (at most `max_wait_s` from the oldest), so a burst prefills together."""
        if self.expected <= 0 or len(self.waiting) >= self.slots:
            return True
        wait = self.waiting[0].arrived + self.max_wait_s - time.monotonic()
        if wait <= 0:
            return True
        self._woken.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), wait)
        return False

    def _admissible(self) -> list[Waiting]:
        """Waiting items for the free slots, in order; an isolated one only alone."""
        admit: list[Waiting] = []
        if self._runs_isolated():
            return admit
        while self.waiting and len(self.running) + len(admit) < self.slots:
            if self.waiting[0].isolate:
                if not self.running and not admit:
                    admit.append(self.waiting.popleft())
                break
            admit.append(self.waiting.popleft())
        return admit

    def _failed(self, admit: list[Waiting], exc: Exception) -> list[Settle]:
        """The model raised in an iteration. Alone, its row fails; with others, every row of
        the iteration runs again alone, so that only the rows that fail alone fail (their
        tokens come out the same: greedy, or their own seeded draws)."""
        held = [r for r in self.running if not r.stopped]
        settles: list[Settle] = [(r.waiting, None, PipelineStopped()) for r in self.running
                                 if r.stopped]
        # A row admitted in this iteration is already running once its prefill has run:
        # counted twice, it could never fail alone, and ran again isolated without end.
        running = {id(r.waiting) for r in self.running}
        rows = [r.waiting for r in held] + [w for w in admit if id(w) not in running]
        self.running.clear()
        self.cache.reset()
        self._publish()
        if len(rows) == 1 and (rows[0].isolate or not settles):
            log.warning("a %s text row failed alone: %s: %s", self.p.spec.name,
                        type(exc).__name__, exc)
            return [*settles, (rows[0], None, device_faults.failed_alone(exc, "a text row"))]
        log.warning("a %s decode iteration with %d rows failed (%s: %s); running them alone",
                    self.p.spec.name, len(rows), type(exc).__name__, exc)
        metrics.BATCHES_ISOLATED.labels(self.p.spec.name).inc()
        for w in reversed(rows):
            w.isolate = True
            self.waiting.appendleft(w)
        return settles

    def _lost(self, admit: list[Waiting], exc: Exception) -> list[Settle]:
        """The device failed for good (device_faults.py): no row runs again here; every row
        held or waiting fails with `DeviceLost`, which the worker hands back before exiting."""
        log.critical("a %s decode iteration hit a sticky device error: %s: %s",
                     self.p.spec.name, type(exc).__name__, exc)
        running = {id(r.waiting) for r in self.running}
        rows = [r.waiting for r in self.running] + [w for w in admit if id(w) not in running]
        rows += self.waiting
        self.running.clear()
        self.waiting.clear()
        self.cache.reset()
        self._publish()
        return [(w, None, device_faults.lost(exc)) for w in rows]

    # Device thread side ----------------------------------------------------------------------

    def _iterate(self, admit: list[Waiting]) -> list[Settle]:
        asked = [k for k in [r.row.item.logprobs for r in self.running]
                 + [w.item.logprobs for w in admit] if k is not None]
        self.scoring = max(asked) if asked else None
        with torch.inference_mode():
            settles = self._admit(admit)
            # Never past the smallest budget left: a row at its budget retires first.
            left = [r.left for r in self.running]
            steps = max(0, min(STEPS_PER_READ, *left)) if left else 0
            if any(r.matcher is not None for r in self.running):
                # A grammar's next mask needs the row's last token on the host: one step a
                # read, and none after a prefill that made a constrained row's first token.
                new = any(r.new and r.matcher is not None for r in self.running)
                steps = 0 if new else min(steps, 1)
            held = self.cache.pages
            for i, r in enumerate(self.running):  # reserved at admission (`_admit`)
                if len(held[i]) * PAGE_TOKENS < r.columns + steps:
                    self.cache.grow(i, r.columns + steps)
            t0 = time.perf_counter()
            for step in range(1, steps + 1):
                self._check_stops()
                self._step(step)
                if step < steps and self._joins_sooner(steps - step):
                    steps = step
                    break
            if steps:
                self.p.observe("decode", time.perf_counter() - t0)
            if self.running:
                self._read(steps)
                if steps:
                    self.step_seconds = (time.perf_counter() - t0) / steps
            settles += self._retire()
            self._publish()
            return settles

    def _publish(self) -> None:
        """The pool's gauges, set together where the pages used are the running rows' own, so
        that tokens over 16 x pages reads how full their pages are."""
        self._pages_gauge.set(self.cache.used)
        self._tokens_gauge.set(sum(r.columns for r in self.running))

    def _joins_sooner(self, steps_left: int) -> bool:
        """Whether an item waits for a free slot and the iteration's other `steps_left` steps
        would hold it long enough to end the iteration now (`JOIN_SOONER_S`). In the stack,
        each slot stands empty from its row's retirement until its client's next request is
        admitted: with 8 ms steps (the 6x256 GPT-2 at c=32), waiting out the iteration cost
        2-5% of the throughput; with tiny-gpt2's steps of about a millisecond, the extra
        iterations cost more than the wait (docs/architecture.md). Read from the device
        thread while the loop may append: a stale answer costs one read early, or one
        iteration's wait. An isolated item joins only an empty decoder (`_admissible`), so
        it ends no iteration."""
        if steps_left * self.step_seconds < JOIN_SOONER_S or len(self.running) >= self.slots:
            return False
        try:
            head = self.waiting[0]
        except IndexError:
            return False
        return not head.isolate and not self._runs_isolated() and not self.short_of_pages

    def _runs_isolated(self) -> bool:
        """An isolated row runs: nothing joins it."""
        return any(r.waiting.isolate for r in self.running)

    def _check_stops(self) -> None:
        self.rounds += 1
        for r in self.running:
            hook = r.waiting.should_stop
            if not r.stopped and hook is not None and hook():
                r.stopped_at = r.seq.tokens + r.fed

    def _admit(self, admit: list[Waiting]) -> list[Settle]:
        """Start the items the pool has pages for, in order; the first it has none for and
        everything after it go back to the queue (`returned`), and leave `admit`, which is
        then what the iteration admitted."""
        settles: list[Settle] = []
        rows: list[Running] = []
        self.rounds += 1
        for r in self.running:
            r.new = False
        preempted, lacking = self._make_room()
        if not preempted:
            self.growth.calm()
        # What the running rows are expected to grow into stays free for them.
        free = self.cache.pool.free - lacking - self._growth_reserve()
        # Rows prefilled after the others, because an earlier one computes the pages their
        # prompts begin with (a request's `n` choices, a batch's lines with one system prompt).
        second: list[Running] = []
        coming: set[bytes] = set()
        for w in list(admit):
            if self.returned:  # in order: nothing passes a row that waits
                self.returned.append(w)
                admit.remove(w)
                continue
            if w.should_stop is not None and w.should_stop():
                settles.append((w, None, self._canceled(w.held)))
                continue
            r, w.held = w.held or self._started(w), None
            r.shared, unheld = self.cache.share_prefix(r.shareable)
            after = r.shareable[len(r.shared):]
            waits = bool(after) and after[0] in coming
            # Its prompt (and what it made before) past the pages it shares, and the tokens
            # its next steps write.
            shares = len(r.shared) + (_leading(after, coming) if waits else 0)
            need = pages_for(len(r.ids) + max(min(STEPS_PER_READ, r.left - 1),
                                              self.growth.tokens(r.left))) - shares
            if need + unheld > free and (rows or second or self.running):
                self.cache.pool.give(r.shared)
                r.shared = []
                w.held = r
                self.returned.append(w)
                admit.remove(w)
                continue
            free -= need + unheld
            if waits:
                second.append(r)
            else:
                coming.update(r.digests[len(r.shared):])
                rows.append(r)
        held_back = len(self.returned) - preempted
        admit[:] = [r.waiting for r in rows + second]
        self.short_of_pages = held_back + preempted
        metrics.KV_ROWS_WAITING.labels(self.p.spec.name).set(self.short_of_pages)
        for wave in (rows, second):
            if wave:
                t0 = time.perf_counter()
                self._prefill(wave)
                self.p.observe("prefill", time.perf_counter() - t0)
        return settles

    def _started(self, w: Waiting) -> Running:
        row = self.p.start(w.item)
        fmt = w.item.response_format
        return Running(w, row, Sequence(item=w.item, budget=row.budget,
                                        prompt_tokens=len(row.prompt)),
                       digests=page_digests(row.prompt, w.cache_scope),
                       matcher=None if fmt is None else RowMatcher(self.p.grammar(fmt),
                                                                    row.budget))

    def _lacking(self) -> int:
        """The pages the running rows lack for their next steps."""
        held = self.cache.pages
        return sum(max(0, pages_for(r.columns + min(STEPS_PER_READ, r.left)) - len(held[i]))
                   for i, r in enumerate(self.running))

    def _growth_reserve(self) -> int:
        """The pages the running rows are expected to grow into, past their next steps."""
        held = self.cache.pages
        return sum(max(0, pages_for(r.columns + max(min(STEPS_PER_READ, r.left),
                                                    self.growth.tokens(r.left)))
                       - max(len(held[i]), pages_for(r.columns + min(STEPS_PER_READ, r.left))))
                   for i, r in enumerate(self.running))

    def _make_room(self) -> tuple[int, int]:
        """Preempt the youngest rows until the pool has the pages every other running row
        needs for its next steps: each gives its pages back and goes to the front of the
        queue with what it made (`returned`). The oldest row always fits alone (the pool
        holds at least one full-context row). How many it preempted, and the pages the rows
        left lack."""
        preempted = 0
        while (lacking := self._lacking()) > self.cache.pool.free and self.running:
            slot = max(range(len(self.running)), key=lambda i: self.running[i].order)
            r = self.running[slot]
            self._vacate(slot)
            r.waiting.held = r
            self.returned.insert(0, r.waiting)
            preempted += 1
            self.growth.preempted()
            metrics.KV_PREEMPTIONS.labels(self.p.spec.name).inc()
        return preempted, lacking

    def _canceled(self, r: Running | None) -> PipelineStopped:
        """A row stopped: what it had made, if anything."""
        if r is None:
            return PipelineStopped()
        return PipelineStopped(TextResult(text=self.p.decode(r.seq.generated),
                                          finish_reason=FinishReason.CANCELED,
                                          tokens=r.seq.tokens,
                                          prompt_tokens=r.seq.prompt_tokens))

    def _prefill(self, rows: list[Running]) -> None:
        p, cache, device = self.p, self.cache, self.p.device
        n, k = len(self.running), len(rows)
        for r in rows:  # the second wave's next pages, computed by the first one
            more, _ = cache.share_prefix(r.shareable[len(r.shared):])
            r.shared += more
        # What each row computes: its tokens past the pages it shares.
        skipped = [len(r.shared) * PAGE_TOKENS for r in rows]
        prompts = [r.ids[s:] for r, s in zip(rows, skipped, strict=True)]
        width = max(len(ids) for ids in prompts)
        ids = torch.full((k, width), p.pad_id, dtype=torch.long)
        real = torch.zeros((k, width), dtype=torch.bool)
        for i, (r, prompt) in enumerate(zip(rows, prompts, strict=True)):
            ids[i, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            real[i, width - len(prompt):] = True
            cache.attach(n + i, r.shared)
            cache.grow(n + i, len(r.ids))
            r.columns = len(r.ids)
        self._count_prefix(rows, skipped)
        made = torch.tensor([r.seq.tokens for r in rows], dtype=torch.long)
        ids, real, made = self._upload(ids), self._upload(real), self._upload(made)
        positions = (real.long().cumsum(-1) - 1).clamp_(min=0)
        slots = slice(n, n + k)
        if any(skipped):
            # Queries read their rows' pages, shared ones too, up to their own positions (a
            # pad's is its row's first, a key it may see).
            positions += self._upload(torch.tensor(skipped, dtype=torch.long))[:, None]
            pages = max(pages_for(len(r.ids)) for r in rows)
            mask = self.window[:pages * PAGE_TOKENS] <= positions[:, :, None]
            cache.for_prefill(slots, positions, real, pages)
        else:
            # Each prompt sees its own earlier tokens; a pad sees itself, so no query row is
            # empty (an empty row would make NaNs that its zero weight cannot cancel).
            causal = torch.ones((width, width), dtype=torch.bool, device=device).tril_()
            mask = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool,
                                                                 device=device)[None]
            cache.for_prefill(slots, positions, real)
        masks = self._masks_ahead([r.matcher for r in rows])
        logits = self._masked(p.forward(ids, mask[:, None], positions, cache).float(), masks)
        for i, r in enumerate(rows):
            cache.register(n + i, r.digests)
            r.shared = []
        params = torch.tensor([params_of(r.row.item.temperature, r.row.item.top_k,
                                         r.row.item.top_p) for r in rows],
                              dtype=torch.float32).T
        self.params[:, slots] = self._upload(params)
        self.uniforms[slots] = 0.0
        for i, r in enumerate(rows):
            if r.row.item.temperature > 0:
                draws = uniforms_of(r.row.item.seed, r.row.budget)
                self.uniforms[n + i, :r.row.budget] = self._upload(draws)
        sampled = any(r.row.item.temperature > 0 for r in rows)
        # A preempted row's draws go on from the tokens it made.
        self.made[slots] = made
        first = pick(logits, self.params[:, slots],
                     self.uniforms[slots].gather(1, made[:, None])[:, 0], sampled)
        self.tokens[0, slots] = first
        if self.scoring is not None:
            self._score(0, slots, logits, first)
        self.next_ids[slots] = first
        self.positions[slots] = positions[:, -1] + 1
        self.made[slots] += 1
        for r in rows:
            r.fed, r.new, r.order = 1, True, self.admitted
            self.admitted += 1
        self.running.extend(rows)
        metrics.BATCH_SIZE.labels(p.spec.name).observe(k)

    def _count_prefix(self, rows: list[Running], skipped: list[int]) -> None:
        name = self.p.spec.name
        metrics.KV_PREFIX_LOOKUP_TOKENS.labels(name).inc(
            sum(len(r.shareable) for r in rows) * PAGE_TOKENS)
        metrics.KV_PREFIX_HIT_TOKENS.labels(name).inc(sum(skipped))

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device, copied without making the host wait: from pinned
        memory, which PyTorch keeps until the copy has run."""
        if self.p.device.type != "cuda":
            return host
        return host.pin_memory().to(self.p.device, non_blocking=True)

    def _step(self, step: int) -> None:
        p, cache = self.p, self.cache
        n = len(self.running)
        # Each row writes its token at its own position, and the step reads the pages the
        # longest row holds: a row attends to its positions up to the one it writes.
        columns = [r.columns for r in self.running]
        pages = pages_for(max(columns) + 1)
        positions = self.positions[:n]
        mask = self.window[:pages * PAGE_TOKENS] <= positions[:, None]
        cache.for_decode(columns, positions, pages)
        masks = self._masks_ahead([r.matcher for r in self.running])
        logits = self._masked(p.forward(self.next_ids[:n, None], mask[:, None, None],
                                        positions[:, None], cache).float(), masks)
        sampled = any(r.row.item.temperature > 0 for r in self.running)
        uniform = self.uniforms[:n].gather(1, self.made[:n, None])[:, 0] if sampled else None
        nxt = pick(logits, self.params[:, :n], uniform, sampled)
        self.tokens[step, :n] = nxt
        if self.scoring is not None:
            self._score(step, slice(0, n), logits, nxt)
        self.next_ids[:n] = nxt
        self.positions[:n] += 1
        self.made[:n] += 1
        for r in self.running:
            r.columns += 1
            r.fed += 1

    def _masks_ahead(self, matchers: list[RowMatcher | None]) -> Future | None:
        """Start filling the grammar masks of rows under a grammar while the forward runs:
        llguidance fills them on a thread of its own, with the GIL released."""
        if all(m is None for m in matchers):
            return None
        if self._bitmask is None:  # one row per slot: made once
            vocab = next(m for m in matchers if m is not None).grammar.tokenizer.vocab_size
            self._bitmask = new_bitmask(self.slots, vocab, pin=self.p.device.type == "cuda")
            self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        bitmask = self._bitmask[:len(matchers)]
        assert self._mask_thread is not None
        return self._mask_thread.submit(fill_masks, bitmask, matchers)

    def _masked(self, logits: torch.Tensor, masks: Future | None) -> torch.Tensor:
        """`logits` with what rows under a grammar may not write next at -inf."""
        if masks is not None:
            masks.result()
            assert self._bitmask is not None
            apply_masks(logits, self._upload(self._bitmask[:logits.shape[0]]))
        return logits

    def _score(self, step: int, rows: slice, logits: torch.Tensor, chosen: torch.Tensor) -> None:
        """Step `step`'s log-probabilities of `rows`' tokens `chosen`, under the model (before
        temperature and filters), and of the `scoring` most likely."""
        out = self.scores[step, rows]
        logprobs = logits.log_softmax(dim=-1)  # float already (`_masked`'s input)
        out[:, 0] = chosen
        out[:, 1] = logprobs.gather(1, chosen[:, None])[:, 0]
        if k := self.scoring:
            values, ids = logprobs.topk(k, dim=-1)
            out[:, 2:2 + k] = ids
            out[:, 2 + MAX_TOP_LOGPROBS:2 + MAX_TOP_LOGPROBS + k] = values

    def _read(self, steps: int) -> None:
        """The iteration's one host read: the tokens made, then each row's rules."""
        n = len(self.running)
        first = 0 if any(r.new for r in self.running) else 1
        scored: list[list[list[float]]] | None = None
        if self.scoring is None:
            host = sync.to_host(self.tokens[first:steps + 1, :n],
                                self.tokens_host[first:steps + 1, :n], self.p.spec.name)
            columns = host.tolist()
        else:
            scored = sync.to_host(self.scores[first:steps + 1, :n],
                                  self.scores_host[first:steps + 1, :n], self.p.spec.name).tolist()
            columns = [[int(row[0]) for row in step] for step in scored]
        for slot, r in enumerate(self.running):
            start = (0 if r.new else 1) - first
            made = [row[slot] for row in columns[start:]]
            if r.stopped_at is not None:  # what it made after the stop is not its own
                made = made[:max(0, r.stopped_at - r.seq.tokens)]
            r.fed = 0
            asked = r.row.item.logprobs
            for j, token in enumerate(made):
                score = None if scored is None or asked is None else \
                    _score_of(scored[start + j][slot], asked)
                if r.matcher is not None and not r.matcher.accept(token):
                    # The budget left cannot close what the token opened: the grammar's
                    # closing writes on, and the next step reads its token instead.
                    token = cast(int, r.matcher.substitute)
                    self.next_ids[slot] = token
                    score = None if score is None else _substituted(score, token)
                if r.seq.push(token, self.p, score):
                    break
            if made and not r.stopped and (hook := r.waiting.on_text) is not None:
                self._tell(r, hook)

    def _tell(self, r: Running, hook: OnText) -> None:
        """Hand a row's hook its state; the hook decodes only if it asks for the text."""
        seq = r.seq
        update = TextUpdate(tokens=seq.tokens, prompt_tokens=len(r.row.prompt),
                            finish_reason=seq.finish_reason, text=lambda: seq.stream_text(self.p),
                            logprobs=seq.logprobs)
        try:
            hook(update)
        except Exception:  # its output events are best effort; its row goes on
            log.exception("a %s on_text hook failed", self.p.spec.name)

    def _retire(self) -> list[Settle]:
        """Settle the rows that ended; the last running rows move into their rows."""
        settles: list[Settle] = []
        for slot in range(len(self.running) - 1, -1, -1):
            r = self.running[slot]
            if r.stopped:
                settles.append((r.waiting, None, self._canceled(r)))
            elif r.seq.finished:
                settles.append((r.waiting, r.seq.result(), None))
            else:
                continue
            self._vacate(slot)
        return settles

    def _vacate(self, slot: int) -> None:
        """A row leaves: its pages go back to the pool, the last row takes its place."""
        self.cache.release(slot)
        last = len(self.running) - 1
        if slot != last:
            self._move(last, slot)
            self.running[slot] = self.running[last]
        self.running.pop()

    def _move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        for t in (self.next_ids, self.positions, self.made, self.uniforms):
            t[dst] = t[src]
        self.params[:, dst] = self.params[:, src]


def _score_of(row: list[float], alternatives: int) -> Score:
    """A read scores row as (log-probability, [(id, log-probability)] of `alternatives`)."""
    top = MAX_TOP_LOGPROBS + 2
    return row[1], [(int(row[2 + t]), row[top + t]) for t in range(alternatives)]


def _substituted(score: Score, token: int) -> Score:
    """The score of a token the grammar wrote in place of the one drawn: its log-probability
    among the alternatives, else -9999 (vLLM's stand-in for a token the model all but
    excluded)."""
    _, top = score
    return next((lp for t, lp in top if t == token), -9999.0), top


def _leading(digests: list[bytes], known: set[bytes]) -> int:
    """How many of `digests`, from the first, are in `known`."""
    count = 0
    for digest in digests:
        if digest not in known:
            break
        count += 1
    return count
