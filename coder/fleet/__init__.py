"""A run's steps on more than one machine, with the git remote as the only shared state.

    jobs.py        WorkerJob and WorkerResult (JSON both ways), and one worker as a process
    refs.py        the run's refs on the remote (`refs/coder/RUN/steps/S`, `.../base`):
                   fetched, and a step commit pushed once (compare-and-swap "must not exist")
    worker.py      `coder worker`: clone, build the step's start, run the step, push its commit
    engines.py     where workers run: local (a pool of processes), pushed (already pushed by
                   an engine elsewhere: CI), ray (coder.fleet.ray_engine, when installed)
    ray_engine.py  the ray engine: one Ray task per job (imports ray: `coder[ray]`)
    coordinator.py `coder run --executor`: the run's batches dispatched to an engine and the
                   pushed commits taken back for the executor to land

May import: run and everything below it. Never services, plan, mcp or CLI.
"""
