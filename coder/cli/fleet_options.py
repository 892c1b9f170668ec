"""`coder run`'s options for a run whose steps run on other machines (coder.fleet)."""

from __future__ import annotations

from typing import Any

import click

from coder.fleet.engines import ENGINES
from coder.run.manifest import Fleet


def fleet_options(func: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--executor",
                type=click.Choice(ENGINES),
                help="Run each step in a `coder worker` on an engine, in its own clone of "
                "--remote: local (processes here), ray (a Ray cluster), pushed (take what "
                "workers elsewhere pushed: a CI workflow's last job). Kept for resume.",
            ),
            click.option(
                "--remote",
                help="With --executor: the remote (a name or a URL) workers clone and push "
                "to; the only state they share.",
            ),
            click.option(
                "--workers",
                type=click.IntRange(1, 256),
                help="With --executor: workers at once (default: --max-parallel's).",
            ),
            click.option(
                "--ray-address",
                help="With --executor ray: the cluster's address (default: a local one).",
            ),
        ]
    ):
        func = option(func)
    return func


def fleet_of(
    executor: str | None, remote: str | None, workers: int | None, ray_address: str | None
) -> Fleet | None:
    """The run's Fleet (None: its steps run here); a usage error for options without it."""
    if executor is None:
        given = [n for n, v in (("--remote", remote), ("--workers", workers)) if v]
        given += ["--ray-address"] if ray_address else []
        if given:
            raise click.UsageError(f"{', '.join(given)} go with --executor")
        return None
    if not remote:
        raise click.UsageError("--executor needs --remote: the remote workers clone and push to")
    return Fleet(executor, remote, workers, ray_address)
