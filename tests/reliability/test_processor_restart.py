"""A restarted processor does not publish a verdict a second time (issue 31, finding 6), even without its
checkpoint (tests/processor/test_checkpoint.py has the restarts that restore one).

The real program, twice over one ``--state-dir``: the first run names a hung collective, is
stopped, and the second is sent the same collective's evidence again (as an agent still
reporting a hung collective, or a gateway replaying its queue, sends it). Before, the second
run published the verdict again: a second alert for one incident; and a run that did not publish it
again left its job without an open incident, so the page resolved while the job was still hung.
"""

from __future__ import annotations

import os
import time

from service_helpers import hung_payload, post, start_processor


def _root_causes(metrics: str) -> list[str]:
    return [ln for ln in metrics.splitlines() if ln.startswith("mycroft_root_causes_total{")]


def _wait_root_causes(proc, n: int, timeout_s: float = 60.0) -> list[str]:
    end = time.monotonic() + timeout_s
    while len(_root_causes(proc.metrics())) < n and time.monotonic() < end:
        time.sleep(0.5)
    return _root_causes(proc.metrics())


def test_restart_does_not_publish_a_verdict_again(tmp_path):
    state = tmp_path / "state"
    first = start_processor(tmp_path, "--state-dir", str(state))
    try:
        assert post(first.http_port, hung_payload(1))[0] == 200
        assert len(_wait_root_causes(first, 1)) == 1
    finally:
        first.stop()
    assert oct(os.stat(state).st_mode & 0o777) == "0o700"
    assert os.path.getsize(state / "published-verdicts") == 16  # one trace id
    # without the checkpoint written at the verdict (killed before it was written, or a checkpoint of another
    # version): the published trace ids alone keep the verdict from being published again
    os.unlink(state / "detector-history")
    second = start_processor(tmp_path, "--state-dir", str(state))
    try:
        assert post(second.http_port, hung_payload(1))[0] == 200  # the same collective, again
        # not published again, but the job's incident is open again (its page stays firing while it is hung)
        end = time.monotonic() + 60
        while "mycroft_incidents_open{" not in second.metrics() and time.monotonic() < end:
            time.sleep(0.5)
        assert "mycroft_incidents_open{" in second.metrics()
        assert not _root_causes(second.metrics())
        assert post(second.http_port, hung_payload(2))[0] == 200  # a new one: still named
        lines = _wait_root_causes(second, 1)
        time.sleep(2.0)  # both stalls are past the threshold by now: the first would have been named too
        lines = _root_causes(second.metrics())
        log = second.log()
    finally:
        second.stop()
    assert len(lines) == 1 and f'comm="{0x6A02:016x}"' in lines[0], lines
    assert "was published before a restart: not published again" in log
    assert os.path.getsize(state / "published-verdicts") == 32


def test_state_dir_of_others_is_refused(tmp_path):
    import subprocess
    import sys

    from service_helpers import ROOT

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    r = subprocess.run([sys.executable, "-m", "mycroft_otel", "processor", "--state-dir", str(shared),
                        "--grpc-port", "-1", "--http-port", "0", "--metrics-port", "-1"], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "writable by group or others" in r.stderr and "--state-dir" in r.stderr, r.stderr
