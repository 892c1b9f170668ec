"""The benchmarks read what a finished run leaves in `.coder/`: a change of those files must not
leave a bench broken until the next `tox -e bench` (bench/fleet.py read the run's branch from
its checkpoint long after the checkpoint stopped holding it). One quick run of the shared
reader, without Ray: the fleet bench's baseline mode, steps of no time."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_the_fleet_bench_reads_the_branch_and_steps_of_a_finished_run(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import fleet
    finally:
        sys.path.remove(str(BENCH))
    found = fleet.run_once(tmp_path, 0, "sequential", 0.0)
    assert found["steps"] == list(fleet.STEPS)
    assert len(found["tree"]) == 40 and found["level"] > 0
