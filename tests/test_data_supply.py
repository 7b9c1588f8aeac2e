"""Data supply checks: too few sequences fail with the numbers, repeated data warns above a threshold."""

from __future__ import annotations

import warnings

import pytest

from dalign_repro.data import (
    DataSupplyError,
    RepeatedDataWarning,
    check_epochs,
    require_sequences,
    training_epochs,
)


def test_require_sequences_passes_when_there_is_enough():
    assert require_sequences("held-out", 746, 746, seq_len=256, field="pool_size=746") == 746
    assert require_sequences("validation", 10, 0, seq_len=64, field="lr_search_sequences=0") == 0


def test_require_sequences_error_carries_the_numbers():
    with pytest.raises(DataSupplyError) as err:
        require_sequences("held-out", 746, 1024, seq_len=256, field="pool_size=1024",
                          hint="use a larger corpus (corpus='dir:/path') or a smaller pool")
    msg = str(err.value)
    assert msg == ("held-out split has 746 sequences of 256 tokens; pool_size=1024 needs 278 more: "
                   "use a larger corpus (corpus='dir:/path') or a smaller pool")
    assert isinstance(err.value, ValueError)
    with pytest.raises(DataSupplyError, match=r"^train split has 10 sequences of 64 tokens; "
                       r"pool_size \+ eval_sequences = 2048 needs 2038 more: use a larger corpus "
                       r"\(corpus='dir:/path' or 'hf:<dataset>'\) or ask for fewer$"):
        require_sequences("train", 10, 2048, seq_len=64, field="pool_size + eval_sequences = 2048")
    with pytest.raises(ValueError, match="must be >= 0"):
        require_sequences("train", -1, 2, seq_len=64, field="x")


def test_training_epochs():
    assert training_epochs(600, 32, 5683) == pytest.approx(600 * 32 / 5683)
    assert training_epochs(0, 32, 10) == 0.0
    with pytest.raises(DataSupplyError, match="training split has 0 sequences; 10 steps of 32"):
        training_epochs(10, 32, 0)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        training_epochs(10, 0, 100)


def test_check_epochs_warns_above_the_threshold_only():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning would fail here
        assert check_epochs(4.0) == 4.0
        assert check_epochs(training_epochs(600, 32, 5683)) == pytest.approx(3.378, abs=1e-3)
        assert check_epochs(9.0, max_epochs=10) == 9.0
    with pytest.warns(RepeatedDataWarning, match=r"56\.31 passes over its training split \(more than max_epochs=4\)") as rec:
        epochs = check_epochs(training_epochs(10_000, 32, 5683))
    assert epochs == pytest.approx(10_000 * 32 / 5683)
    assert rec[0].filename == __file__  # stacklevel=2 points at the caller
    with pytest.warns(RepeatedDataWarning, match="1.50 passes.*max_epochs=1"):
        check_epochs(1.5, max_epochs=1)
    with pytest.raises(ValueError, match="finite"):
        check_epochs(float("nan"))
