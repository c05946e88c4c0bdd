"""Reading the scripts (once per process) and registering them (once per Redis client)."""

import functools
import re
import time
import weakref
from collections.abc import Sequence
from importlib import resources

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.typing import EncodableT

from shared.replication import NOT_ASKED, Replication, note

SCRIPTS_DIR = "scripts"
FRAGMENTS_DIR = "fragments"
_INCLUDE = re.compile(r"^--@include (\S+)[ \t]*$", re.MULTILINE)

# Each client's scripts, by name: a client computes each script's SHA once, and a JobStore made
# again on the same client (a test, a restarted loop) reuses them.
_registered: "weakref.WeakKeyDictionary[aioredis.Redis, dict[str, AsyncScript]]" = (
    weakref.WeakKeyDictionary()
)


def _read(path: str) -> str:
    return resources.files(__package__).joinpath(path).read_text(encoding="utf-8")


def includes(text: str) -> list[str]:
    """The fragments a script or fragment names with `--@include`, in order."""
    return _INCLUDE.findall(text)


def _compose(text: str, done: set[str]) -> str:
    """`text` with each `--@include` line replaced by its fragment (itself composed), each
    fragment once per script: a second include of one is dropped."""

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in done:
            return ""
        done.add(name)
        return _compose(_read(f"{FRAGMENTS_DIR}/{name}.lua"), done).rstrip("\n")

    return _INCLUDE.sub(expand, text)


@functools.cache
def source(name: str) -> str:
    """The script scripts/<name>.lua with its fragments composed in."""
    return _compose(_read(f"{SCRIPTS_DIR}/{name}.lua"), set())


class Script:
    """One script, by its file's name; `run` registers it on a client the first time."""

    def __init__(self, name: str) -> None:
        self.name = name
        ALL.append(self)

    def on(self, redis: aioredis.Redis) -> AsyncScript:
        scripts = _registered.setdefault(redis, {})
        script = scripts.get(self.name)
        if script is None:
            script = scripts[self.name] = redis.register_script(source(self.name))
        return script

    async def run(self, redis: aioredis.Redis, keys: Sequence[str],
                  args: Sequence[EncodableT]) -> object:
        """EVALSHA (and SCRIPT LOAD first, when the server does not have it yet)."""
        return await self.on(redis)(keys=keys, args=args)

    async def run_durably(self, redis: aioredis.Redis, keys: Sequence[str],
                          args: Sequence[EncodableT]) -> tuple[object, Replication]:
        """`run`, then WAIT for the replicas the client asks for, in one round trip on one
        connection (WAIT counts the replicas holding that connection's writes): the script's
        reply and how many hold what it wrote. With too few (a failover took the only
        replica, one is paused), a barrier write and WAIT are asked again for as long as a
        command rides out an outage: replicas apply writes in order, so one holding the
        barrier holds the script's writes too, and a replica coming back costs latency, not a
        refused job."""
        wanted = getattr(redis, "replicas_to_wait", 0)
        if not wanted:
            return await self.run(redis, keys, args), NOT_ASKED
        timeout_ms = getattr(redis, "replica_timeout_ms", 2000)
        give_up = time.monotonic() + getattr(redis, "replica_patience_seconds", 0.0)
        async with redis.pipeline(transaction=False) as pipe:
            await self.on(redis)(keys=keys, args=args, client=pipe)
            pipe.wait(wanted, timeout_ms)
            reply, acked = await pipe.execute()
        while acked < wanted and time.monotonic() < give_up:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.set(BARRIER_KEY, self.name, px=BARRIER_TTL_MS)
                pipe.wait(wanted, timeout_ms)
                _, acked = await pipe.execute()
        rep = Replication(int(acked), wanted, timeout_ms)
        note(rep, self.name)
        return reply, rep


# A key written only so that WAIT has a write of its connection to count (run_durably).
BARRIER_KEY = "fm:replication-barrier"
BARRIER_TTL_MS = 60_000


ALL: list[Script] = []  # every script a wrapper module declares
