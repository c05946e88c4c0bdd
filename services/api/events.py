"""A job's live events, for the SSE stream and for `Prefer: wait`.

Events are published on a per-job Redis channel (best effort), and the id of every job that
becomes final on one shared channel (`names.FINAL_CHANNEL`, by finalize.lua in the same step). Each
API process listens on ONE pub/sub connection, the `EventHub`: it is always subscribed to the
final channel and, while an event stream watches a job, to that job's channel, and it hands
what it hears to the waiters of this process. A `Prefer: wait` therefore costs no Redis command
until its job is final, and no request opens a connection of its own.

The job store stays the truth: on every message, and every second without one, the record is
read again, so a missed message (or a hub that lost its connection) only delays an event, and a
client that connects late gets the current state first.
"""

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import redis.asyncio as aioredis

from services.api.envelope import envelope
from shared import names
from shared.asyncio_compat import raise_if_cancelled
from shared.jobstore import JobRecord, JobStore
from shared.messages import OutputEvent, StepEvent, decode_event

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # how long a waiter trusts the hub before reading the store again
RECENT_FINAL_SECONDS = 30.0  # how long the hub remembers a job it heard become final
RECENT_FINAL_MAX = 100_000
CONFIRM_SECONDS = 1.0  # the longest an event stream waits for its channel's subscription
LISTENER_BACKLOG = 256  # messages a slow event stream may fall behind by (oldest dropped)


class Wake:
    """What a listener gets besides a channel message: its job became final, or the hub
    (re)connected and may have missed something. Either way: read the store."""

    FINAL = "final"
    RECONNECTED = "reconnected"


Item = bytes | str | JobRecord


