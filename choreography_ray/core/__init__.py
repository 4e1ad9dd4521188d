"""The rules of a job activation, with no `import ray`.

`job.JobCore` is one job's activation: it takes operations (start, a batch of reports, stop,
resume, recover, remove, retry-failed, a watchdog tick, a pump step) one turn at a time
(`turns.py`) and carries them out against an injected `Storage` and an injected `Hosts`
(`hosts.py`). Each spec rule lives in the module its name promises: `stages.py`, `window.py`,
`counting.py`, `stopping.py`, `resuming.py`, `retries.py`, `watchdog.py`, `leases.py`, and the
job status table in `transitions.py`. What it records for metrics goes through the injected port
of `metrics.py`, once per turn. The Ray shell is `choreography_ray.runtime.job_actor`.
`cleanup.py` is the jobs manager's retention and dead-job cleanup (its shell is
`choreography_ray.runtime.manager`).
"""
