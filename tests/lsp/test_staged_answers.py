"""`OpenDocument.staged_answers`: the rest of a keystroke's check waits until every request answered from the
first stage has ended (its answer written), and not at all when there is none."""

import asyncio

from linnet.lsp.documents import StagedAnswers


def test_the_wait_ends_when_the_last_counted_request_ends():
    async def scenario() -> list[str]:
        answers, seen = StagedAnswers(), []
        await asyncio.wait_for(answers.wait(), 1)  # none counted: no wait
        ends = [answers.begin(), answers.begin()]

        async def check() -> None:
            await answers.wait()
            seen.append("check")

        task = asyncio.ensure_future(check())
        for end in ends:
            await asyncio.sleep(0.01)
            seen.append("answer")
            end()
        await asyncio.wait_for(task, 1)
        return seen

    assert asyncio.run(scenario()) == ["answer", "answer", "check"]
