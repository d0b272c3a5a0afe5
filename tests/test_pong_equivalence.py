"""SafeA2C with ``logit_bound=None`` makes stock A2C's updates on Pong with rl-zoo's Atari configuration."""

from benchmarks.pong_equivalence import same_updates


def test_unbounded_safe_a2c_makes_stock_a2c_updates_bit_for_bit_on_pong() -> None:
    result = same_updates(updates=2, seed=0)
    assert result["updates"] == 2
    assert result["tensors_compared"] > 20  # every policy tensor and the RMSprop state
    assert result["bit_identical"], result["first_difference"]
