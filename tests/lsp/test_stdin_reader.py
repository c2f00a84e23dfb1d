"""The stdin reader of the server's message loop (`rpc.PrefetchingStdin`): what pygls's `StdinAsyncReader` gave,
from one thread of its own."""

import asyncio
import os
import threading
import time

from linnet.lsp.rpc import PrefetchingStdin


def _framed(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


async def _read_messages(reader: PrefetchingStdin) -> list[bytes]:
    """Bodies as pygls's loop reads them (header lines, the blank line, the body), until the input ends."""
    bodies = []
    while True:
        header = await reader.readline()
        if not header:
            return bodies
        length = int(header.split(b":")[1])
        assert await reader.readline() == b"\r\n"
        bodies.append(await reader.readexactly(length))


def _read_through_pipe(pieces: list[bytes]) -> list[bytes]:
    """`pieces` written to a pipe one by one, a little apart (so reads end between them), read back."""
    fd_read, fd_write = os.pipe()

    def write() -> None:
        with os.fdopen(fd_write, "wb", buffering=0) as out:
            for piece in pieces:
                out.write(piece)
                time.sleep(0.002)

    writer = threading.Thread(target=write)
    writer.start()
    with os.fdopen(fd_read, "rb") as stdin:
        bodies = asyncio.run(_read_messages(PrefetchingStdin(stdin)))
    writer.join()
    return bodies


def test_messages_split_anywhere_and_several_in_one_read():
    bodies = [b'{"jsonrpc": "2.0", "method": "m%d"}' % n for n in range(5)] + [b'{"x": "' + b"y" * 200_000 + b'"}']
    stream = b"".join(_framed(b) for b in bodies)
    pieces = [stream[:7], stream[7:30], stream[30:31], stream[31:150], stream[150:]]  # a header cut, then many at once
    assert _read_through_pipe(pieces) == bodies


def test_the_end_of_input_inside_a_body_gives_what_came():
    stream = _framed(b'{"a": 1}') + b'Content-Length: 50\r\n\r\n{"cut'
    assert _read_through_pipe([stream]) == [b'{"a": 1}', b'{"cut']
