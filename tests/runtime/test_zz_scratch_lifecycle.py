import time
import ray
from tests.runtime.test_lifecycle import *  # noqa
from tests.runtime.test_lifecycle import _STARTED, step_hosts


def test_scratch(connect, scope, storage_url):
    manager = connect(progress_save_interval=60).manager(scope, "stop")
    job_id = start(manager, Traced, Work(n=0, ignore_stop=True), Work(n=1, block=True))
    wait_started(job_id, 2)
    manager.stop(job_id)
    eventually(lambda: [e for e in ends(job_id) if e[2] == 1], 10, "the obedient step to stop")
    print("hosts before", [ray.get(h.running_steps.remote(job_id)) for h in step_hosts()])
    print([ (s.step_id, s.status) for s in stored_steps(storage_url, job_id)])
    kill_job_actor(job_id)
    print("hosts after", [ray.get(h.running_steps.remote(job_id)) for h in step_hosts()])
    for i in range(10):
        st = manager.get(job_id)
        print(time.time(), st.status, st.stop_finalized, progress(st), ask(job_id, "active_steps"))
        time.sleep(0.2)
    print(read(job_id, "on_stopped"), ends(job_id))
    set_flag(job_id, "go")
    assert False
