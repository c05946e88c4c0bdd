"""Redis with Sentinel in deploy/k8s: three pods, each a data node and a sentinel; the role
each node takes at start (the scripts run for real, with the cluster's DNS and peers stubbed);
the sentinel configuration loaded by a real sentinel against a real primary started with the
StatefulSet's options; the clients' settings and the disruption budget."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis as redis_py

from services.devstack.redis_server import find_redis_server
from tests.deploy import k8s
from tests.deploy.k8s import api, redis, worker

PASSWORD = "pw"


@pytest.fixture(params=["base", "overlay"])
def objects(request, base, overlay):
    return base if request.param == "base" else overlay


def pod_names(objects) -> list[str]:
    sts = redis(objects)
    name, replicas = sts["metadata"]["name"], sts["spec"]["replicas"]
    return [f"{name}-{i}.{sts['spec']['serviceName']}" for i in range(replicas)]


def script_texts(objects) -> dict[str, str]:
    return k8s.one(objects, "ConfigMap", "fibermill-redis-scripts")["data"]


def shell_value(text: str, name: str) -> str:
    """`NAME=value` or `NAME="value"` at the start of a line of a script."""
    m = re.search(rf'^{name}="?([^"\n]*)"?$', text, re.M)
    assert m, f"{name} is not set"
    return m.group(1)


# --- topology -----------------------------------------------------------------------------------


def test_three_redis_pods_each_with_a_sentinel(objects):
    sts = redis(objects)
    assert sts["spec"]["replicas"] == 3
    assert [c["name"] for c in k8s.pod_spec(sts)["containers"]] == ["redis", "sentinel"]
    assert k8s.workload_port(sts, "sentinel") == 26379
    # the scripts' peers are exactly the StatefulSet's pods
    common = script_texts(objects)["common.sh"]
    peers = shell_value(common, "PEERS").split()
    headless = shell_value(common, "HEADLESS")
    assert [f"{p}.{headless}" for p in peers] == pod_names(objects)


def test_headless_service_publishes_pods_before_they_are_ready(objects):
    """Replicas and sentinels resolve each other's names while they start."""
    sts = redis(objects)
    headless = k8s.one(objects, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["port"] for p in headless["spec"]["ports"]} == {6379, 26379}


def test_sentinel_service_reaches_the_sentinels(objects):
    service = k8s.one(objects, "Service", "fibermill-redis-sentinel")
    assert k8s.selected_workloads(objects, service["spec"]["selector"]) == [redis(objects)]
    assert [p["port"] for p in service["spec"]["ports"]] == [26379]
    # no load-balanced data port: it would reach replicas, which refuse writes
    for s in k8s.find(objects, "Service"):
        if s["spec"].get("clusterIP") != "None":
            assert 6379 not in [p["port"] for p in s["spec"]["ports"]], s["metadata"]["name"]


def test_disruption_budget_and_spread_keep_the_quorum(objects):
    sts = redis(objects)
    pdb = k8s.one(objects, "PodDisruptionBudget", sts["metadata"]["name"])
    assert k8s.selected_workloads(objects, pdb["spec"]["selector"]) == [sts]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert sts["spec"]["replicas"] - pdb["spec"]["maxUnavailable"] >= 2  # quorum left
    (term,) = k8s.pod_spec(sts)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = k8s.pod_template(sts)["metadata"]["labels"]
    assert k8s.matches(term["podAffinityTerm"]["labelSelector"], labels)


# --- the clients ----------------------------------------------------------------------------------


