"""The rules of a job activation, with no `import ray`.

`job.JobCore` is one job's activation: it takes operations (start, a batch of reports, stop,
resume, recover, remove, retry-failed, a watchdog tick, a pump step) one turn at a time
(`turns.py`) and carries them out against an injected `Storage` and an injected `Hosts`
(`hosts.py`). Its mode is one value of `mode.py`'s table; its steps are rows of one table
(`window.py`). What it does lives in flows, functions over the activation that never take a
turn: `job_record.py` (the one writer of the record), `plan_writer.py`, `stage_flow.py`,
`dispatch.py`, `host_watch.py`, `settling.py` (outcomes), `stop_flow.py`, `resume_flow.py` and
`tick.py` (the pump and the watchdog, by mode). The pure rules they apply live in the modules
their names promise: `stages.py`, `counting.py`, `stopping.py`, `resuming.py`, `retries.py`,
`watchdog.py`, `leases.py`, `planning.py`, and the job status table in `transitions.py`. What it
records for metrics goes through the injected port of `metrics.py`, once per turn. The Ray shell
is `choreography_ray.runtime.job_actor`. `cleanup.py` is the jobs manager's retention and
dead-job cleanup (its shell is `choreography_ray.runtime.manager`).
"""
