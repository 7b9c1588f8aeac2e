"""dalign_repro.experiments.demo: the stand-in model of chapters 7 and 8 is trained once per recipe, then loaded."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from dalign_repro.experiments.demo import shakespeare_llama  # noqa: E402


def test_a_recipe_is_trained_once_then_loaded_with_the_same_weights(tmp_path):
    first = shakespeare_llama(8, 1, 2, seed=0, context=16, batch=2, cache_dir=tmp_path)
    again = shakespeare_llama(8, 1, 2, seed=0, context=16, batch=2, cache_dir=tmp_path)
    assert first.trained and not again.trained and again.losses == first.losses
    assert not again.model.training
    for (name, a), (_, b) in zip(first.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(a, b), name
    other = shakespeare_llama(8, 1, 2, seed=1, context=16, batch=2, cache_dir=tmp_path)  # another recipe
    assert other.trained and len(list(tmp_path.iterdir())) == 2
    forced = shakespeare_llama(8, 1, 2, seed=0, context=16, batch=2, cache_dir=tmp_path, fresh=True)
    assert forced.trained and forced.losses == first.losses  # seeded: the same training again


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="multiple of 4"):
        shakespeare_llama(6, 1, 1)
