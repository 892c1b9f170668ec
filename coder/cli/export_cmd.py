"""`coder export github|argo`: a taskfile's DAG as a GitHub Actions workflow or an Argo
Workflow, a job per step (coder.services.export; the Argo part, coder.services.argo, is
imported only for `argo`: it needs hera, an optional extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from coder.cli.common import PathType, cwd, emit_json, json_option
from coder.services import export as exporting

if TYPE_CHECKING:
    from pathlib import Path

EXPORT_EPILOG = """\b
Each step's job runs `coder worker` (it pushes the step's commit to refs/coder/RUN/steps/STEP);
the last job, `coordinator`, runs `coder run --executor pushed` and `coder push`. RUN is the
task id and the engine's run id, new for each workflow run. The model server is each
runner's: the repository variable OLLAMA_HOST (GitHub), the parameter ollama-host (Argo).

\b
Exit codes: 0 written (or already so), 2 an invalid taskfile or an OUT that differs (nothing
is written), 3 hera missing for `argo` (pip install 'coder[argo]').

\b
Examples:
  coder export github tasks/six.yaml -o .github/workflows/six.yaml
  coder export argo -f tasks/six.yaml --remote https://example.com/you/repo.git -o six.argo.yaml
"""


@click.command(epilog=EXPORT_EPILOG)
@click.argument("target", type=click.Choice(exporting.TARGETS))
@click.argument("given", required=False, metavar="[TASKFILE]", type=PathType())
@click.option("-f", "--file", "path", type=PathType(), help="The taskfile (YAML).")
@click.option(
    "-o",
    "--output",
    type=PathType(dir_okay=False),
    help="Write the file to OUT, not stdout; a different OUT is kept unless --force.",
)
@click.option("--force", is_flag=True, help="Replace OUT when it differs.")
@click.option(
    "--remote",
    help="The remote the jobs clone and push to: GitHub, a remote's name in the checkout "
    "(default origin); Argo, a URL, the repo parameter's default (else given at submit).",
)
@click.option(
    "--install",
    metavar="CMD",
    help="The shell command that installs coder on a runner "
    f"(default: {exporting.DEFAULT_INSTALL}).",
)
@click.option(
    "--runs-on",
    metavar="LABEL",
    help=f"GitHub: the jobs' runner label (default: {exporting.DEFAULT_RUNS_ON}).",
)
@click.option(
    "--image",
    help=f"Argo: the containers' image, with git and Python (default: {exporting.DEFAULT_IMAGE}).",
)
@json_option
def export(
    target: str,
    given: Path | None,
    path: Path | None,
    output: Path | None,
    force: bool,
    remote: str | None,
    install: str | None,
    runs_on: str | None,
    image: str | None,
    as_json: bool,
) -> None:
    """Write a taskfile's DAG as a GitHub Actions or Argo workflow, a job per step."""
    if (given is None) == (path is None):
        raise click.UsageError("pass the taskfile once: `coder export TARGET TASKFILE` or -f FILE")
    taskfile = given or path
    assert taskfile is not None
    if target == "github" and image is not None:
        raise click.UsageError("--image is Argo's: GitHub jobs run on --runs-on")
    if target == "argo" and runs_on is not None:
        raise click.UsageError("--runs-on is GitHub's: Argo's containers run --image")
    # `coder push` takes a remote's name; an Argo container has no checkout to name one in
    if target == "github" and remote is not None and exporting.is_url(remote):
        raise click.UsageError(
            f"--remote {remote}: a GitHub job pushes to a remote of its checkout: name it "
            "(origin, the default)"
        )
    if target == "argo" and remote is not None and not exporting.is_url(remote):
        raise click.UsageError(
            f"--remote {remote}: an Argo container clones a URL (https://..., git@host:path)"
        )
    spec = exporting.prepare(
        taskfile, cwd=cwd(), remote=remote, install=install, runs_on=runs_on, image=image
    )
    if target == "argo":
        from coder.services import argo

        text = exporting.render(target, spec, argo.argo_yaml)
    else:
        text = exporting.render(target, spec)
    if output is None:
        if as_json:
            emit_json({"target": target, "file": None, "text": text, "steps": len(spec.needs())})
        else:
            click.echo(text, nl=False)
        return
    written = exporting.write(output, text, force=force)
    if as_json:
        emit_json(
            {"target": target, "file": str(output), "written": written, "steps": len(spec.needs())}
        )
    else:
        done = "written" if written else "already up to date"
        click.echo(f"{output}: {target} workflow for {spec.taskfile} {done}", err=True)
