"""The share of a row's remaining budget kept free for it at admission (engine/growth.py)."""

from services.worker.engine.growth import GrowthEstimate


def test_the_share_grows_at_each_preemption_up_to_all_of_the_budget():
    growth = GrowthEstimate(ratio=0.5, step=0.2)
    growth.preempted()
    assert growth.ratio == 0.7
    for _ in range(5):
        growth.preempted()
    assert growth.ratio == 1.0


def test_the_share_decays_while_nothing_is_preempted_down_to_its_floor():
    growth = GrowthEstimate(ratio=0.2, floor=0.1, decay=0.04)
    growth.calm()
    assert abs(growth.ratio - 0.16) < 1e-9
    for _ in range(10):
        growth.calm()
    assert growth.ratio == 0.1


def test_the_tokens_kept_round_up():
    assert GrowthEstimate(ratio=0.5).tokens(7) == 4
    assert GrowthEstimate(ratio=0.0).tokens(7) == 0
    assert GrowthEstimate(ratio=1.0).tokens(7) == 7
