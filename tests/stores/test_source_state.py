"""The source state is typed (``SourceState``) and stored exactly as before: a store written
by the release before the attempt was re-cut is read and written back byte for byte."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import attrs
import pytest

from dpone_native_transfer.checkpoints import RouteKey, Strategy
from dpone_native_transfer.errors import CheckpointStoreCorrupt
from dpone_native_transfer.source_state import Edge, SourceState
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore

BEFORE = Path(__file__).parents[1] / "data" / "source-state"  # written by make.py there
ROUTE = RouteKey("orders", "orders_copy", Strategy.INCREMENTAL_APPEND)


def _stored(path: Path) -> dict[RouteKey, str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT source_table, target_table, strategy, source_location, target_location, "
            "state FROM source_state"
        ).fetchall()
    return {RouteKey(*row[:3], row[3], row[4]): row[5] for row in rows}


def test_every_state_the_earlier_release_wrote_is_read_and_written_back_byte_for_byte(tmp_path):
    store_file = tmp_path / "store.db"
    shutil.copy(BEFORE / "store.db", store_file)
    before = _stored(store_file)
    assert len(before) == 3  # the control: the three routes of make.py, edge record and all
    assert any('"edge"' in text and '"rows"' in text for text in before.values())
    with SQLiteCheckpointStore(store_file) as store:
        for route in before:
            state = SourceState.read(route, store.load_source_state(route))
            assert state is not None and state.definition is not None
            store.save_source_state(route, state.stored())
            Edge.of_state(route, state)  # the edge record reads as the planner reads it
    assert _stored(store_file) == before


def test_a_state_that_is_changed_is_written_with_the_change_and_nothing_else(tmp_path):
    store_file = tmp_path / "store.db"
    shutil.copy(BEFORE / "store.db", store_file)
    route, text = next(iter(_stored(store_file).items()))
    with SQLiteCheckpointStore(store_file) as store:
        state = SourceState.read(route, store.load_source_state(route))
        assert state is not None
        store.save_source_state(route, attrs.evolve(state, generation=9).stored())
        assert store.load_source_state(route) == {**json.loads(text), "generation": 9}


@pytest.mark.parametrize(
    ("stored", "field"),
    [
        ({"generation": -1}, "generation"),
        ({"generation": True}, "generation"),
        ({"generation": "1"}, "generation"),
        ({"generation": 1, "watermark": [1]}, "watermark"),
        ({"generation": 1, "watermark": float("nan")}, "watermark"),
    ],
)
def test_a_malformed_state_is_a_corrupt_store_naming_the_field(stored, field):
    with pytest.raises(CheckpointStoreCorrupt) as caught:
        SourceState.read(ROUTE, stored)
    assert caught.value.diagnostics["field"] == field


def test_a_route_that_never_completed_has_no_state_and_a_refresh_realigns_one():
    assert SourceState.read(ROUTE, None) is None
    realigned = SourceState(generation=4, watermark=1, definition={"x": 1}).realigned(7)
    assert (realigned.generation, realigned.watermark, realigned.definition) == (4, 7, None)
    assert Edge.of_state(ROUTE, realigned) == Edge(upto=7, nulls=False)
