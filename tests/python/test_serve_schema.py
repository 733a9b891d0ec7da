"""The server's /openapi.json and schema fuzzing against it (issue 23): the document describes every
route (bodies, answers, OpenAI error objects), and 2,000 generated requests (schemathesis, valid and
invalid data, derandomized) over all of them get no 5xx, no hang and no answer the document does not
describe. The fuzz loop is bench/schema_fuzz.py's, which also runs the 10,000-case version."""

from __future__ import annotations

import os
import sys

import httpx
import pytest
from serve_harness import LiveServer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from schema_fuzz import fuzz  # noqa: E402

MODEL = "dsv41rt-tiny-v41"
MAX_TOKENS = 4  # the server's limit, so that every generated generation is short
FUZZ_CASES = 2000
ROUTES = {
    ("get", "/health"),
    ("get", "/ready"),
    ("get", "/version"),
    ("get", "/metrics"),
    ("get", "/v1/models"),
    ("post", "/reset_prefix_cache"),
    ("post", "/tokenize"),
    ("post", "/detokenize"),
    ("post", "/v1/chat/completions"),
    ("post", "/v1/completions"),
    ("post", "/v1/responses"),
    ("post", "/v1/messages"),
    ("post", "/v1/messages/count_tokens"),
}
WITH_BODY = {(m, p) for m, p in ROUTES if m == "post" and p != "/reset_prefix_cache"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    limit = str(MAX_TOKENS)
    s = LiveServer(
        "--max-tokens-limit",
        limit,
        "--default-max-tokens",
        limit,
        model_dir=str(tmp_path_factory.mktemp("builtin") / "tiny"),
    )
    yield s
    assert s.stop() == 0, s.output()


def test_openapi_json_describes_every_route(server) -> None:
    r = httpx.get(server.url + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text[:300]
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    # A valid OpenAPI 3.1 document (the meta-schema schemathesis ships, with its JSON Schema validator).
    import jsonschema_rs
    from schemathesis.specs.openapi.definitions import OPENAPI_31

    jsonschema_rs.validator_for(OPENAPI_31).validate(doc)
    ops = {(m, p): op for p, methods in doc["paths"].items() for m, op in methods.items()}
    assert ROUTES <= set(ops), sorted(ROUTES - set(ops))
    for key in WITH_BODY:
        assert ops[key]["requestBody"]["content"]["application/json"]["schema"], key
    chat = ops[("post", "/v1/chat/completions")]["requestBody"]["content"]["application/json"]["schema"]
    assert chat["properties"]["model"]["enum"] == [MODEL]
    assert chat["properties"]["max_tokens"]["anyOf"][0]["maximum"] == MAX_TOKENS  # the server's own limit
    assert chat["additionalProperties"] is False  # an unknown field is a 400 naming it
    for (method, path), op in ops.items():
        for status, response in op["responses"].items():
            if status.startswith(("4", "5")) and "content" in response and path != "/ready":  # {"ready": false}
                error = "AnthropicError" if path.startswith("/v1/messages") else "Error"
                assert response["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{error}"}
        if (method, path) in WITH_BODY:
            assert {"400", "413", "415", "500", "503"} <= set(op["responses"]), (path, sorted(op["responses"]))
        assert "401" not in op["responses"] and "security" not in op, path  # this server has no key
    error = doc["components"]["schemas"]["Error"]["properties"]["error"]
    assert set(error["required"]) == {"message", "type", "param", "code"}
    for page in ("/docs", "/redoc"):  # no documentation pages, only the schema
        assert httpx.get(server.url + page, timeout=30).status_code == 404


def test_schema_fuzzing_2000_cases_no_5xx_no_hang_no_schema_violation(server) -> None:
    report = fuzz(server.url, FUZZ_CASES, request_timeout_s=30)
    print(report.summary())
    assert report.cases >= FUZZ_CASES, report.summary()
    fuzzed = {tuple(label.lower().split(" ", 1)) for label in report.cases_by_operation}
    assert ROUTES <= fuzzed, sorted(ROUTES - fuzzed)
    assert not report.failures, report.summary()
    assert not [s for s in report.statuses if s >= 500], report.statuses
    assert report.statuses.get(200, 0) >= 100, report.statuses  # generations were really served
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
