"""The benchmark behind `choreography-ray bench`, shipped in the package so that an installed
wheel runs it (docs/benchmarks.md).

- `harness`: `BenchConfig` and `run`, the rounds and scenarios of one run on its own local Ray;
- `systems`: each system measured (the durable job, bare Ray tasks, one actor per step, the
  storage ceiling, a resume after the job actor is killed, the latency of a 1-step job);
- `workloads`: the job and step types the durable job runs (imported by path in Ray workers);
- `results`: what one run measured; `report`: the tables, the JSON file and the plot;
- `rss`: peak memory of the Ray processes, sampled.

Nothing is imported here: Ray workers import `workloads` alone.
"""
