"""Generated requests against the tenant routes (files, batches, webhook secrets, usage):
whatever a caller sends that the schema admits, the answer is never a 5xx. Schemathesis
generates the requests from the API's own OpenAPI document."""

import hypothesis
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck

from services.api.app import create_app

TENANT_ROUTES = r"^/v1/(files|batches|webhook-secret|usage)"
EXAMPLES = 30  # per operation


def _fuzz(operation, failures: list[str]) -> int:
    """Call `operation` with EXAMPLES generated requests; how many were sent."""
    sent = 0

    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                         database=None, suppress_health_check=list(HealthCheck))
    def call(case):
        nonlocal sent
        response = case.call()
        sent += 1
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path}: "
                            f"{response.status_code} {response.text[:300]}")

    call()
    return sent


def test_no_generated_request_gets_a_server_error(settings_env):
    with TestClient(create_app()) as client:  # the app's lifespan runs: Redis, the store
        schema = schemathesis.openapi.from_asgi("/openapi.json", client.app).include(
            path_regex=TENANT_ROUTES)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 8, [op.label for op in operations]
        failures: list[str] = []
        sent = {op.label: _fuzz(op, failures) for op in operations}
        assert not failures, failures
        assert all(sent.values()), sent
