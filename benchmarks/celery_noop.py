"""A bare Celery task with the project's configuration, for reference beside the queue path:
what kombu's publish and consume cost per message on their own (`queue_cost --celery-noop`)."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks.procstat import cpu_seconds
from benchmarks.redis_stats import commandstats, delta
from services.devstack.processes import stop
from services.devstack.redis_server import free_port, start_redis


def __getattr__(name: str) -> Any:
    # `celery -A benchmarks.celery_noop:noop_app worker`: built on first use only.
    if name == "noop_app":
        app = _make_noop_app()
        globals()["noop_app"] = app
        return app
    raise AttributeError(name)


def _make_noop_app():
    from shared.celery_config import make_celery
    from shared.settings import get_settings

    app = make_celery(get_settings(), name="bench-noop")

    @app.task(name="bench.noop", acks_late=True, reject_on_worker_lost=True)
    def noop(payload: dict) -> None:
        return None

    return app


def measure(n: int = 300, concurrency: int = 16) -> dict:
    """Commands per message for a bare Celery task with the project's configuration: publish
    (as shared/sending.py does) and consume (acks_late, thread pool, prefetch 1). Publishing is
    measured on a queue nobody consumes, consuming as what a consumed message costs beyond it."""
    with tempfile.TemporaryDirectory() as tmp:
        rport = free_port()
        redis_proc = start_redis(rport, Path(tmp), appendonly=False)
        env = {**os.environ, "FIBERMILL_REDIS_URL": f"redis://127.0.0.1:{rport}/0"}
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "benchmarks.celery_noop:noop_app",
             "worker", "-P", "threads", "-c", str(concurrency), "-Q", "bench.noop",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = redis.Redis(port=rport)
        from shared.settings import get_settings
        saved = os.environ.get("FIBERMILL_REDIS_URL")
        try:
            os.environ["FIBERMILL_REDIS_URL"] = env["FIBERMILL_REDIS_URL"]
            get_settings.cache_clear()
            app = _make_noop_app()

            def send(k: int, queue: str) -> None:
                with app.producer_or_acquire() as producer:
                    for _ in range(k):
                        app.send_task("bench.noop", args=[{}], queue=queue,
                                      producer=producer, priority=5)

            def drained() -> None:
                deadline = time.time() + 60
                while time.time() < deadline:
                    if not r.llen("bench.noop:5") and not r.hlen("unacked"):
                        return
                    time.sleep(0.05)
                raise TimeoutError("the no-op worker did not drain its queue")

            time.sleep(3)  # the worker connects
            send(20, "bench.noop")
            drained()
            time.sleep(1)
            s0, t0 = commandstats(r), time.monotonic()
            time.sleep(2)
            idle = (sum(c for c, _ in delta(commandstats(r), s0).values())
                    / (time.monotonic() - t0))
            s0 = commandstats(r)
            p0 = time.process_time()
            send(n, "bench.held")  # nobody consumes it
            pub_ms = (time.process_time() - p0) * 1000 / n
            s_pub = commandstats(r)
            w0, r0 = cpu_seconds(worker.pid), cpu_seconds(redis_proc.pid)
            send(n, "bench.noop")
            drained()
            w1, r1 = cpu_seconds(worker.pid), cpu_seconds(redis_proc.pid)
            s1 = commandstats(r)
            app.close()
        finally:
            if saved is None:
                os.environ.pop("FIBERMILL_REDIS_URL", None)
            else:
                os.environ["FIBERMILL_REDIS_URL"] = saved
            get_settings.cache_clear()
            stop([worker, redis_proc])
    pub = {k: c / n for k, (c, _) in delta(s_pub, s0).items()}
    both = {k: c / n for k, (c, _) in delta(s1, s_pub).items() if k not in ("llen", "hlen")}
    consume = {k: v - pub.get(k, 0) for k, v in both.items() if v - pub.get(k, 0) > 0.005}
    return {"n": n, "publish_by_cmd": pub, "consume_by_cmd": consume,
            "idle_commands_per_s": idle, "publish_cpu_ms": pub_ms,
            "worker_cpu_ms": (w1 - w0) * 1000 / n, "redis_cpu_ms": (r1 - r0) * 1000 / n,
            "total_per_message": sum(pub.values()) + sum(consume.values())}


def report(r: dict) -> list[str]:
    lines = [f"Bare Celery no-op task, {r['n']} messages (publish as shared/sending.py, consume "
             f"with the worker's settings): {r['total_per_message']:.1f} commands per message; "
             f"idle {r['idle_commands_per_s']:.1f} commands/s. CPU per message: publish "
             f"{r['publish_cpu_ms']:.2f} ms (sender), consume {r['worker_cpu_ms']:.2f} ms "
             f"(worker), Redis {r['redis_cpu_ms']:.2f} ms (publish and consume)", "",
             "| side | command | per message |", "|---|---|---|"]
    for side in ("publish", "consume"):
        for k, v in sorted(r[f"{side}_by_cmd"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {side} | {k} | {v:.2f} |")
    return lines
