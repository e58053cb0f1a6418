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
