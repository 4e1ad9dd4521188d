"""The chaos tier: randomized faults on a multi-node Ray cluster, invariants checked after each
run (docs/chaos.md). `harness` plans and runs one seed, `faults` injects, `jobs` holds the job
and step types the Ray workers import, `storage_faults` is the test-only storage wrapper."""
