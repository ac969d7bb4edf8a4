"""Load test of `specgraft serve`: N concurrent streaming clients for a fixed time, per concurrency level.

Each client sends one request at a time (streaming, ``stream_options.include_usage``) and the
next as soon as its stream ends; prompts are the first turns of a prompt suite
(``specgraft/suites.py``) in a fixed rotation, chat-templated where the suite says so. A level
issues requests for ``--duration`` seconds, then waits for those in flight; its throughput is
over the whole level (first request sent to last response finished). Reported per level:
requests/s, generated tokens/s, latency and time-to-first-token percentiles (p50/p99), errors;
and from the server's ``/metrics`` over the level: batched steps, mean batch size, MAT and time
per step. Writes ``load.json`` and a plot of throughput (and p50/p99 latency) against
concurrency, one line per method; prints a markdown table.

Against a running server::

    python benchmarks/tools/load_test.py --url http://127.0.0.1:8000 --concurrency 1,2,4,8 --duration 60 --out benchmarks/experiments/batching/raw/load

Or starting one server per method (``specgraft serve`` in a subprocess, stopped at the end)::

    python benchmarks/tools/load_test.py --model smollm2-135m-instruct --methods ar,pld,recycling --max-batch 8 \\
        --concurrency 1,2,4,8,16 --duration 60 --threads 2 --out benchmarks/experiments/batching/raw/load

``--ignore-eos`` makes every request generate ``--max-tokens`` tokens (equal work per request
whatever the method, so tokens/s compare); greedy by default (``--temperature``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from specgraft.serve.metrics import parse
from specgraft.suites import load_suite


@dataclass
class RequestResult:
    start: float
    end: float
    first_token: float | None
    completion_tokens: int
    error: str | None = None


@dataclass
class LevelResult:
    method: str
    concurrency: int
    duration_s: float
    requests: int
    errors: int
    requests_per_s: float
    tokens_per_s: float
    latency_p50_s: float | None
    latency_p99_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    mean_completion_tokens: float
    server: dict = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile.

    >>> percentile([4.0, 1.0, 3.0, 2.0], 50), percentile([4.0, 1.0, 3.0, 2.0], 99), percentile([], 50)
    (2.0, 4.0, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100)
    return ordered[int(rank) - 1]


def request_bodies(suite: str, model: str, max_tokens: int, temperature: float, ignore_eos: bool) -> list[tuple[str, dict]]:
    """(path, body) of every prompt's first turn, in suite order."""
    out = []
    for p in load_suite(suite).prompts:
        body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
        if p.chat:
            out.append(("/v1/chat/completions", body | {"messages": [{"role": "user", "content": p.turns[0]}]}))
        else:
            out.append(("/v1/completions", body | {"prompt": p.turns[0]}))
    return out


