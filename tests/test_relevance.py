import pytest

from evaluator.core.relevance import BUILTIN_PROFILES, RelevanceProfile


def test_builtin_profiles() -> None:
    ecom = BUILTIN_PROFILES["ecommerce"]
    assert [ecom.grade(t) for t in ("click", "add_to_cart", "purchase")] == [1, 2, 3]
    detailed = BUILTIN_PROFILES["ecommerce_detailed"]
    assert [detailed.grade(t) for t in ("hover", "detail_view", "purchase")] == [1, 3, 5]
    assert not detailed.accepts("click")
    binary = BUILTIN_PROFILES["binary"]
    assert binary.accepts("anything") and binary.grade("anything") == 1.0
    video = BUILTIN_PROFILES["video"]
    assert video.grade("watch", 45_000) == 1.0  # capped at 1
    assert video.grade("watch", 3_000, 12_000) == 0.25  # event duration beats target


def test_custom_profile_validation() -> None:
    with pytest.raises(ValueError):
        RelevanceProfile("empty")
    with pytest.raises(ValueError):
        RelevanceProfile("neg", grades={"click": -1})
    assert RelevanceProfile("mine", grades={"like": 2}).max_grade == 2
