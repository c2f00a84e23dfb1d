"""Offsets, lines, columns, bytes and UTF-16 positions."""

from linnet.syntax.positions import LineIndex


def test_ascii_positions():
    idx = LineIndex("ab\ncd\n")
    p = idx.position(4)
    assert (p.line, p.column, p.byte, p.character) == (2, 2, 4, 1)


def test_non_ascii_positions():
    text = "# é🦜\nlet x"
    idx = LineIndex(text)
    p = idx.position(text.index("🦜") + 1)  # just after the parrot
    assert p.line == 1
    assert p.column == 5  # characters: '#', ' ', 'é', '🦜' then here
    assert p.byte == len("# é🦜".encode())
    assert p.character == 5  # UTF-16: `#`, ` `, `é`, then the parrot as a surrogate pair
    q = idx.position(text.index("x"))
    assert (q.line, q.column, q.character) == (2, 5, 4)
    assert q.byte == len(text[: text.index("x")].encode())


def test_utf16_round_trip():
    text = "a🦜b\nc"
    idx = LineIndex(text)
    for offset in range(len(text) + 1):
        p = idx.position(offset)
        assert idx.offset_of_utf16(p.line - 1, p.character) == offset
