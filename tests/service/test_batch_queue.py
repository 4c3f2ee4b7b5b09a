"""The batcher's queue and take policy (service/batch_queue.py), driven synchronously: no event loop, `now` given.

The budget throughout: widths 8/16/32/64, at most 4 items and 128 padded tokens a pass, so a pass holds 4 items of
width 8 but only 2 of width 64 (2 x 64 = 128). Items carry a label as their `encoded` (the queue never reads it).
"""

from __future__ import annotations

from collections import Counter

from service.batch_queue import Item, ItemQueue, ItemState
from tasks.runtime.inference import BatchShape

SHAPE = BatchShape(buckets=[8, 16, 32, 64], max_batch_size=4, max_batch_tokens=128)
SHORT, LONG = 5, 40  # tokens: padded to width 8 and width 64


def request(name: str, count: int, length: int = SHORT, deadline: float = 100.0, at: float = 0.0) -> list[Item]:
    return [Item(f"{name}{i}", length, deadline, at) for i in range(count)]


def labels(items: list[Item]) -> list[str]:
    return [item.encoded for item in items]


def test_a_large_request_and_a_small_one_behind_it_share_the_next_take():
    queue = ItemQueue(SHAPE)
    queue.add(request("a", 1000))
    queue.add(request("b", 1))
    assert queue.depth == 1001
    taken, dropped = queue.take(now=1.0)
    # one item per request per turn: a0, b0, then only a is left: a1, a2 (4 items, the batch size)
    assert labels(taken) == ["a0", "b0", "a1", "a2"] and dropped == []
    assert all(item.state is ItemState.BATCHED for item in taken)
    assert queue.depth == 997
    assert labels(queue.take(now=1.0).items) == ["a3", "a4", "a5", "a6"]


def test_the_rotation_carries_over_from_take_to_take():
    queue = ItemQueue(SHAPE)
    queue.add(request("a", 3))
    queue.add(request("b", 2))
    queue.add(request("c", 2))
    assert labels(queue.take(now=1.0).items) == ["a0", "b0", "c0", "a1"]
    assert labels(queue.take(now=1.0).items) == ["b1", "c1", "a2"]  # b's turn comes next, not a's again
    assert queue.depth == 0 and queue.oldest() is None


def test_the_token_budget_skips_a_request_whose_next_item_does_not_fit():
    queue = ItemQueue(SHAPE)
    queue.add(request("a", 3))
    queue.add([Item("b0", LONG, 100.0, 0.0), Item("b1", SHORT, 100.0, 0.0)])
    # a0 (width 8), b0 (width 64: 2 x 64 = 128 tokens, the budget); a1 would make 3 x 64: skipped, and so is b1
    assert labels(queue.take(now=1.0).items) == ["a0", "b0"]
    assert queue.depth == 3
    assert labels(queue.take(now=1.0).items) == ["a1", "b1", "a2"]


def test_topping_up_counts_the_items_already_taken():
    queue = ItemQueue(SHAPE)
    queue.add(request("a", 3))
    two_long = request("x", 2, LONG)
    assert queue.take(now=1.0, already=two_long).items == []  # 3 x 64 > 128
    assert queue.depth == 3
    assert labels(queue.take(now=1.0, already=two_long[:1]).items) == ["a0"]  # 2 x 64 = 128


def test_cancelled_and_expired_items_are_dropped_with_their_reason():
    gone = {"b0"}
    queue = ItemQueue(SHAPE, wanted=lambda item: item.encoded not in gone)
    queue.add([Item("a0", SHORT, 5.0, 0.0), Item("a1", SHORT, 20.0, 0.0)])
    queue.add([Item("b0", SHORT, 5.0, 0.0)])  # cancelled and expired: cancelled is the reason
    queue.add([Item("c0", SHORT, 10.0, 0.0)])  # its deadline is now: expired
    taken, dropped = queue.take(now=10.0)
    assert labels(taken) == ["a1"]
    assert [(item.encoded, reason) for item, reason in dropped] == [("a0", "expired"), ("b0", "cancelled"),
                                                                     ("c0", "expired")]
    assert Counter(reason for _, reason in dropped) == {"expired": 2, "cancelled": 1}
    assert all(item.state is ItemState.DROPPED for item, _ in dropped)
    assert queue.depth == 0


def test_discard_and_clear_drop_queued_items_once():
    queue = ItemQueue(SHAPE)
    first, second = request("a", 2, at=1.0), request("b", 1, at=2.0)
    queue.add(first)
    queue.add(second)
    assert queue.oldest() == 1.0
    assert queue.discard(first[0]) and not queue.discard(first[0])
    assert queue.depth == 2
    assert queue.oldest() == 1.0  # a1 arrived with a0
    assert queue.discard(first[1])
    assert queue.oldest() == 2.0  # the request with nothing queued is forgotten
    assert queue.clear() == second and queue.depth == 0 and queue.oldest() is None
    assert queue.take(now=3.0) == ([], [])


def test_full_when_queued_items_exceed_one_pass():
    queue = ItemQueue(SHAPE)
    queue.add(request("a", 3))
    assert not queue.full()  # 3 of 4
    queue.add(request("b", 2))
    assert queue.full()  # 5 items: the batch size is 4
    queue = ItemQueue(SHAPE)
    queue.add(request("a", 1))
    queue.add(request("b", 2, LONG))
    assert queue.full()  # a0 and b0 make 2 x 64 = 128 tokens: b1 would not fit
