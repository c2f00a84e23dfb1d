"""The main job's served request: start `linnet serve ARGS` on a free loopback port, ask one chat question through
the official `openai` client, print the answer, stop the server with SIGTERM (its clean shutdown).

Usage: `python tools/serve_and_ask.py "What is the capital of France?" [linnet serve arguments...]`. Exits 1 with
the server's log when it does not come up within START_TIMEOUT_S or the request fails.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time

import openai

START_TIMEOUT_S = 300  # loading (and warming up a compiling backend) takes seconds; minutes only on a slow machine
READY = "linnet serve: serving "


def main(argv: list[str]) -> int:
    question, serve_args = argv[0], argv[1:]
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "linnet", "serve", "--port", "0", *serve_args], stdout=log, stderr=log, text=True
        )
        try:
            url = _wait_for_url(server, log)
            if url is None:
                log.seek(0)
                print(f"serve_and_ask: linnet serve did not start:\n{log.read()}", file=sys.stderr)
                return 1
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
            model = client.models.list().data[0].id
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=64
            )
            print(reply.choices[0].message.content)
            return 0
        except openai.OpenAIError as err:
            print(f"serve_and_ask: the request failed: {err}", file=sys.stderr)
            return 1
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


def _wait_for_url(server: subprocess.Popen, log) -> str | None:
    """The base URL from the line `linnet serve: serving NAME at http://HOST:PORT/v1 (...)`, once it is logged."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and server.poll() is None:
        log.seek(0)
        for line in log.read().splitlines():
            if line.startswith(READY) and " at " in line:
                return line.split(" at ", 1)[1].split()[0]
        time.sleep(0.2)
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
