"""The persisted highest epoch (ha.coordination.epoch_store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ha.coordination.epoch_store import EpochStore, EpochStoreError


def test_new_data_dir_starts_at_epoch_zero(tmp_path: Path) -> None:
    assert EpochStore(tmp_path / "data").load() == 0


def test_raised_epoch_survives_a_restart(tmp_path: Path) -> None:
    assert EpochStore(tmp_path).raise_to(7)
    assert EpochStore(tmp_path).load() == 7
    assert (tmp_path / "epoch").read_text() == "7\n"


def test_epoch_never_goes_down(tmp_path: Path) -> None:
    store = EpochStore(tmp_path)
    store.raise_to(9)
    assert not store.raise_to(4)
    assert not store.raise_to(9)
    assert EpochStore(tmp_path).load() == 9


def test_a_higher_epoch_written_by_another_process_is_not_lowered(tmp_path: Path) -> None:
    mine, other = EpochStore(tmp_path), EpochStore(tmp_path)
    mine.raise_to(3)
    other.raise_to(5)
    assert mine.load() == 5
    assert not mine.raise_to(4)


def test_no_temporary_file_is_left_behind(tmp_path: Path) -> None:
    EpochStore(tmp_path).raise_to(2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch"]


@pytest.mark.parametrize("content", ["seven\n", "-1\n"])
def test_unreadable_epoch_file_is_an_error_naming_the_file(tmp_path: Path, content: str) -> None:
    (tmp_path / "epoch").write_text(content)
    with pytest.raises(EpochStoreError, match=str(tmp_path / "epoch")):
        EpochStore(tmp_path).load()


def test_negative_epoch_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        EpochStore(tmp_path).raise_to(-1)
