import numpy as np
import pytest

from tasks.fill_mask import top_indices


@pytest.mark.parametrize("seed", range(20))
def test_top_indices_are_a_stable_argsort_of_the_negated_scores(seed):
    rng = np.random.default_rng(seed)
    # a vocabulary-sized row with many exact ties (scores drawn from few values), as softmax of fp32 logits can give
    scores = rng.integers(0, 50, size=30522).astype(np.float32) / 50
    for k in (1, 5, 100):
        expected = np.argsort(-scores, kind="stable")[:k]
        assert top_indices(scores, k).tolist() == expected.tolist()


def test_top_indices_of_the_whole_row_and_of_distinct_scores():
    scores = np.array([0.1, 0.4, 0.2, 0.3], dtype=np.float32)
    assert top_indices(scores, 4).tolist() == [1, 3, 2, 0]
    assert top_indices(scores, 2).tolist() == [1, 3]
