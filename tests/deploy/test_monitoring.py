"""The Prometheus Operator monitors (monitoring.coreos.com/v1) select the right objects and
name real ports and paths."""

from tests.deploy import k8s
from tests.deploy.facts import api_routes
from tests.deploy.k8s import api, worker

SERVICE_MONITOR_FIELDS = {"selector", "endpoints", "namespaceSelector", "jobLabel"}
POD_MONITOR_FIELDS = {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel"}
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}


def test_service_monitor_scrapes_the_api_service(rendered):
    monitor = k8s.one(rendered, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    assert set(spec) <= SERVICE_MONITOR_FIELDS
    services = [
        s
        for s in k8s.find(rendered, "Service")
        if k8s.matches(spec["selector"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in services] == [api(rendered)["metadata"]["name"]]
    (service,) = services
    assert k8s.selected_workloads(rendered, service["spec"]["selector"]) == [api(rendered)]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    (endpoint,) = spec["endpoints"]
    assert set(endpoint) <= ENDPOINT_FIELDS
    assert endpoint["port"] in ports, "a ServiceMonitor names the Service port"
    container = k8s.main_container(api(rendered))
    assert k8s.container_port(container, ports[endpoint["port"]]["targetPort"]) == 8000
    assert endpoint["path"] == "/metrics" and "/metrics" in api_routes()


def test_pod_monitor_scrapes_the_workers(rendered):
    monitor = k8s.one(rendered, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    assert set(spec) <= POD_MONITOR_FIELDS
    assert k8s.selected_workloads(rendered, spec["selector"]) == [worker(rendered)]
    (endpoint,) = spec["podMetricsEndpoints"]
    assert set(endpoint) <= ENDPOINT_FIELDS
    container = k8s.main_container(worker(rendered))
    assert k8s.container_port(container, endpoint["port"]) == 9100
    assert endpoint["path"] == "/metrics"


def test_monitors_scrape_in_their_own_namespace(rendered):
    for kind in ("ServiceMonitor", "PodMonitor"):
        monitor = k8s.one(rendered, kind)
        assert "namespaceSelector" not in monitor["spec"]  # default: the monitor's namespace
