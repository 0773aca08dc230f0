"""allocator.Trimmer: a trim after a burst has expired, not on every tick of a steady load."""

from __future__ import annotations

from mycroft_otel.processor.allocator import Trimmer

MIB = 1 << 20


def test_trims_once_the_held_bytes_fall_to_half_their_high_mark():
    t = Trimmer(above_bytes=8 * MIB)
    calls = []
    t._trim = calls.append  # the C call itself is glibc's; here only when it is made
    assert not t.watch(4 * MIB) and not t.watch(0)            # a small store is never worth it
    assert not t.watch(40 * MIB) and not t.watch(30 * MIB)     # steady: above half the high mark
    assert t.watch(12 * MIB) and calls == [0]                  # the burst expired: one trim
    assert not t.watch(11 * MIB) and not t.watch(7 * MIB)      # the new high mark is 12 MiB: 7 > 6
    assert t.watch(5 * MIB) and t.trims == 2


def test_no_malloc_trim_means_no_trim():
    t = Trimmer(above_bytes=1)
    t._trim = None
    assert not t.watch(10) and not t.watch(0) and t.trims == 0
