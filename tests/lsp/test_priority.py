"""Requests first (`linnet.lsp.priority`): a document's check in a worker thread waits at its pause points
(`linnet.semantics.pausing`) while a request is being answered, goes on when the answer is written or when the
request itself waits for an analysis, and never waits longer than `MAX_PAUSE_S` for a request nobody counts."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from linnet.lsp import priority
from linnet.lsp.priority import RequestsFirst
from linnet.semantics import pausing
from linnet.semantics.program import Workspace

LLAMA = Path(__file__).resolve().parents[2] / "examples" / "llama.linnet"


def _messages(analysis) -> list[str]:
    return [f"{d.code} {d.location.start.line}:{d.location.start.character} {d.message}" for d in analysis.diagnostics]


def test_a_check_waits_at_its_pause_points_while_a_request_is_answered(monkeypatch, tmp_path):
    monkeypatch.setattr(priority, "MAX_PAUSE_S", 30.0)  # only the request's end lets the check go on here
    text = LLAMA.read_text(encoding="utf-8").replace("hidden_size: int = 4096", "hidden_size: int = 4097")
    path = str(tmp_path / "llama.linnet")
    expected = _messages(Workspace().open(path, text).analyze())
    assert expected  # (a check with findings: the paused one must give the same)

    async def scenario() -> tuple[bool, list[str]]:
        gate, paused, done = RequestsFirst(), threading.Event(), {}

        def wait() -> None:
            paused.set()
            gate.wait()

        def check() -> None:
            with pausing.pausing_with(wait):
                done["analysis"] = Workspace().open(path, text).analyze()

        async def request() -> None:
            gate.begin()  # a hover's handler runs, its answer not yet written
            thread = threading.Thread(target=check)
            thread.start()
            await asyncio.to_thread(paused.wait, 10)
            await asyncio.sleep(0.05)
            still_paused = thread.is_alive()
            gate.end()
            await asyncio.to_thread(thread.join, 30)
            return still_paused, _messages(done["analysis"])

        return await asyncio.ensure_future(request())

    still_paused, found = asyncio.run(scenario())
    assert still_paused and found == expected


def test_a_request_waiting_for_an_analysis_lets_the_checks_go_on(monkeypatch):
    monkeypatch.setattr(priority, "MAX_PAUSE_S", 30.0)

    async def scenario() -> float:
        gate = RequestsFirst()

        async def request() -> float:
            gate.begin()
            with gate.waiting():  # (`OpenDocument.analyzed`: the analysis it waits for must go on)
                start = time.monotonic()
                await asyncio.to_thread(gate.wait)
                return time.monotonic() - start

        return await asyncio.ensure_future(request())

    assert asyncio.run(scenario()) < 5


def test_a_wait_outside_a_request_holds_the_gate_closed(monkeypatch):
    """A check waiting for another (the keystroke's diagnostics waiting for its analysis) answers nobody."""
    monkeypatch.setattr(priority, "MAX_PAUSE_S", 0.2)

    async def scenario() -> float:
        gate = RequestsFirst()

        async def request() -> None:
            gate.begin()
            await asyncio.sleep(1)

        async def diagnostics() -> float:
            with gate.waiting():
                start = time.monotonic()
                await asyncio.to_thread(gate.wait)
                return time.monotonic() - start

        asyncio.ensure_future(request())
        await asyncio.sleep(0)
        return await asyncio.ensure_future(diagnostics())

    assert asyncio.run(scenario()) >= 0.1  # it waited for the request (until MAX_PAUSE_S)


def test_a_request_nobody_counts_holds_the_checks_up_at_most_max_pause(monkeypatch):
    monkeypatch.setattr(priority, "MAX_PAUSE_S", 0.1)
    gate = RequestsFirst()
    gate.arrived()  # (a response to one of our requests: no handler will end it)
    start = time.monotonic()
    gate.wait()
    assert 0.05 <= time.monotonic() - start < 5


def test_the_gate_opens_a_few_turns_after_a_chunk_no_handler_took(monkeypatch):
    monkeypatch.setattr(priority, "MAX_PAUSE_S", 30.0)

    async def scenario() -> float:
        gate = RequestsFirst()
        gate.arrived()
        gate.settle()
        start = time.monotonic()
        await asyncio.to_thread(gate.wait)
        return time.monotonic() - start

    assert asyncio.run(scenario()) < 5


def test_a_pause_point_does_nothing_outside_a_paused_check():
    calls = []
    pausing.pause_point()
    with pausing.pausing_with(lambda: calls.append(1)):
        pausing.pause_point()
    pausing.pause_point()
    assert calls == [1]


def test_each_thread_has_its_own_wait():
    threads = 2
    calls: list[str] = []
    barrier = threading.Barrier(threads)

    def run(name: str) -> None:
        with pausing.pausing_with(lambda: calls.append(name)):
            barrier.wait()
            pausing.pause_point()

    workers = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    pausing.pause_point()
    assert sorted(calls) == [f"t{i}" for i in range(threads)]


def test_after_warming_the_first_completion_builds_no_converter_function(monkeypatch):
    """`rpc.warm_converters` (run once after the first publish): the first completion's request and answer then
    build no cattrs function (the 27 ms they took on the event loop)."""
    import json

    import cattrs.gen
    from lsprotocol import types as T

    from linnet.lsp.rpc import warm_converters
    from linnet.lsp.server import create_server

    made: list[str] = []
    for name in ("make_dict_unstructure_fn", "make_dict_structure_fn"):
        real = getattr(cattrs.gen, name)
        monkeypatch.setattr(
            cattrs.gen, name, lambda cl, *a, _real=real, **k: made.append(cl.__name__) or _real(cl, *a, **k)
        )
    server = create_server()
    warm_converters(server.protocol)
    made.clear()
    request = {"jsonrpc": "2.0", "id": 7, "method": T.TEXT_DOCUMENT_COMPLETION}
    request["params"] = {"textDocument": {"uri": "file:///a.linnet"}, "position": {"line": 3, "character": 8}}
    server.protocol.structure_message(request)
    item = T.CompletionItem("hidden_size", kind=T.CompletionItemKind.Field, detail="int", sort_text="1hidden_size")
    json.dumps(T.CompletionResponse(7, T.CompletionList(False, [item])), default=server.protocol._serialize_message)
    assert made == []


def test_the_gate_opens_answer_read_s_after_the_last_answer(monkeypatch):
    """The client, woken by an answer, reads it before a check takes the CPU back."""
    monkeypatch.setattr(priority, "MAX_PAUSE_S", 30.0)
    monkeypatch.setattr(priority, "ANSWER_READ_S", 0.2)

    async def scenario() -> float:
        gate = RequestsFirst()

        async def request() -> float:
            gate.begin()
            gate.end()  # (its answer written)
            start = time.monotonic()
            await asyncio.to_thread(gate.wait)
            return time.monotonic() - start

        return await asyncio.ensure_future(request())

    assert 0.1 <= asyncio.run(scenario()) < 5