async def one_request(client: httpx.AsyncClient, path: str, body: dict) -> RequestResult:
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return RequestResult(start, time.perf_counter(), None, 0, f"HTTP {r.status_code}: {r.text[:200]}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    return RequestResult(start, time.perf_counter(), first, tokens, chunk["error"]["message"])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif first is None and chunk["choices"] and _text(chunk["choices"][0]):
                    first = time.perf_counter()  # chat's first chunk carries only the role
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        return RequestResult(start, time.perf_counter(), first, tokens, f"{type(e).__name__}: {e}")
    return RequestResult(start, time.perf_counter(), first, tokens)


def _text(choice: dict) -> str:
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


async def run_level(url: str, bodies: list[tuple[str, dict]], concurrency: int, duration: float, timeout: float) -> tuple[list[RequestResult], float]:
    """``concurrency`` clients, each sending its next request when the last ends, until ``duration``
    has passed; returns every request and the level's wall time."""
    results: list[RequestResult] = []
    counter = iter(range(1 << 62))
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        stop_at = t0 + duration

        async def user() -> None:
            while time.perf_counter() < stop_at:
                path, body = bodies[next(counter) % len(bodies)]
                results.append(await one_request(client, path, body))

        await asyncio.gather(*(user() for _ in range(concurrency)))
        return results, time.perf_counter() - t0


async def warm_up(url: str, request: tuple[str, dict], timeout: float) -> None:
    """One request, not measured (first-call allocations, the server's kernels)."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        result = await one_request(client, *request)
    if result.error is not None:
        raise RuntimeError(f"the warm-up request failed: {result.error}")


def summarize(method: str, concurrency: int, results: list[RequestResult], wall: float, server: dict) -> LevelResult:
    ok = [r for r in results if r.error is None]
    tokens = sum(r.completion_tokens for r in ok)
    return LevelResult(
        method=method, concurrency=concurrency, duration_s=round(wall, 3), requests=len(ok), errors=len(results) - len(ok),
        requests_per_s=len(ok) / wall, tokens_per_s=tokens / wall,
        latency_p50_s=percentile([r.end - r.start for r in ok], 50), latency_p99_s=percentile([r.end - r.start for r in ok], 99),
        ttft_p50_s=percentile([r.first_token - r.start for r in ok if r.first_token], 50),
        ttft_p99_s=percentile([r.first_token - r.start for r in ok if r.first_token], 99),
        mean_completion_tokens=tokens / len(ok) if ok else 0.0, server=server,
        error_samples=sorted({r.error for r in results if r.error})[:5],
    )


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """What the server did during a level, from two ``/metrics`` snapshots."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = d.get("specgraft_steps_total", 0.0)
    req_steps = sum(v for k, v in d.items() if k.startswith("specgraft_request_steps_total"))
    req_tokens = sum(v for k, v in d.items() if k.startswith("specgraft_request_tokens_total"))
    return {
        "steps": int(steps),
        "mean_batch_size": d.get("specgraft_sequence_steps_total", 0.0) / steps if steps else None,
        "mean_step_s": d.get("specgraft_step_seconds_sum", 0.0) / d["specgraft_step_seconds_count"] if d.get("specgraft_step_seconds_count") else None,
        "mat": req_tokens / req_steps if req_steps else None,
        "requests_by_outcome": {k.split('"')[1]: int(v) for k, v in d.items() if k.startswith("specgraft_requests_total") and v},
        "budget_by_batch_size": {k.split('"')[1]: int(v) for k, v in after.items() if k.startswith("specgraft_budget{")},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def spawned_server(args: argparse.Namespace, method: str):
    """`specgraft serve` for ``method`` on a free loopback port; stopped with SIGTERM at the end."""
    port = free_port()
    cmd = [sys.executable, "-m", "specgraft.cli", "serve", "--model", args.model, "--method", method, "--port", str(port),
           "--max-batch", str(args.max_batch), "--max-queue", str(args.max_queue), "--log-level", "warning", *args.serve_arg]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + args.startup_timeout
        with httpx.Client(base_url=url, timeout=5) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"specgraft serve exited with status {proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"specgraft serve did not come up within {args.startup_timeout} s")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health").status_code == 200:
                        break
                time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure(url: str, args: argparse.Namespace, label: str | None) -> list[LevelResult]:
    with httpx.Client(base_url=url, timeout=args.timeout) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        metrics = parse(http.get("/metrics").text)
        method = label or next((k.split('"')[1] for k in metrics if k.startswith("specgraft_request_steps_total{")), "?")
        bodies = request_bodies(args.suite, model, args.max_tokens, args.temperature, args.ignore_eos)
        asyncio.run(warm_up(url, bodies[0], args.timeout))
        levels = []
        for concurrency in args.concurrency:
            before = parse(http.get("/metrics").text)
            results, wall = asyncio.run(run_level(url, bodies, concurrency, args.duration, args.timeout))
            level = summarize(method, concurrency, results, wall, server_delta(before, parse(http.get("/metrics").text)))
            print(row(level), flush=True)
            levels.append(level)
        return levels


HEADER = ("| method | clients | requests | errors | req/s | tokens/s | p50 latency (s) | p99 latency (s) | p50 TTFT (s) "
          "| mean batch | MAT | step (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def row(lv: LevelResult) -> str:
    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    s = lv.server
    return (f"| {lv.method} | {lv.concurrency} | {lv.requests} | {lv.errors} | {lv.requests_per_s:.3f} | {lv.tokens_per_s:.2f} | "
            f"{f(lv.latency_p50_s)} | {f(lv.latency_p99_s)} | {f(lv.ttft_p50_s)} | {f(s.get('mean_batch_size'))} | {f(s.get('mat'))} | "
            f"{f(s.get('mean_step_s'), '{:.4f}')} |")


def plot(levels: list[LevelResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (thr, lat) = plt.subplots(1, 2, figsize=(11, 4))
    for method in dict.fromkeys(lv.method for lv in levels):
        mine = [lv for lv in levels if lv.method == method]
        xs = [lv.concurrency for lv in mine]
        (line,) = thr.plot(xs, [lv.tokens_per_s for lv in mine], marker="o", label=method)
        lat.plot(xs, [lv.latency_p50_s or 0 for lv in mine], marker="o", color=line.get_color(), label=f"{method} p50")
        lat.plot(xs, [lv.latency_p99_s or 0 for lv in mine], marker="x", linestyle="--", color=line.get_color(), label=f"{method} p99")
    ticks = sorted({lv.concurrency for lv in levels})
    for ax, title, ylabel in ((thr, "throughput", "generated tokens/s"), (lat, "request latency", "seconds")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="A running server, e.g. http://127.0.0.1:8000.")
    where.add_argument("--model", help="Start `specgraft serve --model MODEL` per method (catalog name, directory or hub id).")
    ap.add_argument("--methods", default="pld", help="Comma list of methods, one server each (with --model).")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None, help="The server's torch threads (with --model).")
    ap.add_argument("--serve-arg", action="append", default=[], help="Extra argument for `specgraft serve` (repeatable), e.g. --serve-arg=--dtype=float32.")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--concurrency", default="1,2,4,8", help="Comma list of concurrent clients.")
    ap.add_argument("--duration", type=float, default=60.0, help="Seconds each level issues requests (in-flight ones then finish).")
    ap.add_argument("--suite", default="spec-bench:2", help="Prompt suite spec (specgraft/suites.py), e.g. spec-bench:2,humaneval:4.")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true", help="Generate --max-tokens tokens per request, EOS or not.")
    ap.add_argument("--timeout", type=float, default=600.0, help="Seconds one request may take.")
    ap.add_argument("--out", required=True, help="Directory: load.json, load.png.")
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if not args.concurrency or min(args.concurrency) < 1:
        ap.error("--concurrency needs positive integers")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print(HEADER, flush=True)
    levels: list[LevelResult] = []
    if args.url:
        levels += measure(args.url.rstrip("/"), args, None)
    else:
        for method in [m for m in args.methods.split(",") if m]:
            with spawned_server(args, method) as url:
                levels += measure(url, args, method)
    run = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "config": {k: v for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "levels": [asdict(lv) for lv in levels],
    }
    (out / "load.json").write_text(json.dumps(run, indent=1) + "\n")
    plot(levels, out / "load.png")
    print(f"wrote {out / 'load.json'} and {out / 'load.png'}", file=sys.stderr)
    errors = sum(lv.errors for lv in levels)
    if errors:
        print(f"{errors} requests failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