class Listener:
    """One waiter's inbox: messages of its job's channel (bytes), wake-ups (`Wake`), and the
    final record itself when this replica made the job final (`JobRecord`)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._items: collections.deque[Item] = collections.deque(maxlen=LISTENER_BACKLOG)
        self._ready = asyncio.Event()

    def push(self, item: Item) -> None:
        self._items.append(item)
        self._ready.set()

    async def next(self, timeout: float) -> Item | None:
        """The next message or wake-up, or None after `timeout` seconds without one."""
        if not self._items:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
        return self._items.popleft() if self._items else None

    async def next_wake(self, timeout: float) -> Item | None:
        """As `next`, taking everything queued: the final record if it is among them (this
        replica's own finish and the final channel's message come at about the same time)."""
        item = await self.next(timeout)
        while self._items and not isinstance(item, JobRecord):
            item = self._items.popleft()
        self._items.clear()
        return item


class EventHub:
    """The one pub/sub connection of an API process (see the module's docstring). `run` is a
    background task of the app; `listen` registers a waiter."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._finals: dict[str, set[Listener]] = {}  # job id -> listeners
        self._live: dict[str, set[Listener]] = {}  # job channel -> listeners of its messages
        self._recent: dict[str, float] = {}  # job id -> when heard final, oldest first
        self._pubsub: aioredis.client.PubSub | None = None
        self._active: set[str] = set()  # job channels subscribed on the current connection
        self._confirmed: dict[str, asyncio.Event] = {}
        self._sync_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()  # unsubscribes under way
        self._observers: list[Callable[[str], None]] = []
        self.connected = asyncio.Event()

    # Waiters --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def listen(self, job_id: str, live: bool = False) -> AsyncIterator[Listener]:
        """A listener woken when the job becomes final (at once if the hub heard that
        recently); with `live`, also given every message of the job's channel, subscribed
        (and confirmed, within `CONFIRM_SECONDS`) before this returns."""
        listener = Listener(job_id)
        self._finals.setdefault(job_id, set()).add(listener)
        if job_id in self._recent:
            listener.push(Wake.FINAL)
        channel = names.events_channel(job_id)
        try:
            if live:
                self._live.setdefault(channel, set()).add(listener)
                confirmed = self._confirmed.setdefault(channel, asyncio.Event())
                await self._sync(channel)
                if self._pubsub is not None:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(CONFIRM_SECONDS):
                            await confirmed.wait()
            yield listener
        finally:
            _discard(self._finals, job_id, listener)
            if live and _discard(self._live, channel, listener):
                self._confirmed.pop(channel, None)
                # Not awaited by the caller: a stream that ends must not wait on Redis.
                task = asyncio.ensure_future(self._sync(channel))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def observe_finals(self, callback: Callable[[str], None]) -> None:
        """Call `callback(job_id)` for every job heard final on the final channel (the batch
        driver's wake-up); it runs on the hub's loop and must not block. A message lost with
        the connection is not heard: an observer reads the store on a timer of its own too."""
        self._observers.append(callback)

    def finished_here(self, rec: JobRecord) -> None:
        """This replica made `rec` final: its waiters get the record as it is stored, and need
        not read it (one whose webhook deliveries matter, not read here, is only woken)."""
        item: Item = rec if rec.final and rec.meta.webhook is None else Wake.FINAL
        for listener in self._finals.get(rec.id, ()):
            listener.push(item)

    @property
    def waiters(self) -> int:
        return sum(len(s) for s in self._finals.values())

    # The connection -------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            raise_if_cancelled()
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(names.FINAL_CHANNEL)
                async with self._sync_lock:
                    self._pubsub, self._active = pubsub, set()
                    if self._live:
                        await pubsub.subscribe(*self._live)
                        self._active = set(self._live)
                self.connected.set()
                # Whatever was published while there was no connection is lost: everyone
                # reads the store again.
                self._wake_all(Wake.RECONNECTED)
                while True:
                    # get_message can drop a cancellation (shared/asyncio_compat.py); found by
                    # a shutdown that waited for this loop forever.
                    raise_if_cancelled()
                    msg = await pubsub.get_message(timeout=POLL_SECONDS)
                    if msg is not None:
                        self._dispatch(msg)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("event hub lost Redis; reconnecting", exc_info=True)
                await asyncio.sleep(1)
            finally:
                self.connected.clear()
                self._pubsub = None
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _dispatch(self, msg: dict) -> None:
        channel = msg["channel"].decode()
        if msg["type"] == "subscribe":
            if (confirmed := self._confirmed.get(channel)) is not None:
                confirmed.set()
            return
        if msg["type"] != "message":
            return
        data = msg["data"]
        if channel == names.FINAL_CHANNEL:
            job_id = data.decode()
            self._remember(job_id)
            for listener in self._finals.get(job_id, ()):
                listener.push(Wake.FINAL)
            self._tell_observers(job_id)
        else:
            for listener in self._live.get(channel, ()):
                listener.push(data)

    def _tell_observers(self, job_id: str) -> None:
        for callback in self._observers:
            try:
                callback(job_id)
            except Exception:  # one observer's bug must not cost the waiters their wake-ups
                log.exception("a final-job observer failed")

    def _remember(self, job_id: str) -> None:
        """Keep the job as heard final for a while: a waiter that registers just after (its
        job finished between being sent and the wait) is woken at once."""
        now = time.monotonic()
        self._recent.pop(job_id, None)
        self._recent[job_id] = now
        while self._recent:
            oldest, at = next(iter(self._recent.items()))
            if now - at <= RECENT_FINAL_SECONDS and len(self._recent) <= RECENT_FINAL_MAX:
                break
            del self._recent[oldest]

    def _wake_all(self, why: str) -> None:
        for listeners in self._finals.values():
            for listener in listeners:
                listener.push(why)

    async def _sync(self, channel: str) -> None:
        """Subscribe or unsubscribe the job channel so that the connection matches whether
        anyone listens to it (one at a time, so that a leave and a join cannot cross)."""
        async with self._sync_lock:
            pubsub, wanted = self._pubsub, channel in self._live
            if pubsub is None or wanted == (channel in self._active):
                return
            try:
                if wanted:
                    await pubsub.subscribe(channel)
                    self._active.add(channel)
                else:
                    self._active.discard(channel)
                    await pubsub.unsubscribe(channel)
            except Exception:  # the run loop reconnects and resubscribes what is wanted
                log.warning("event hub could not (un)subscribe %s", channel, exc_info=True)


def _discard(index: dict[str, set[Listener]], key: str, listener: Listener) -> bool:
    """Remove a listener; True when it was the key's last."""
    listeners = index.get(key)
    if listeners is None:
        return False
    listeners.discard(listener)
    if listeners:
        return False
    del index[key]
    return True


async def job_events(
    hub: EventHub,
    store: JobStore,
    job_id: str,
    public_url: str,
    stop: Callable[[], bool] = lambda: False,
) -> AsyncIterator[tuple[str, dict]]:
    """Yield (event, data) pairs: `status` (the whole job) on every status change, `progress`
    when sub-requests finish, `step` for denoise/decode steps, `output` for text as it is
    decoded, until the job is final or `stop()` (checked at least once a second) says this
    replica is draining."""
    async with hub.listen(job_id, live=True) as listener:  # before reading: nothing slips by
        # Events are made only for a job someone watches: from here on they are.
        await store.watch(job_id)
        rec = await store.get(job_id)
        yield "status", _status(rec, public_url)
        status, done = rec.status, rec.done
        while not rec.final and not stop():
            item = await listener.next(timeout=POLL_SECONDS)
            if isinstance(item, bytes):
                event = decode_event(item)
                if isinstance(event, StepEvent | OutputEvent):
                    yield event.event, event.data.model_dump(mode="json")
                    continue
            rec = item if isinstance(item, JobRecord) else await store.get(job_id)
            if rec.done > done:
                done = rec.done
                yield "progress", {"done": rec.done, "total": rec.total}
            if rec.status != status:
                status = rec.status
                yield "status", _status(rec, public_url)


async def wait_final(
    hub: EventHub, store: JobStore, job_id: str, timeout: float,
    rec: JobRecord | None = None,
) -> JobRecord:
    """The job once it is final, or as it is after `timeout` seconds. `rec`, the job as read
    (or created) just before, saves the first read: the hub remembers jobs that became final
    just before the wait began."""
    deadline = time.monotonic() + timeout
    async with hub.listen(job_id) as listener:
        if rec is None:
            rec = await store.get(job_id)
        while not rec.final and (left := deadline - time.monotonic()) > 0:
            item = await listener.next_wake(timeout=min(left, POLL_SECONDS))
            rec = item if isinstance(item, JobRecord) else await store.get(job_id)
        return rec


def _status(rec: JobRecord, public_url: str) -> dict:
    return envelope(rec, public_url).model_dump(mode="json")
