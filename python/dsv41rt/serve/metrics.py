"""Prometheus metrics: the `dsv41rt:` prefix with vLLM's metric names and labels (model_name),
histograms in seconds, plus V4.1 series (dequant workspace reuse)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class _EngineCollector(Collector):
    """Series read from the engine's counters at scrape time."""

    def __init__(self, model: str, stats: Callable[[], dict[str, int]]) -> None:
        self.model, self.stats = model, stats

    def collect(self) -> Iterator:
        s = self.stats()
        labels = ["model_name"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"dsv41rt:{name}", doc, labels=labels)
            g.add_metric([self.model], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"dsv41rt:{name}", doc, labels=labels)
            c.add_metric([self.model], value)
            return c

        yield gauge("num_requests_running", "Requests in the running batch.", s.get("running", 0))
        yield gauge("num_requests_waiting", "Requests waiting to be admitted.", s.get("waiting", 0))
        total = max(s.get("pages_total", 0), 1)
        yield gauge(
            "kv_cache_usage_perc", "Fraction of KV pool pages in use (1 = full).", s.get("pages_used", 0) / total
        )
        yield counter("num_preemptions", "Requests preempted (recomputed later).", s.get("preemptions", 0))
        yield counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache (each request once).",
            s.get("prefix_cache_queries", 0),
        )
        yield counter("prefix_cache_hits", "Prompt tokens served by the prefix cache.", s.get("prefix_cache_hits", 0))
        # The host tier (host-cache-memory): pages evicted from the pool into host memory and brought back.
        yield counter(
            "prefix_cache_host_offloaded_pages",
            "KV pages the prefix cache copied to host memory on eviction.",
            s.get("prefix_cache_offloaded_pages", 0),
        )
        yield counter(
            "prefix_cache_host_restored_pages",
            "KV pages the prefix cache brought back from host memory for a hit.",
            s.get("prefix_cache_restored_pages", 0),
        )
        yield counter(
            "prefix_cache_host_offloaded_snapshots",
            "Prefix snapshots evicted alone (a slot was needed) that the prefix cache copied to host memory.",
            s.get("prefix_cache_offloaded_snapshots", 0),
        )
        yield counter(
            "prefix_cache_host_restored_snapshots",
            "Prefix snapshots the prefix cache brought back from host memory for a hit.",
            s.get("prefix_cache_restored_snapshots", 0),
        )
        yield gauge(
            "prefix_cache_host_bytes",
            "Host memory the prefix cache's host tier holds.",
            s.get("prefix_cache_host_bytes", 0),
        )
        yield counter(
            "dequant_reuse_hits",
            "Compressed-KV workspace acquires served without dequantising.",
            s.get("reuse_hits", 0),
        )
        yield counter(
            "model_tokens_computed",
            "Positions run through the model: prompts, decodes and recomputation (not prefix-cache hits).",
            s.get("tokens_computed", 0),
        )
        yield counter("dequant_calls", "Compressed-KV workspace refills (dequantisations).", s.get("dequant_calls", 0))
        # Speculative decoding (speculative-config), vLLM's series: zeros when it is off.
        yield counter(
            "spec_decode_num_drafts",
            "Verify steps that checked at least one draft token.",
            s.get("spec_decode_drafts", 0),
        )
        yield counter(
            "spec_decode_num_draft_tokens", "Draft tokens the target verified.", s.get("spec_decode_draft_tokens", 0)
        )
        yield counter(
            "spec_decode_num_accepted_tokens",
            "Draft tokens the target accepted.",
            s.get("spec_decode_accepted_tokens", 0),
        )
        per_pos = CounterMetricFamily(
            "dsv41rt:spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose token at this position (0-based) the target accepted.",
            labels=[*labels, "position"],
        )
        prefix = "spec_decode_accepted_pos_"
        positions = sorted(int(k[len(prefix) :]) for k in s if k.startswith(prefix))
        for j in positions:
            per_pos.add_metric([self.model, str(j)], s[f"{prefix}{j}"])
        yield per_pos


class Metrics:
    def __init__(self, model: str, stats: Callable[[], dict[str, int]], handoff_transport: str = "nixl") -> None:
        self.model = model
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]
        self.success = Counter("dsv41rt:request_success", "Finished requests.", m + ["finished_reason"], registry=r)
        self.rejections = Counter("dsv41rt:admission_rejections", "Requests refused.", m + ["reason"], registry=r)
        self.prompt_tokens = Counter("dsv41rt:prompt_tokens", "Prompt tokens of admitted requests.", m, registry=r)
        self.generation_tokens = Counter("dsv41rt:generation_tokens", "Generated tokens.", m, registry=r)
        self.ttft = Histogram(
            "dsv41rt:time_to_first_token_seconds", "Time to first token.", m, buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "dsv41rt:inter_token_latency_seconds", "Time between output tokens.", m, buckets=ITL_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "dsv41rt:request_time_per_output_token_seconds",
            "Decode time per output token.",
            m,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "dsv41rt:e2e_request_latency_seconds", "Arrival to last token.", m, buckets=E2E_BUCKETS, registry=r
        )
        # Disaggregation (serve/disaggregation.py): request states a decode server fetched.
        # `transport`: "nixl" (manifest over HTTP, state READ with NIXL) or "http" (state in the answer).
        t = [*m, "transport"]
        self.handoff_bytes = Counter(
            "dsv41rt:handoff_received_bytes", "Request state bytes fetched from prefill servers.", t, registry=r
        )
        self.handoff_time = Histogram(
            "dsv41rt:handoff_transfer_seconds",
            "Time to fetch one request's state from its prefill server.",
            t,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.handoff_bytes.labels(model, handoff_transport)  # zeros before the first handoff
        self.handoff_time.labels(model, handoff_transport)
        r.register(_EngineCollector(model, stats))

    def watch_lent_states(self, count: Callable[[], int]) -> None:
        """Prefill servers with the NIXL transport: states held in registered memory now (lent and
        not yet read, dropped or expired); back to 0 when the decode servers have read them all."""
        g = Gauge(
            "dsv41rt:handoff_lent_states",
            "Request states in NIXL-registered memory.",
            ["model_name"],
            registry=self.registry,
        )
        g.labels(self.model).set_function(count)

    def handoff_received(self, size: int, seconds: float, transport: str) -> None:
        self.handoff_bytes.labels(self.model, transport).inc(size)
        self.handoff_time.labels(self.model, transport).observe(seconds)

    def finished(
        self,
        reason: str,
        prompt_tokens: int,
        generated: int,
        arrival: float,
        first: float | None,
        last: float | None,
        gaps: list[float],
    ) -> None:
        m = self.model
        self.success.labels(m, reason).inc()
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(generated)
        if first is not None:
            self.ttft.labels(m).observe(first - arrival)
            for g in gaps:
                self.itl.labels(m).observe(g)
            if last is not None:
                self.e2e.labels(m).observe(last - arrival)
                if generated > 1:
                    self.tpot.labels(m).observe((last - first) / (generated - 1))

    def rejected(self, reason: str) -> None:
        self.rejections.labels(self.model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
