"""The actions over HTTP, to a recording stand-in of the clients: confirmations, the token,
CSRF, refusals with their error code, and the response headers. The same actions against real
jobs managers are in tests/runtime/test_dashboard.py."""

from __future__ import annotations

import re

import pytest

import choreography_ray as cr
from choreography_ray.dashboard import ActionRefused
from tests.dashboard.client import TOKEN, Client, RecordingActions, csrf_of
from tests.dashboard.seed import DEAD_LETTER, RUNNING_JOB, SCOPE

STOP = f"/jobs/{RUNNING_JOB}/stop"
REQUEUE = f"/schedules/{SCOPE}/dead-letters/{DEAD_LETTER}/requeue"
ACKNOWLEDGE = f"/schedules/{SCOPE}/dead-letters/{DEAD_LETTER}/acknowledge"


@pytest.mark.parametrize("op", ["stop", "resume", "retry-failed", "remove"])
def test_job_action__confirmed_while_logged_in_is_done_and_flashed(
    operator: Client, actions: RecordingActions, op: str
) -> None:
    operator.log_in()
    page = operator.get(f"/jobs/{RUNNING_JOB}").text
    assert f'href="/jobs/{RUNNING_JOB}/{op}" id="action-{op}"' in page

    confirmation = operator.get(f"/jobs/{RUNNING_JOB}/{op}")
    assert confirmation.status_code == 200
    assert 'id="confirm"' in confirmation.text and 'name="token"' not in confirmation.text
    done = operator.post(f"/jobs/{RUNNING_JOB}/{op}", data={"csrf": csrf_of(confirmation.text)})

    assert done.status_code == 303
    assert done.headers["location"] == ("/" if op == "remove" else f"/jobs/{RUNNING_JOB}")
    assert actions.calls == [(op, "studio", "tenant-a", RUNNING_JOB)]
    shown = operator.get(done.headers["location"]).text
    assert f"{op} of {RUNNING_JOB} done" in shown
    assert f"{op} of {RUNNING_JOB} done" not in operator.get("/").text  # once


def test_job_action__with_the_token_in_the_form_instead_of_a_session(
    operator: Client, actions: RecordingActions
) -> None:
    confirmation = operator.get(STOP).text
    assert 'name="token"' in confirmation
    csrf = csrf_of(confirmation)

    refused = operator.post(STOP, data={"csrf": csrf, "token": "wrong"})
    assert refused.status_code == 403 and "token" in refused.text
    assert operator.post(STOP, data={"csrf": csrf}).status_code == 403
    assert actions.calls == []
    assert operator.post(STOP, data={"csrf": csrf, "token": TOKEN}).status_code == 303
    assert actions.calls == [("stop", "studio", "tenant-a", RUNNING_JOB)]


def test_job_action__refused_shows_the_operations_error_code(
    operator: Client, actions: RecordingActions
) -> None:
    actions.refuse["stop"] = ActionRefused("JobIsNotRunning", "job-running is not running")
    operator.log_in()

    answer = operator.post(STOP, data={"csrf": operator.csrf(STOP)})

    assert answer.status_code == 409
    assert re.search(r'id="error-code">JobIsNotRunning</span>', answer.text)
    assert "job-running is not running" in answer.text
    assert 'id="confirm"' in answer.text  # the confirmation again, to retry or cancel


def test_csrf__a_post_without_or_with_a_wrong_or_foreign_check_is_refused(
    operator: Client, actions: RecordingActions
) -> None:
    operator.log_in()
    csrf = operator.csrf(STOP)

    assert operator.post(STOP, data={}).status_code == 403
    assert operator.post(STOP, data={"csrf": csrf[:-2] + "00"}).status_code == 403
    foreign = operator.post(STOP, data={"csrf": csrf}, headers={"origin": "http://evil.example"})
    assert foreign.status_code == 403 and "evil.example" in foreign.text
    operator.http.cookies.delete("cr_csrf")
    assert operator.post(STOP, data={"csrf": csrf}).status_code == 403
    assert actions.calls == []


def test_login__the_token_opens_a_session_a_wrong_one_does_not_and_logout_ends_it(
    operator: Client,
) -> None:
    assert operator.get("/login?token=nope").status_code == 403
    form = operator.get("/login").text
    wrong = operator.post("/login", data={"csrf": csrf_of(form), "token": "nope", "next": "/"})
    assert wrong.status_code == 403 and "not the dashboard" in wrong.text
    assert "log out" not in operator.get("/").text

    right = operator.post("/login", data={"csrf": csrf_of(form), "token": TOKEN,
                                          "next": "/schedules"})  # fmt: skip
    assert right.status_code == 303 and right.headers["location"] == "/schedules"
    page = operator.get("/").text
    assert "log out" in page
    assert operator.post("/logout", data={"csrf": csrf_of(page)}).status_code == 303
    assert "log out" not in operator.get("/").text


def test_login__never_sends_elsewhere(operator: Client) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "javascript:alert(1)"):
        answer = operator.get(f"/login?token={TOKEN}&next={target}")
        assert answer.headers["location"] == "/"


def test_read_only__no_action_is_offered_nor_done(reader: Client) -> None:
    reader.log_in()
    assert 'id="action-stop"' not in reader.get(f"/jobs/{RUNNING_JOB}").text
    assert reader.get(STOP).status_code == 403
    answer = reader.post(STOP, data={"csrf": reader.csrf("/login"), "token": TOKEN})
    assert answer.status_code == 403 and "--address" in answer.text
    assert reader.get(REQUEUE).status_code == 403


