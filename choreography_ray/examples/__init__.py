"""Job types shipped with the package, importable by path in every Ray worker.

`choreography_ray.examples.demo:DemoJob` is the job `choreography-ray demo` runs.
"""