@pytest.mark.parametrize("component", ["api", "worker"])
def test_clients_ask_all_three_sentinels_with_the_secret(objects, component):
    sts = redis(objects)
    w = api(objects) if component == "api" else worker(objects)
    container = k8s.main_container(w)
    addresses = k8s.setting(objects, container, "sentinel_addresses")
    assert sorted(addresses) == sorted((name, 26379) for name in pod_names(objects))
    sentinel = k8s.container_named(sts, "sentinel")
    assert {port for _, port in addresses} == {k8s.container_port(sentinel, "sentinel")}
    master = shell_value(script_texts(objects)["common.sh"], "MASTER")
    assert k8s.setting(objects, container, "redis_sentinel_master") == master
    # the sentinels' requirepass is the Secret key the clients get
    env = {v["name"]: v for v in k8s.env_list(container)}
    ref = env["FIBERMILL_REDIS_SENTINEL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    server = {v["name"]: v for v in k8s.env_list(sentinel)}["REDIS_PASSWORD"]
    assert server["valueFrom"]["secretKeyRef"] == ref
    assert k8s.setting(objects, container, "replicas_to_wait") >= 1


# --- the scripts, run -----------------------------------------------------------------------------


def run_script(
    objects,
    tmp_path: Path,
    name: str,
    pod: str,
    primary: str | None,
    args: list[str] | tuple[str, ...] = (),
    cli: str | None = None,
) -> list[str]:
    """Run a role script as the pod `pod` would, the sentinels answering `primary` (None: no
    sentinel answers), or redis-cli replaced by the shell code `cli`. redis-server is a stub
    that records its arguments."""
    scripts, sentinel_dir, bin_dir = tmp_path / "scripts", tmp_path / "sentinel", tmp_path / "bin"
    for d in (scripts, sentinel_dir, bin_dir):
        d.mkdir(exist_ok=True)
    for file, text in script_texts(objects).items():
        text = text.replace("/scripts/", f"{scripts}/").replace(" /sentinel", f" {sentinel_dir}")
        (scripts / file).write_text(text)
    stubs = {
        "hostname": f"echo {pod}",
        "getent": "exit 0",
        "redis-cli": cli
        or (f"echo {primary}" if primary else "echo 'Could not connect' >&2; exit 1"),
        "redis-server": f'printf "%s\\n" "$@" > {tmp_path}/argv',
    }
    for stub, body in stubs.items():
        (bin_dir / stub).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / stub).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REDIS_PASSWORD": PASSWORD}
    subprocess.run(
        ["sh", str(scripts / name), *args], env=env, check=True, timeout=30, capture_output=True
    )
    argv = tmp_path / "argv"
    return argv.read_text().splitlines() if argv.exists() else []


@pytest.mark.parametrize(
    ("pod", "sentinels_say", "replica_of"),
    [
        (0, None, None),  # first start: pod 0 leads
        (1, None, 0),  # first start: the others follow pod 0
        (0, 2, 2),  # the old primary restarts after a failover: it follows the new one
        (2, 2, None),  # the primary restarts before the sentinels noticed: it stays primary
    ],
)
def test_a_node_asks_the_sentinels_before_choosing_its_role(
    base, tmp_path, pod, sentinels_say, replica_of
):
    names = pod_names(base)
    argv = run_script(
        base,
        tmp_path,
        "redis.sh",
        names[pod].split(".")[0],
        names[sentinels_say] if sentinels_say is not None else None,
        ["--port", "6379"],
    )
    assert argv[:2] == ["--port", "6379"], "the container's options come first"
    options = dict(zip(argv[::2], argv[1::2], strict=False))
    assert options["--replica-announce-ip"] == names[pod]
    if replica_of is None:
        assert "--replicaof" not in argv
    else:
        i = argv.index("--replicaof")
        assert argv[i + 1 : i + 3] == [names[replica_of], "6379"]


def test_a_primary_being_stopped_hands_over_first(base, tmp_path):
    """preStop: the primary asks another pod's sentinel (its own is stopping too) for a
    failover, and returns once it is a replica; a replica returns at once."""
    names = pod_names(base)
    asked = tmp_path / "asked"
    cli = f"""case "$*" in
  *"sentinel failover"*) echo "$*" >> {asked}; echo OK ;;
  *role*) if [ -f {asked} ]; then echo slave; else echo master; fi ;;
esac"""
    run_script(base, tmp_path, "prestop.sh", names[0].split(".")[0], None, cli=cli)
    (line,) = asked.read_text().splitlines()
    assert line.startswith(f"-h {names[1]} -p 26379 sentinel failover fibermill"), line
    asked.unlink()
    replica = cli.replace("echo master", "echo slave")
    run_script(base, tmp_path, "prestop.sh", names[0].split(".")[0], None, cli=replica)
    assert not asked.exists()


