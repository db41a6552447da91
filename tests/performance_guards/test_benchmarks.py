"""The benchmark's own schedule: what its ratios rest on (``benchmarks/``, not the package)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_each_guarded_transfer_and_its_twin_take_turns_going_first(monkeypatch):
    """``_rounds`` reverses every other round's schedule; a pair's own order must not undo
    that (it did: the unguarded twin of a single pair ran first in every round)."""
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import peers

    monkeypatch.setattr(peers, "log", lambda *args: None)
    monkeypatch.setitem(peers.GUARD_PAIRS_PER_ROUND, "legacy", 1)
    monkeypatch.setitem(peers.GUARD_PAIRS_PER_ROUND, "lazy-plan", 3)
    ran: list[str] = []
    names = ["native", "legacy", "legacy twin", "lazy-plan", "lazy-plan twin"]
    cases = {name: (lambda name=name: ran.append(name) or 0.0) for name in names}
    runs = 6
    times = peers.rounds(cases, runs, {"legacy": "legacy twin", "lazy-plan": "lazy-plan twin"})
    assert {name: len(seconds) for name, seconds in times.items()} == {
        "native": runs, "legacy": runs, "legacy twin": runs,
        "lazy-plan": 3 * runs, "lazy-plan twin": 3 * runs,
    }  # fmt: skip
    for case in ("legacy", "lazy-plan"):
        twin = f"{case} twin"
        pairs = [name for name in ran if name in (case, twin)]
        firsts = [pairs[index] for index in range(0, len(pairs), 2)]
        measured = firsts[len(firsts) // (runs + 1) :]  # the warm-up round is dropped
        assert measured.count(case) == measured.count(twin), case
        per_round = len(measured) // runs
        rounds = [measured[i : i + per_round] for i in range(0, len(measured), per_round)]
        assert all(a != b for a, b in zip(rounds, rounds[1:], strict=False)), case
