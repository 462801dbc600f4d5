"""The tables of docs/benchmarks.md, made from the result files in bench/results/.

The page holds one marker line per table, ``<!-- bench:NAME -->``; when the site is built,
:func:`fill` (called by the site's hook, ``mkdocs_hooks.py``) puts the table in the marker's
place, so the page always shows the figures of the result files in the tree. A marker without
a table, or a result file without a figure a table needs, fails the build. CPU figures are
the exception (:func:`_cpu`): a run may not have been able to read them (an executor in the
benchmark's own process, no ``/proc``), and result files written before a benchmark measured
CPU have none; the table then says so.
``python -m bench.report`` prints every table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MARKER = re.compile(r"^<!-- bench:(?P<name>[\w-]+) -->$", re.M)

Row = Sequence[object]


def _load(name: str) -> Any:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


def _n(value: float, digits: int = 0) -> str:
    """A figure with thousands separators: 1,862 or 0.221."""
    return f"{value:,.{digits}f}"


def _table(header: Row, rows: Iterable[Row]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _cpu(figures: dict[str, Any], key: str, unit: str = "call") -> str:
    """A CPU figure in ms per ``unit``, or that the run has none (see the module's text)."""
    value = figures.get(key)
    return "CPU not measured" if value is None else f"{_n(value, 3)} ms CPU/{unit}"


TARGET_CELL = (16, "FULL", 0.0)  # the embedded matrix's cell issue 30's targets are set in


def _cell(embedded: Any, callers: int, synchronous: str, duplicates: float) -> Any:
    return next(
        c
        for c in embedded["matrix"]["cells"]
        if (c["callers"], c["synchronous"], c["duplicates"]) == (callers, synchronous, duplicates)
    )


def _callers(peers: Any, run: Any) -> int:
    """A peers run's callers (result files before ``--callers`` took several numbers have one,
    in the workload)."""
    return int(run.get("callers", peers["workload"]["callers"]))


def summary() -> str:
    """Each benchmark beside the raw baseline measured in the same run."""
    embedded, kafka, process = _load("embedded"), _load("kafka"), _load("kafka_executor_process")
    faust, http, workers = _load("projector_faust"), _load("http"), _load("http_workers")
    groups, jobs = _load("groups"), _load("jobs_polling")
    one, two = (next(r for r in workers["meta"]["runs"] if r["workers"] == n) for n in (1, 2))
    callers, synchronous, _ = TARGET_CELL
    embedded_rows = []
    for share in (0.0, 0.5):
        cell = _cell(embedded, callers, synchronous, share)
        ledger, raw = cell["toolledger"], cell["raw_group_commit"]
        embedded_rows.append(
            [
                f"embedded, {callers} callers, `synchronous={synchronous}`, "
                f"{_n(share * 100)}% duplicates (`bench/embedded.py`)",
                f"{_n(ledger['calls_per_s'])} calls/s, {_cpu(ledger, 'cpu_ms_per_call')}",
                f"{_n(raw['calls_per_s'])} calls/s, {_cpu(raw, 'cpu_ms_per_call')}: one "
                "`INSERT OR IGNORE` per call into a plain SQLite claim table, group commit",
                _n(cell["ratio"], 3),
            ]
        )
    return _table(
        ["benchmark", "toolledger", "raw baseline (same run)", "ratio"],
        [
            *embedded_rows,
            [
                f"Kafka end to end, {kafka['meta']['partitions']} partitions (`bench/kafka.py`)",
                f"{_n(kafka['e2e_calls_per_s'])} calls/s",
                f"{_n(kafka['raw_pipe_msgs_per_s'])} round trips/s: plain aiokafka produce → "
                "consume → produce → consume",
                _n(kafka["ratio_e2e_vs_raw_pipe"], 3),
            ],
            [
                "Kafka end to end, against the floor of exactly-once",
                f"{_n(kafka['e2e_calls_per_s'])} calls/s",
                f"{_n(kafka['raw_txn_pipe_msgs_per_s'])} round trips/s: the raw *transactional* "
                "pipe (consume, produce the answer and commit the input offsets in one "
                "transaction per partition batch)",
                _n(kafka["ratio_e2e_vs_raw_txn_pipe"], 3),
            ],
            [
                "the same, the executor in a process of its own (`--executor subprocess`)",
                f"{_n(process['e2e_calls_per_s'])} calls/s, p50 {_n(process['p50_ms'])} ms, "
                f"p99 {_n(process['p99_ms'])} ms; executor "
                f"{_cpu(process, 'executor_cpu_ms_per_call')}",
                f"{_n(process['raw_txn_pipe_msgs_per_s'])} round trips/s (transactional); relay "
                f"{_cpu(process, 'raw_txn_relay_cpu_ms_per_round_trip', 'round trip')}",
                _n(process["ratio_e2e_vs_raw_txn_pipe"], 3),
            ],
            [
                "Kafka latency at half load",
                f"p50 {_n(kafka['p50_ms'])} ms, p99 {_n(kafka['p99_ms'])} ms",
                f"plain: p50 {_n(kafka['raw_pipe_p50_ms'], 1)} ms, p99 "
                f"{_n(kafka['raw_pipe_p99_ms'])} ms; transactional: p50 "
                f"{_n(kafka['raw_txn_pipe_p50_ms'])} ms, p99 {_n(kafka['raw_txn_pipe_p99_ms'])} ms",
                "",
            ],
            [
                "projector into PostgreSQL",
                f"{_n(kafka['projector_rows_per_s'])} events/s, "
                f"{_cpu(kafka, 'projector_cpu_ms_per_event', 'event')}",
                f"{_n(kafka['raw_copy_rows_per_s'])} rows/s: `COPY` into an unindexed table, "
                f"{_cpu(kafka, 'raw_copy_cpu_ms_per_row', 'row')}",
                _n(kafka["ratio_projector_vs_copy"], 3),
            ],
            [
                "projector on faust-streaming against plain aiokafka (`bench/projector_faust.py`)",
                f"faust {_n(faust['faust_events_per_s'])} events/s, "
                f"{_n(faust['faust_cpu_us_per_event'])} µs CPU/event",
                f"aiokafka {_n(faust['aiokafka_events_per_s'])} events/s, "
                f"{_n(faust['aiokafka_cpu_us_per_event'])} µs CPU/event",
                _n(faust["ratio_faust_vs_aiokafka"], 2),
            ],
            [
                "HTTP first executions (`bench/http.py`)",
                f"{_n(http['calls_per_s'])} calls/s, p50 {_n(http['p50_ms'])} ms, p99 "
                f"{_n(http['p99_ms'])} ms ({http['meta']['concurrency']} in flight)",
                f"{_n(http['bare_per_s'])} req/s: a bare FastAPI endpoint, the same JSON work",
                _n(http["ratio_calls_vs_bare"], 3),
            ],
            ["HTTP replays", f"{_n(http['replays_per_s'])} calls/s", "", ""],
            [
                "HTTP on Kafka + PostgreSQL, `serve --workers 2` (`bench/http_workers.py`)",
                f"{_n(two['calls_per_s'])} calls/s, p50 {_n(two['p50_ms'])} ms, p99 "
                f"{_n(two['p99_ms'])} ms ({workers['meta']['concurrency']} in flight)",
                f"the same run with `--workers 1`: {_n(one['calls_per_s'])} calls/s, p50 "
                f"{_n(one['p50_ms'])} ms, p99 {_n(one['p99_ms'])} ms",
                _n(workers["ratio_vs_first_by_workers"]["2"], 2),
            ],
            [
                f"call group, {groups['steps']}-step chain (`bench/groups.py`)",
                f"median {_n(groups['chain']['median_ms'])} ms",
                f"{groups['steps']} sequential calls of the same no-op tool: "
                f"{_n(groups['sequential_calls']['median_ms'])} ms",
                _n(groups["chain"]["ratio_to_sequential"], 2),
            ],
            [
                f"call group, {groups['steps']}-step fan-out",
                f"median {_n(groups['fan_out']['median_ms'])} ms",
                f"the same {groups['steps']} sequential calls",
                _n(groups["fan_out"]["ratio_to_sequential"], 2),
            ],
            [
                f"{_n(jobs['jobs'])} running jobs polled (`bench/jobs_polling.py`, "
                f"{_n(jobs['window_s'])} s window)",
                f"{_n(jobs['cpu_ms_per_s_with_jobs'], 1)} ms CPU per s, "
                f"{_n(jobs['polls_per_s'])} polls/s ({_n(jobs['polls_per_s_first_quarter'])}/s "
                f"in the first quarter, {_n(jobs['polls_per_s_last_quarter'])}/s once backed "
                f"off), {_n(jobs['cpu_us_per_poll_over_idle'])} µs CPU per poll",
                f"the same process idle: {_n(jobs['cpu_ms_per_s_idle'], 1)} ms CPU per s",
                _n(jobs["ratio_jobs_vs_idle"], 1),
            ],
        ],
    )


def peers() -> str:
    """The embedded ledger against AWS Powertools' idempotency over Redis, with CPU per call
    (Powertools': this process's plus redis-server's)."""
    result = _load("peers")
    rows = []
    for run in result["runs"]:
        cells: list[object] = [_callers(result, run), f"{run['duplicates']:g}"]
        for system in ("toolledger", "powertools_redis", "powertools_redis_aof_always"):
            measured = run[system]
            cells.append(
                f"{_n(measured['calls_per_s'])} calls/s, p50 {_n(measured['p50_ms'], 1)} ms, "
                f"p99 {_n(measured['p99_ms'], 1)} ms, {_cpu(measured, 'cpu_ms_per_call')}"
                + (
                    ""
                    if measured.get("redis_server_cpu_ms_per_call") is None
                    else f" (redis-server {_n(measured['redis_server_cpu_ms_per_call'], 3)})"
                )
            )
            if system != "toolledger":
                cells.append(_n(run[f"ratio_vs_{system}"], 2))
        rows.append(cells)
    return _table(
        [
            "callers",
            "D (share of retries)",
            "toolledger embedded, `synchronous=FULL`",
            f"Powertools {result['meta']['aws_lambda_powertools']} + Redis, no persistence",
            "ratio",
            "Powertools + Redis, `appendfsync always`",
            "ratio",
        ],
        rows,
    )


def matrix() -> str:
    """The embedded matrix: toolledger beside one ``INSERT OR IGNORE`` per call."""
    cells = _load("embedded")["matrix"]["cells"]
    rows = []
    for cell in cells:
        ledger, raw = cell["toolledger"], cell["raw_group_commit"]
        half = ledger.get("half_rate")
        rows.append(
            [
                cell["callers"],
                cell["synchronous"],
                f"{_n(cell['duplicates'] * 100)}%",
                f"{_n(ledger['calls_per_s'])} calls/s, p50 {_n(ledger['p50_ms'], 1)} ms, "
                f"p99 {_n(ledger['p99_ms'], 1)} ms",
                _cpu(ledger, "cpu_ms_per_call"),
                ""
                if half is None
                else f"{_n(half['rate_per_s'])} calls/s issued: p50 "
                f"{_n(half['p50_ms'], 1)} ms, p99 {_n(half['p99_ms'], 1)} ms, "
                f"{_cpu(half, 'cpu_ms_per_call')}",
                f"{_n(raw['calls_per_s'])} calls/s, {_cpu(raw, 'cpu_ms_per_call')}",
                _n(cell["ratio"], 3),
            ]
        )
    return _table(
        [
            "callers",
            "synchronous",
            "duplicates",
            "toolledger",
            "toolledger CPU",
            "at half that rate",
            "raw claim table",
            "ratio",
        ],
        rows,
    )


def _short_retention_run() -> Any:
    return next(r for r in _load("scale")["embedded"] if r["retention"] != "forever")


def scale_embedded() -> str:
    """1,000,000 calls on the embedded ledger, with retention forever and at 2 minutes."""
    targets = _load("scale")["meta"]["targets"]
    rows = []
    for run in _load("scale")["embedded"]:
        first, last = run["steps"][0], run["steps"][-1]
        rows.append(
            [
                f"retention `{run['retention']}`",
                f"{_n(first['rss_mb'], 1)} / {_n(last['rss_mb'], 1)} MB "
                f"({_n(run['memory_ratio'], 2)}x)",
                f"{_n(first['calls_per_s'])} / {_n(last['calls_per_s'])} "
                f"({_n(run['throughput_ratio'], 2)})",
                f"{_n(run['reopen_s'], 3)} s",
                f"{_n(last['disk_bytes_per_call'])} B",
                f"{_n(run['disk_growth_last_step_bytes'] / 1e6, 1)} MB",
            ]
        )
    rows.append(
        [
            "target",
            targets["memory_ratio"] + "x",
            targets["throughput_ratio"],
            targets["reopen_s"] + " s",
            targets["disk_bytes_per_call"],
            "",
        ]
    )
    return _table(
        [
            "run",
            "resident memory, first / last step",
            "calls/s, first / last step",
            "reopen, until the first answer",
            "disk per call",
            "disk growth, last step",
        ],
        rows,
    )


def scale_steps() -> str:
    """The run with every retention short (2 minutes by default), step by step: the disk is
    flat."""
    steps = _short_retention_run()["steps"]
    return _table(
        ["calls", *(_n(s["calls"]) for s in steps)],
        [
            ["disk (MB)", *(_n(s["disk_bytes"] / 1e6, 1) for s in steps)],
            ["resident memory (MB)", *(_n(s["rss_mb"], 1) for s in steps)],
            ["calls/s over the step", *(_n(s["calls_per_s"]) for s in steps)],
        ],
    )


def scale_kafka() -> str:
    """Taking over a partition of the state topic that holds 1,000,000 keys."""
    kafka = _load("scale")["kafka"]
    rows = [
        [
            index,
            f"{_n(run['raw_read_s'], 2)} s",
            f"{_n(run['cold_takeover']['seconds'], 2)} s",
            f"{_n(run['cold_over_raw'], 2)}x",
            f"{_n(run['warm_takeover']['seconds'], 3)} s",
        ]
        for index, run in enumerate(kafka["runs"], start=1)
    ]
    targets = _load("scale")["meta"]["targets"]
    rows.append(
        ["target", "", "", targets["cold_over_raw"] + "x", targets["warm_takeover_s"] + " s"]
    )
    return _table(
        ["run", "raw aiokafka read", "cold takeover (no local store)", "ratio", "warm takeover"],
        rows,
    )


def cpu() -> str:
    """Where the CPU goes, per request and per call, in the same runs."""
    http, kafka, workers = _load("http"), _load("kafka"), _load("http_workers")
    embedded, peer, process = _load("embedded"), _load("peers"), _load("kafka_executor_process")
    cell = _cell(embedded, *TARGET_CELL)
    peer_run = next(
        r for r in peer["runs"] if (_callers(peer, r), r["duplicates"]) == TARGET_CELL[::2]
    )
    powertools = peer_run["powertools_redis"]
    phases = http["meta"]["phases"]
    one = next(r for r in workers["meta"]["runs"] if r["workers"] == 1)["phases"]
    diagnostics = kafka["meta"]["diagnostics"]
    transaction = diagnostics["e2e"]["executor_transaction_ms"]
    return _table(
        ["what", "CPU", "baseline"],
        [
            [
                f"embedded ledger, {TARGET_CELL[0]} callers, `synchronous={TARGET_CELL[1]}`, "
                "first executions (the whole process: event loop and writer thread)",
                _cpu(cell["toolledger"], "cpu_ms_per_call"),
                "the raw claim table: " + _cpu(cell["raw_group_commit"], "cpu_ms_per_call"),
            ],
            [
                f"the same workload in `bench/peers.py` ({TARGET_CELL[0]} callers, D=0)",
                _cpu(peer_run["toolledger"], "cpu_ms_per_call"),
                "Powertools + Redis (no persistence), its process and redis-server: "
                + _cpu(powertools, "cpu_ms_per_call"),
            ],
            [
                "HTTP server, embedded: a first execution / a replay",
                f"{_n(phases['first']['server_cpu_ms_per_request'], 2)} / "
                f"{_n(phases['replays']['server_cpu_ms_per_request'], 2)} ms per request",
                f"bare FastAPI: {_n(phases['bare']['server_cpu_ms_per_request'], 2)} ms",
            ],
            [
                "HTTP front door on Kafka + PostgreSQL: a first execution / a replay",
                f"{_n(one['first']['front_doors_cpu_ms_per_request'], 2)} / "
                f"{_n(one['replays']['front_doors_cpu_ms_per_request'], 2)} ms per request",
                f"per wall second with one front door: front door "
                f"{_n(one['first']['front_doors_cpu_per_wall_s'], 2)}, executor "
                f"{_n(one['first']['executor_cpu_per_wall_s'], 2)}, projector "
                f"{_n(one['first']['projector_cpu_per_wall_s'], 2)}, broker "
                f"{_n(one['first']['broker_cpu_per_wall_s'], 2)}, PostgreSQL "
                f"{_n(one['first']['postgres_cpu_per_wall_s'], 2)} of a core",
            ],
            [
                "Kafka end to end (client, executor and handler in one process)",
                f"{_n(diagnostics['e2e']['cpu_ms_per_call'], 2)} ms per call",
                "the transactional pipe: "
                f"{_n(diagnostics['raw_txn_pipe_cpu_ms_per_round_trip'], 3)} ms per round trip",
            ],
            [
                "the Kafka executor in a process of its own (`--executor subprocess`)",
                _cpu(process, "executor_cpu_ms_per_call"),
                "the transactional pipe's relay in a process of its own: "
                + _cpu(process, "raw_txn_relay_cpu_ms_per_round_trip", "round trip"),
            ],
            [
                "an executor transaction (p50)",
                f"{_n(transaction['p50'])} ms, of which `send_offsets_to_transaction` "
                f"{_n(transaction['send_offsets_p50'])} ms and the commit "
                f"{_n(transaction['commit_transaction_p50'])} ms; "
                f"{_n(diagnostics['executor_events_per_commit'], 1)} events per commit",
                f"the pipe's transactions hold "
                f"{_n(diagnostics['raw_txn_pipe_records_per_transaction'], 1)} records",
            ],
        ],
    )


def targets() -> str:
    """Each target of the hot-path work and where the last run stands."""
    embedded, peer, kafka = _load("embedded"), _load("peers"), _load("kafka")
    process, http, workers = _load("kafka_executor_process"), _load("http"), _load("http_workers")
    cell = _cell(embedded, *TARGET_CELL)
    half = cell["toolledger"]["half_rate"]
    cpu = cell["toolledger"].get("cpu_ms_per_call")
    ratios = {
        run["duplicates"]: run["ratio_vs_powertools_redis"]
        for run in peer["runs"]
        if _callers(peer, run) == TARGET_CELL[0]
    }
    kafka_ratio = kafka["ratio_e2e_vs_raw_txn_pipe"]
    process_ratio = process["ratio_e2e_vs_raw_txn_pipe"]
    scaling = workers["ratio_vs_first_by_workers"]["2"]
    rows = [
        [
            "embedded: >= 5,000 calls/s at 16 callers (`synchronous=FULL`)",
            f"{_n(cell['toolledger']['calls_per_s'])} calls/s",
            _met(cell["toolledger"]["calls_per_s"] >= 5000),
        ],
        [
            "embedded: <= 0.25 ms CPU per call",
            _cpu(cell["toolledger"], "cpu_ms_per_call"),
            "not measured" if cpu is None else _met(cpu <= 0.25),
        ],
        [
            "embedded: p99 <= 10 ms at half that rate",
            f"p99 {_n(half['p99_ms'], 1)} ms (p50 {_n(half['p50_ms'], 1)}) at half of its "
            f"own rate, {_n(half['rate_per_s'])} calls/s",
            _met(half["p99_ms"] <= 10),
        ],
        [
            f"embedded: >= 1.5x Powertools + Redis at {TARGET_CELL[0]} callers",
            ", ".join(f"{_n(r, 2)} (D={d:g})" for d, r in ratios.items()),
            _met(min(ratios.values()) >= 1.5),
        ],
        [
            "Kafka end to end: >= 0.5x the raw transactional pipe",
            f"{_n(kafka_ratio, 3)} with the executor in the benchmark's process; "
            f"{_n(process_ratio, 3)} in a process of its own",
            _met(max(kafka_ratio, process_ratio) >= 0.5),
        ],
        [
            "projector: >= 0.5x raw `COPY`",
            _n(kafka["ratio_projector_vs_copy"], 3),
            _met(kafka["ratio_projector_vs_copy"] >= 0.5),
        ],
        [
            "HTTP first executions: >= 0.5x bare FastAPI, one worker",
            _n(http["ratio_calls_vs_bare"], 3),
            _met(http["ratio_calls_vs_bare"] >= 0.5),
        ],
        [
            "HTTP on Kafka + PostgreSQL: throughput grows with `--workers`",
            f"{_n(scaling, 2)}x from 1 to 2 workers",
            _met(scaling > 1),
        ],
    ]
    return _table(["target", "measured", "met"], rows)


TABLES: dict[str, Callable[[], str]] = {
    "summary": summary,
    "peers": peers,
    "matrix": matrix,
    "scale-embedded": scale_embedded,
    "scale-steps": scale_steps,
    "scale-kafka": scale_kafka,
    "cpu": cpu,
    "targets": targets,
}


def fill(markdown: str) -> str:
    """``markdown`` with each ``<!-- bench:NAME -->`` line replaced by its table."""

    def table(found: re.Match[str]) -> str:
        name = found["name"]
        if name not in TABLES:
            raise KeyError(f"no benchmark table named {name!r} (known: {', '.join(TABLES)})")
        return TABLES[name]()

    return MARKER.sub(table, markdown)


if __name__ == "__main__":
    for name, make in TABLES.items():
        print(f"## {name}\n\n{make()}\n")
