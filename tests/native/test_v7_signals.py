"""v7's signals through the ABI driver and the real plugin: the per-call userTag and the KernelPhase times per
channel reach the ring record and the span attributes; v4..v6, fed the same rows, record neither and lose
nothing else (absent but harmless)."""

from __future__ import annotations

import pytest

from events import Seq, ring_allreduce
from mycroft_otel import native
from mycroft_otel import semconv as sc
from mycroft_otel.agent.spans import kernel_attributes
from mycroft_otel.native import Driver

TAG = (7 << 56) | 1234  # a framework's own id in the high byte, a training step below
PHASES = (700, 250, 50)  # initial sync, compute, final sync (ns, GPU time)


def _run(plugin_so: str, ring_dir, version: int, kernel_events: str | None) -> tuple[dict, list]:
    d = Driver(plugin_so, version=version, slots=1 << 14)
    env = {"MYCROFT_RING_DIR": str(ring_dir), "MYCROFT_JOB_ID": "v7"}
    if kernel_events is not None:
        env["MYCROFT_KERNEL_EVENTS"] = kernel_events
    ctx = d.init("v7", 0x7A7A, 1, 2, 0, env=env)
    q = Seq()
    for s in range(3):
        ring_allreduce(q, ctx, 0, 2, s, n_channels=2, user_tag=TAG + s, phases_ns=PHASES)
    d.replay(q.array())
    (path,) = native.ring_files(ring_dir)
    r = native.open_ring(path)
    recs, _, _ = r.read(0, 1 << 10, False)
    header = r.header()
    d.finalize(ctx)
    return header, list(recs)


@pytest.mark.parametrize("version", [7])
def test_v7_tag_and_phases_reach_the_record_and_the_span(plugin_so, ring_dir, version):
    header, recs = _run(plugin_so, ring_dir, version, "phase")
    assert header["abi_version"] == 7 and header["activation_mask"] & int(native.EventType.KernelPhase)
    assert len(recs) == 3
    for s, rec in enumerate(recs):
        op = rec["op"]
        assert int(op["user_tag"]) == TAG + s
        assert int(op["kch_valid"]) == 0b11 and int(op["kernel_ch_stopped"]) == 2
        k = rec["kch"][:2]
        assert (k["phase_end_ns"] - k["phase_start_ns"]).tolist() == [list(PHASES)] * 2
        attrs = dict(kernel_attributes(op, rec["kch"]))
        assert attrs[sc.COLL_USER_TAG] == TAG + s
        assert attrs[sc.KERNEL_CH_CHANNEL] == [0, 1]
        assert attrs[sc.KERNEL_INITIAL_SYNC] == [PHASES[0]] * 2
        assert attrs[sc.KERNEL_COMPUTE] == [PHASES[1]] * 2 and attrs[sc.KERNEL_FINAL_SYNC] == [PHASES[2]] * 2
        assert attrs[sc.KERNEL_CH_DURATION] == [1_000_000, 1_000_000]
    assert header["dropped_bad_handle"] == 0 and header["dropped_bad_descr"] == 0
    assert set(header["bad_handle_by_kind"]) == set(native._native.BAD_HANDLE_KINDS)


def test_v7_default_mask_leaves_phases_to_the_knob(plugin_so, ring_dir):
    """No ncclGetVersion in this process (unknown release): KernelCh yes, KernelPhase no; the tag still comes."""
    header, recs = _run(plugin_so, ring_dir, 7, None)
    assert not header["activation_mask"] & int(native.EventType.KernelPhase)
    assert header["activation_mask"] & int(native.EventType.KernelCh)
    attrs = dict(kernel_attributes(recs[0]["op"], recs[0]["kch"]))
    assert attrs[sc.COLL_USER_TAG] == TAG and sc.KERNEL_INITIAL_SYNC not in attrs
    assert sc.KERNEL_CH_CHANNEL not in attrs  # channel times without phases are not exported
    assert int(recs[0]["op"]["kch_valid"]) == 0b11  # but kept in the record


@pytest.mark.parametrize("version", [4, 5, 6])
def test_older_abis_get_neither_and_lose_nothing(plugin_so, ring_dir, version):
    header, recs = _run(plugin_so, ring_dir, version, "phase")
    assert header["abi_version"] == version
    assert not header["activation_mask"] & int(native.EventType.KernelPhase)
    assert len(recs) == 3 and header["ops_completed"] == 3
    for rec in recs:
        op = rec["op"]
        assert int(op["user_tag"]) == 0 and not int(op["flags"]) & native._native.OP_FLAGS["KERNEL_PHASES"]
        assert int(op["kernel_ch_stopped"]) == 2 and int(op["proxy_ops_stopped"]) == 4
        attrs = dict(kernel_attributes(op, rec["kch"]))
        assert attrs == {}  # nothing new on a v4..v6 span
        assert rec["kch"][0]["end_ns"] > rec["kch"][0]["start_ns"]  # KernelCh times kept in the record
    assert header["dropped_bad_handle"] == 0 and header["dropped_bad_descr"] == 0


@pytest.mark.parametrize("version", [7, 5])
def test_the_simulated_framework_tags_each_call_with_its_step(plugin_so, tmp_path, version):
    from mycroft_otel.sim import runner
    from mycroft_otel.sim.simulation import Simulation
    from mycroft_otel.sim.topology import parse_topology

    sim = Simulation(parse_topology("nodes=2,gpus=1,tp=1,dp=2"), None, [], seed=1, steps=3)
    runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin_so, abi_version=version))
    tags = []
    for path in native.ring_files(tmp_path):
        recs, _, _ = native.open_ring(path).read(0, 1 << 10, False)
        tags += [int(r["op"]["user_tag"]) for r in recs]
    assert tags
    assert set(tags) == ({1, 2, 3} if version == 7 else {0})