def test_dead_letter__requeue_asking_afresh_and_acknowledge_with_a_note(
    operator: Client, actions: RecordingActions
) -> None:
    operator.log_in()
    confirmation = operator.get(REQUEUE).text
    assert 'name="ask_afresh"' in confirmation
    requeued = operator.post(REQUEUE, data={"csrf": csrf_of(confirmation), "ask_afresh": "on"})
    assert requeued.status_code == 303
    assert requeued.headers["location"] == f"/schedules/dead-letters?scope={SCOPE}"
    assert f"{DEAD_LETTER} requeued" in operator.get(requeued.headers["location"]).text

    csrf = operator.csrf(ACKNOWLEDGE)
    without = operator.post(ACKNOWLEDGE, data={"csrf": csrf, "note": "  "})
    assert without.status_code == 409 and "NoteRequired" in without.text
    assert (
        operator.post(ACKNOWLEDGE, data={"csrf": csrf, "note": "known outage"}).status_code == 303
    )
    assert actions.calls == [("requeue", SCOPE, DEAD_LETTER, True),
                             ("acknowledge", SCOPE, DEAD_LETTER, "known outage")]  # fmt: skip


def test_dead_letters__requeue_all_and_acknowledge_all_of_a_manifest(
    operator: Client, actions: RecordingActions
) -> None:
    operator.log_in()
    page = operator.get(f"/schedules/dead-letters?scope={SCOPE}&manifest=hourly").text
    requeue_all = f"/schedules/{SCOPE}/dead-letters/all/requeue"
    assert 'id="requeue-all"' in page and f"{requeue_all}?manifest=hourly" in page
    confirmation = operator.get(f"{requeue_all}?manifest=hourly").text
    assert "every dead letter awaiting intervention of <b>hourly</b>" in confirmation
    assert '<dd id="awaiting">1 dead letter(s) now</dd>' in confirmation
    csrf = csrf_of(confirmation)
    done = operator.post(requeue_all, data={"csrf": csrf, "manifest": "hourly"})
    assert done.status_code == 303
    assert done.headers["location"] == f"/schedules/dead-letters?scope={SCOPE}&manifest=hourly"
    assert "every dead letter requeued" in operator.get(done.headers["location"]).text
    acknowledge_all = f"/schedules/{SCOPE}/dead-letters/all/acknowledge"
    without = operator.post(acknowledge_all, data={"csrf": csrf, "note": ""})
    assert without.status_code == 409 and "NoteRequired" in without.text
    assert operator.post(acknowledge_all, data={"csrf": csrf, "note": "seen"}).status_code == 303
    assert actions.calls == [("requeue_all", SCOPE, "hourly", False),
                             ("acknowledge_all", SCOPE, None, "seen")]  # fmt: skip


def test_dead_letter__refused_shows_the_schedulers_error_code(
    operator: Client, actions: RecordingActions
) -> None:
    actions.refuse["acknowledge"] = ActionRefused("DeadLetterAlreadyResolved", "resolved")
    operator.log_in()
    answer = operator.post(ACKNOWLEDGE, data={"csrf": operator.csrf(ACKNOWLEDGE), "note": "n"})
    assert answer.status_code == 409 and "DeadLetterAlreadyResolved" in answer.text
    assert ">n</textarea>" in answer.text  # the note is kept for a retry


def test_unknown_job_or_dead_letter_or_operation__404(operator: Client) -> None:
    operator.log_in()
    csrf = operator.csrf("/")
    assert operator.get("/jobs/nobody/stop").status_code == 404
    assert operator.post("/jobs/nobody/stop", data={"csrf": csrf}).status_code == 404
    assert operator.get(f"/jobs/{RUNNING_JOB}/explode").status_code == 404
    assert operator.get(f"/schedules/{SCOPE}/dead-letters/nobody/requeue").status_code == 404
    assert operator.get(f"/schedules/other/dead-letters/{DEAD_LETTER}/requeue").status_code == 404


def test_headers__no_framing_no_sniffing_no_referrer_and_only_own_scripts(reader: Client) -> None:
    for path in ("/", f"/jobs/{RUNNING_JOB}", "/jobs/nobody", "/static/live.js"):
        headers = reader.get(path).headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert "default-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"


def test_cookies__http_only_and_same_site_strict(operator: Client) -> None:
    session = operator.get(f"/login?token={TOKEN}").headers["set-cookie"]
    assert "HttpOnly" in session and "SameSite=strict" in session
    csrf = operator.get("/").headers.get("set-cookie", "")
    assert not csrf or ("HttpOnly" in csrf and "SameSite=strict" in csrf)


def test_hosts__a_request_naming_another_host_is_refused(reader: Client) -> None:
    assert reader.get("/", headers={"host": "rebound.example"}).status_code == 400
    assert reader.get("/", headers={"host": "localhost:8266"}).status_code == 200


def test_job_page__a_running_job_shows_its_pools_and_a_done_one_asks_for_none(
    operator: Client, actions: RecordingActions
) -> None:
    nodes = ("a1b2c3d4e5f6", "f6e5d4c3b2a1")
    actions.pools = [
        cr.PoolState(shape="num_gpus=1", hosts=4, pending=1, busy=256, queued=3840, nodes=nodes)
    ]

    page = operator.get(f"/jobs/{RUNNING_JOB}").text
    done = operator.get("/jobs/job-done").text

    assert '<h2 id="pools">Pools</h2>' in page
    row = re.search(r"<tr><td><code>num_gpus=1</code></td>(.*?)</tr>", page)
    assert row is not None
    assert re.findall(r'<td class="num">([^<]*)</td>', row.group(1)) == ["4", "1", "256", "3,840"]
    assert "<code>a1b2c3d4</code>" in row.group(1)
    assert 'id="pools"' not in done
