"""Schema fuzzing of a running `dsv41rt serve` (issue 23): schemathesis reads the server's own
/openapi.json and sends generated requests, valid and invalid ones, to every route; each response
must not be a 5xx, must have a status and body the schema documents, and must come back within a
per-request timeout (a hang is a failure, not a wait). Every route is also sent the methods it does
not serve: a 405 with an `Allow` header and an OpenAI error body.

Against a server you started:  python bench/schema_fuzz.py --url http://127.0.0.1:8000 --cases 10000
Starting its own (the built-in tiny model on CPU, max_tokens capped at 4 so generations stay short):
                                 python bench/schema_fuzz.py --cases 10000

The cases are shared out over the routes and the two modes (valid data, invalid data); a route
whose requests have few distinct forms (a GET without parameters) runs as many as Hypothesis can
tell apart. Deterministic: Hypothesis derandomized (or --seed). tests/python/test_serve_schema.py
runs `fuzz` with 2,000 cases.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
HTTP_METHODS = ("get", "post", "put", "patch", "delete")
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


@dataclass(frozen=True)
class FuzzFailure:
    operation: str  # e.g. "POST /v1/completions"
    kind: str  # the check that failed, "hang" or "wrong method"
    detail: str  # the check's message and a curl line that reproduces it


@dataclass
class FuzzReport:
    cases_by_operation: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)  # status -> responses
    failures: list[FuzzFailure] = field(default_factory=list)
    wrong_method_probes: int = 0  # requests with a method the path does not serve (not cases)
    seconds: float = 0.0

    @property
    def cases(self) -> int:
        return sum(self.cases_by_operation.values())

    def summary(self) -> str:
        lines = [
            f"{self.cases} cases and {self.wrong_method_probes} wrong-method probes in {self.seconds:.1f} s, "
            f"{len(self.failures)} failures"
        ]
        lines += [f"  {op}: {n}" for op, n in sorted(self.cases_by_operation.items())]
        lines.append("  statuses: " + ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items())))
        for f in self.failures[:20]:
            lines.append(f"FAIL {f.operation} [{f.kind}]\n{f.detail}")
        return "\n".join(lines)


def _run_examples(strategy: Any, examples: int, seed: int | None, on_case: Callable[[Any], None]) -> None:
    """`on_case` on up to `examples` cases of `strategy`: generation only (no shrinking, no
    database), no deadline, derandomized unless a seed is given."""
    settings = hypothesis.settings(
        max_examples=examples,
        derandomize=seed is None,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    test = hypothesis.given(strategy)(on_case)
    if seed is not None:
        test = hypothesis.seed(seed)(test)
    settings(test)()


def fuzz(
    base_url: str,
    cases: int,
    *,
    request_timeout_s: float = 30.0,
    headers: dict[str, str] | None = None,
    seed: int | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> FuzzReport:
    """About `cases` generated requests over every operation of the server's /openapi.json."""
    report = FuzzReport()
    started = time.monotonic()
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", timeout=request_timeout_s)
    operations = [result.ok() for result in schema.get_all_operations()]
    session = requests.Session()
    # Strategies first: each (operation, mode) that can produce a case gets an equal share.
    plans = []
    for op in operations:
        for mode in MODES:
            # An operation without a body or parameters has no invalid form to generate.
            if mode is GenerationMode.NEGATIVE and not (len(op.body) or len(op.query) or len(op.headers)):
                continue
            plans.append((op, mode, op.as_strategy(generation_mode=mode)))
    for i, (op, mode, strategy) in enumerate(plans):
        # What the routes before could not use (a GET without parameters has one case) goes on.
        share = -(-(cases - report.cases) // (len(plans) - i))
        before = report.cases
        run = _case_runner(op.label, base_url, session, headers, request_timeout_s, report)
        _run_examples(strategy, max(share, 1), seed, run)
        log(f"{op.label} ({mode.value}): {report.cases - before} cases, {len(report.failures)} failures so far")
    _check_wrong_methods(base_url, schema.raw_schema["paths"], session, headers, request_timeout_s, report)
    report.seconds = time.monotonic() - started
    return report


def _case_runner(
    label: str,
    base_url: str,
    session: requests.Session,
    headers: dict[str, str] | None,
    timeout_s: float,
    report: FuzzReport,
) -> Callable[[Any], None]:
    """Send one generated case and record its status and any failed check into `report`."""

    def run(case: Any) -> None:
        report.cases_by_operation[label] = report.cases_by_operation.get(label, 0) + 1
        try:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=timeout_s)
        except requests.Timeout:
            curl = case.as_curl_command(headers=headers)
            report.failures.append(FuzzFailure(label, "hang", f"no response in {timeout_s} s\n{curl}"))
            return
        report.statuses[response.status_code] = report.statuses.get(response.status_code, 0) + 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (FailureGroup, AssertionError) as err:  # the failed checks (a Failure is an AssertionError)
            report.failures.append(FuzzFailure(label, type(err).__name__, str(err)[:3000]))

    return run


def _check_wrong_methods(
    base_url: str,
    paths: dict[str, dict[str, Any]],
    session: requests.Session,
    headers: dict[str, str] | None,
    timeout_s: float,
    report: FuzzReport,
) -> None:
    """Each path with each method it does not serve: 405, `Allow` naming the served methods
    (RFC 9110), an OpenAI error body."""
    for path, methods in paths.items():
        served = {m for m in methods if m in HTTP_METHODS}
        for method in HTTP_METHODS:
            if method in served:
                continue
            label = f"{method.upper()} {path}"
            r = session.request(method, base_url + path, headers=headers, timeout=timeout_s)
            report.wrong_method_probes += 1
            report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
            allow = {m.strip().lower() for m in r.headers.get("allow", "").split(",") if m.strip()}
            if r.status_code != 405 or not served <= allow or not _is_error_object(r):
                detail = f"{r.status_code} allow={r.headers.get('allow')!r} body={r.text[:300]!r}"
                report.failures.append(FuzzFailure(label, "wrong method", detail))


def _is_error_object(r: requests.Response) -> bool:
    try:
        err = r.json().get("error")
    except ValueError:
        return False
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start the built-in tiny model)")
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: derandomized)")
    ap.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--out", help="write the report as JSON here")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    server = None
    url = args.url
    if url is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
        from serve_harness import LiveServer

        server = LiveServer("--max-tokens-limit", "4", "--default-max-tokens", "4")
        url = server.url
    try:
        report = fuzz(url, args.cases, request_timeout_s=args.timeout, headers=headers, seed=args.seed, log=print)
    finally:
        if server is not None:
            code = server.stop()
            if code != 0:
                print(f"server exited with {code}:\n{server.output()[-3000:]}")
    print(report.summary())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "cases": report.cases,
                    "wrong_method_probes": report.wrong_method_probes,
                    "seconds": round(report.seconds, 1),
                    "cases_by_operation": report.cases_by_operation,
                    "statuses": {str(k): v for k, v in sorted(report.statuses.items())},
                    "failures": [f.__dict__ for f in report.failures],
                },
                f,
                indent=1,
            )
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
