from __future__ import annotations

import pytest

from router.lab.bench.reader import first_lag, read_stream, split_tokens


def test_pieces_carry_the_first_token_alone_then_share_the_rest() -> None:
    assert split_tokens(9, 3) == [1, 4, 4]
    assert split_tokens(9, 4) == [1, 3, 3, 2]
    assert split_tokens(5, 1) == [5]
    assert sum(split_tokens(801, 100)) == 801


def test_a_slow_reader_takes_pieces_no_faster_than_its_speed() -> None:
    # Pieces at 1.0, 1.1, 1.2, 1.3 carrying 1, 2, 2, 2 tokens, read at 4 tokens/s.
    s = read_stream(1.0, [0.1, 0.1, 0.1], tokens=7, rate=4.0)
    assert s.pieces == [1, 2, 2, 2]
    assert s.read == pytest.approx([1.0, 1.25, 1.75, 2.25])
    assert s.gaps == pytest.approx([0.25, 0.5, 0.5]) and s.done == pytest.approx(2.25)


def test_a_fast_reader_waits_for_the_engine() -> None:
    s = read_stream(1.0, [0.1, 0.1], tokens=3, rate=1000.0)
    assert s.read == pytest.approx([1.0, 1.1, 1.2])
    assert read_stream(1.0, [0.1, 0.1], tokens=3, rate=None).read == s.produced


def test_lag_is_what_was_produced_and_not_yet_read() -> None:
    s = read_stream(0.0, [0.01] * 99, tokens=100, rate=10.0)  # produced in 1 s, read in 10 s
    size = lambda n: 100 * n  # noqa: E731
    t = first_lag(s, size, lag_bytes=1000)
    # Piece k is produced at 0.01 k and read at 0.1 k. At 0.12, 13 pieces were produced and 2
    # read: 1,100 bytes wait, the first time more than 1,000 do.
    assert t == pytest.approx(0.12)
    assert first_lag(s, size, lag_bytes=100 * 100) is None  # the whole answer fits
    fast = read_stream(0.0, [0.01] * 99, tokens=100, rate=None)
    assert first_lag(fast, size, lag_bytes=150) is None
