"""The documentation stays true: every emitted key is in docs/span-schema.md, every agent knob in docs/agent.md."""

from __future__ import annotations

import re
import time
from pathlib import Path

from mycroft_otel import config
from mycroft_otel import semconv as sc
from agent_helpers import make_agent
from agent_shm import KIND_SEND, SEND, FakeRing

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_emitted_key_is_documented(tmp_path, otel_env):
    r0 = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    r1 = FakeRing(tmp_path / "r1", rank=1, nranks=2)
    for _ in range(3):
        r0.op_done()
        r1.op_done()
    r0.op_done(kind=KIND_SEND, func=SEND, peer=1)
    r0.op_done(func=0, peer=1)  # Broadcast: root
    r0.begin(r0.make_op(done=2, wait_state=(1, 4)))
    agent = make_agent(tmp_path, sample_ratio=1.0, inflight_after_ms=1, snapshot_ms=10, idle_after_ms=1,
                       summary_ms=100, detail="chunk")
    agent.poll_once()
    time.sleep(0.15)
    agent.poll_once()
    assert agent.queue.flush(10)
    agent.close()
    spans = otel_env.sink.spans
    names = {s["name"] for s in spans}
    assert {"nccl.AllReduce", "nccl.Send", "nccl.Broadcast", sc.INFLIGHT_SPAN, sc.STATUS_SPAN,
            sc.SUMMARY_SPAN} <= names
    keys = set()
    for s in spans:
        keys |= set(s["attrs"]) | set(s["resource"])
        for lk in s["links"]:
            keys |= set(lk["attrs"])
        for e in s["events"]:
            keys |= set(e[2])
    keys -= {"deployment.environment"}  # from OTEL_RESOURCE_ATTRIBUTES in the test
    keys = {k for k in keys if not k.startswith("telemetry.sdk.")}
    doc = (DOCS / "span-schema.md").read_text()
    missing = sorted(k for k in keys if f"`{k}`" not in doc and not re.search(rf"`[^`]*{re.escape(k)}", doc))
    assert not missing, missing


def test_every_agent_knob_is_documented():
    doc = (DOCS / "agent.md").read_text()
    agent_vars = [v.name for v in config.VARS.values() if "agent" in v.used_by.split(",")]
    assert agent_vars and not [v for v in agent_vars if f"`{v}`" not in doc]
