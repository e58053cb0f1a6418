from moebench.timing.schedule import round_order, schedule


def test_odd_rounds_forward_even_reversed():
    arms = ("a", "b", "c")
    assert round_order(arms, 1) == ("a", "b", "c")
    assert round_order(arms, 2) == ("c", "b", "a")
    assert round_order(arms, 3) == ("a", "b", "c")


def test_schedule_visits_every_shape_each_round_in_order():
    visits = schedule(["A8", "Q8"], ["x", "y"], 2)
    assert visits == [(1, "A8", "x"), (1, "A8", "y"), (1, "Q8", "x"), (1, "Q8", "y"),
                      (2, "A8", "y"), (2, "A8", "x"), (2, "Q8", "y"), (2, "Q8", "x")]


def test_rounds_are_one_based():
    import pytest
    with pytest.raises(ValueError):
        round_order(("a",), 0)


def test_a_seeded_order_is_drawn_per_pair_of_rounds_and_reversed_in_the_second():
    from moebench.timing.schedule import round_order
    arms = tuple("abcdef")
    orders = [round_order(arms, r, seed=7) for r in range(1, 13)]
    for odd, even in zip(orders[0::2], orders[1::2]):
        assert sorted(odd) == list(arms) and even == tuple(reversed(odd))  # drift cancels pair by pair
    assert len(set(orders[0::2])) > 1  # the pairs do not all share one order
    assert orders == [round_order(arms, r, seed=7) for r in range(1, 13)]  # the seed fixes them
    assert orders != [round_order(arms, r, seed=8) for r in range(1, 13)]
    firsts = {o[0] for o in orders[0::2]}
    assert len(firsts) > 1  # no arm is always first


def test_copies_turn_sample_by_sample_and_every_row_holds_each_copy_equally():
    from collections import Counter

    from moebench.timing.schedule import copy_index
    P, samples = 8, 32
    for r in (1, 2, 5):
        counts = Counter(copy_index(r, i, P, "samples") for i in range(samples))
        assert counts == {k: samples // P for k in range(P)}
    assert [copy_index(r, 0, 3, "rounds") for r in range(1, 7)] == [0, 1, 2, 0, 1, 2]
    assert copy_index(2, 0, 8, "samples") == 1 and copy_index(2, -1, 8, "samples") == 0  # warm-ups turn too
    import pytest
    with pytest.raises(ValueError):
        copy_index(1, 0, 4, "sideways")


def test_placements_fit_memory_and_share_samples_evenly():
    from moebench.run.prepare import balanced_placements, fitting_placements
    assert fitting_placements(16, 2 * 2**30, 9 * 2**30) == 5  # the first copy and four more
    assert fitting_placements(16, 2 * 2**30, 0) == 1 and fitting_placements(4, 1, 10**12) == 4
    assert [balanced_placements(f, 32) for f in (16, 12, 7, 3, 1)] == [16, 8, 4, 2, 1]
    assert balanced_placements(16, 30) == 15 and balanced_placements(5, 30) == 5
