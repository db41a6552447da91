"""Spool/artifact files: length-prefixed marshal blocks, digest, truncation."""

from __future__ import annotations

import pytest

from dpone_native_transfer.artifacts import file_sha256, read_chunks, write_chunks
from dpone_native_transfer.errors import ArtifactInvalid

CHUNKS = [[(1, "a", 1.5, None, b"x")], [], [(2, "b", -0.0, 7, b"")] * 3]


def _write(path):
    with open(path, "wb") as handle:
        return write_chunks(handle, CHUNKS)


def test_round_trip_keeps_chunks_types_and_order(tmp_path):
    path = tmp_path / "p.rows"
    rows, digest = _write(path)
    assert rows == 4
    assert list(read_chunks(path)) == CHUNKS
    assert digest == file_sha256(path)


def test_empty_file_yields_nothing(tmp_path):
    path = tmp_path / "p.rows"
    path.write_bytes(b"")
    assert list(read_chunks(path)) == []


@pytest.mark.parametrize("cut", [1, 3, 8, 9, 20])
def test_truncated_file_raises_instead_of_returning_partial_data(tmp_path, cut):
    path = tmp_path / "p.rows"
    _write(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - cut])
    with pytest.raises(ArtifactInvalid) as info:
        list(read_chunks(path))
    assert info.value.code == "native_transfer_artifact_invalid"
    assert info.value.diagnostics["file"] == "p.rows"
    assert str(tmp_path) not in str(info.value) + repr(info.value.diagnostics)


def test_undecodable_block_raises(tmp_path):
    path = tmp_path / "p.rows"
    path.write_bytes((4).to_bytes(8, "big") + b"\xff\xff\xff\xff")
    with pytest.raises(ArtifactInvalid):
        list(read_chunks(path))


def test_file_ending_inside_a_length_prefix_raises(tmp_path):
    path = tmp_path / "p.rows"
    with open(path, "wb") as handle:
        write_chunks(handle, CHUNKS[:1])
    with open(path, "ab") as handle:
        handle.write(b"\x00\x00\x00")
    with pytest.raises(ArtifactInvalid) as info:
        list(read_chunks(path))
    assert info.value.diagnostics["read_bytes"] == 3


def test_the_open_files_a_scan_may_hold_are_a_quarter_of_the_process_limit():
    """Read at each call: a process that lowers its limit is held to it (Linux's usual 1,024
    gives 256, the bound every engine's pull had before). A machine whose hard limit is
    lower checks its own hard limit in place of 1,024."""
    import resource
    import subprocess
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    usual = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
    code = (
        "import resource\n"
        "from dpone_native_transfer.artifacts import open_files_allowed\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        f"for soft in (64, {usual}):\n"
        "    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
        "    print(open_files_allowed())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["16", str(usual // 4)]