def sentinel_conf(objects, tmp_path: Path, pod: int, sentinels_say: int | None) -> str:
    names = pod_names(objects)
    argv = run_script(
        objects,
        tmp_path,
        "sentinel.sh",
        names[pod].split(".")[0],
        names[sentinels_say] if sentinels_say is not None else None,
    )
    assert argv[1:] == ["--sentinel"]
    return Path(argv[0]).read_text()


def test_sentinel_monitors_the_primary_with_a_quorum_of_two(base, tmp_path):
    names = pod_names(base)
    conf = sentinel_conf(base, tmp_path, 1, None)
    lines = conf.splitlines()
    assert f"sentinel monitor fibermill {names[0]} 6379 2" in lines
    assert "sentinel down-after-milliseconds fibermill 5000" in lines
    assert "sentinel failover-timeout fibermill 60000" in lines
    assert f"sentinel auth-pass fibermill {PASSWORD}" in lines
    assert f"requirepass {PASSWORD}" in lines
    assert f"sentinel announce-ip {names[1]}" in lines
    # hostnames are resolved and announced, before the monitor line that names one
    monitor = lines.index(f"sentinel monitor fibermill {names[0]} 6379 2")
    assert lines.index("sentinel resolve-hostnames yes") < monitor
    assert "sentinel announce-hostnames yes" in lines
    # after a failover, a restarted sentinel monitors the primary its peers name
    again = sentinel_conf(base, tmp_path, 0, 2)
    assert f"sentinel monitor fibermill {names[2]} 6379 2" in again.splitlines()


# --- real processes -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float = 15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            result = check()
            if result:
                return result
        except redis_py.RedisError:
            pass
        time.sleep(0.1)
    raise AssertionError("timed out")


def node_argv(objects, port: int, data: Path) -> list[str]:
    """redis-server with the StatefulSet's options, on a local port and directory."""
    container = k8s.container_named(redis(objects), "redis")
    subst = {"$(REDIS_PASSWORD)": PASSWORD, "$(REDIS_APPENDFSYNC)": "everysec"}
    args = [subst.get(a, a) for a in container["args"]]
    args[args.index("--port") + 1] = str(port)
    args[args.index("--dir") + 1] = str(data)
    data.mkdir(parents=True)
    return [find_redis_server(), *args, "--bind", "127.0.0.1", "--save", ""]


def test_a_real_sentinel_loads_the_config_and_an_isolated_primary_refuses_writes(base, tmp_path):
    names = pod_names(base)
    conf = sentinel_conf(base, tmp_path, 0, None)
    p_port, r_port, s_port = free_port(), free_port(), free_port()
    conf = (
        conf.replace(f"{names[0]} 6379", f"127.0.0.1 {p_port}")
        .replace("port 26379", f"port {s_port}")
        .replace(f"announce-ip {names[0]}", "announce-ip 127.0.0.1")
    )
    conf += "bind 127.0.0.1\n"
    (tmp_path / "s.conf").write_text(conf)
    procs = []
    try:
        procs.append(
            subprocess.Popen(node_argv(base, p_port, tmp_path / "p"), stdout=subprocess.DEVNULL)
        )
        primary = redis_py.Redis(port=p_port, password=PASSWORD)
        wait_until(primary.ping)
        # no replica: min-replicas-to-write refuses the write
        with pytest.raises(redis_py.ResponseError, match="NOREPLICAS"):
            primary.set("k", "v")
        procs.append(
            subprocess.Popen(
                [*node_argv(base, r_port, tmp_path / "r"), "--replicaof", "127.0.0.1", str(p_port)],
                stdout=subprocess.DEVNULL,
            )
        )
        wait_until(lambda: primary.set("k", "v"))
        assert primary.wait(1, 2000) == 1
        procs.append(
            subprocess.Popen(
                [find_redis_server(), str(tmp_path / "s.conf"), "--sentinel"],
                stdout=subprocess.DEVNULL,
            )
        )
        sentinel = redis_py.Redis(port=s_port, password=PASSWORD, decode_responses=True)
        master = wait_until(lambda: sentinel.sentinel_master("fibermill"))
        assert (master["ip"], master["port"]) == ("127.0.0.1", p_port)
        assert master["quorum"] == 2
        assert master["down-after-milliseconds"] == 5000
        assert master["failover-timeout"] == 60000
        wait_until(lambda: sentinel.sentinel_slaves("fibermill"))
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=s_port).ping()
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(10)
