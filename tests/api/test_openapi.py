"""The OpenAPI document and /docs: every field described, an example request per task that
the API accepts, every error answer documented with its body, and pages that need no network."""

import re

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.inputs import validate_input
from shared.job import JobRequest
from shared.registry import load_registry


@pytest.fixture
def client(settings_env):
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def doc(client) -> dict:
    return client.get("/openapi.json").json()


def test_every_field_of_every_schema_is_described(doc):
    missing = [f"{name}.{field}" for name, schema in doc["components"]["schemas"].items()
               for field, prop in schema.get("properties", {}).items()
               if not prop.get("description")]
    assert missing == []


def test_the_job_requests_input_names_both_task_inputs(doc):
    schemas = doc["components"]["schemas"]
    refs = {r["$ref"] for r in schemas["JobRequest"]["properties"]["input"]["anyOf"]}
    assert refs == {"#/components/schemas/TextGenerationInput",
                    "#/components/schemas/ImageGenerationInput"}
    assert {"max_new_tokens", "temperature"} <= set(schemas["TextGenerationInput"]["properties"])
    assert {"steps", "width"} <= set(schemas["ImageGenerationInput"]["properties"])


def test_each_example_request_is_one_the_api_accepts(doc, model_dir):
    registry = load_registry(model_dir / "registry.yaml")
    examples = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"][
        "application/json"]["examples"]
    tasks = set()
    for name, example in examples.items():
        req = JobRequest.model_validate(example["value"])
        spec = registry.get(req.model)
        validate_input(spec, req.input)  # raises on any problem
        assert req.task in (None, spec.task), name
        tasks.add(spec.task)
    assert tasks == {"text-generation", "image-generation"}


def test_every_error_answer_is_documented_with_its_body(doc):
    expected = {("post", "/v1/jobs"): {"401", "409", "413", "422", "429", "503"},
                ("get", "/v1/jobs/{job_id}"): {"401", "404"},
                ("get", "/v1/jobs/{job_id}/events"): {"401", "404", "429"},
                ("get", "/v1/jobs/{job_id}/outputs/{index}"): {"401", "404"},
                ("get", "/v1/models"): {"401"}, ("get", "/readyz"): {"503"}}
    for (method, path), statuses in expected.items():
        answers = doc["paths"][path][method]["responses"]
        assert statuses <= set(answers), (method, path, sorted(answers))
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            for status, answer in op["responses"].items():
                if int(status) < 400:
                    continue
                content = answer["content"]["application/json"]
                assert answer["description"] and ("schema" in content or "example" in content), (
                    method, path, status)


@pytest.mark.parametrize(("page", "asset"), [("/docs", "swagger-ui-bundle.js"),
                                             ("/redoc", "redoc.standalone.js")])
def test_the_docs_pages_load_nothing_from_another_host(client, page, asset):
    html = client.get(page).text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert urls and all(u.startswith("/") for u in urls), urls
    assert any(u.endswith(asset) for u in urls)
    assert "http://" not in html and "https://" not in html
    for url in urls:
        answer = client.get(url)
        assert answer.status_code == 200, url
        assert len(answer.content) > 1000, url
