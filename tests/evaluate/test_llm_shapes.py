"""Faults in jobs shaped like LLM training (TP inside a node, DP rings across nodes, PP stages), on virtual
time through the real plugin, agent and processor: each mechanism that made a fault in one communicator go
unnamed, or named as its consequence in another, has one case here (seeds and factors of `--corpus llm`'s
development runs, docs/algorithm.md §9)."""

from __future__ import annotations

import pytest

from mycroft_otel.evaluate import corpus
from mycroft_otel.evaluate.scenarios import Scenario

# (name, fault spec, corpus shape, seed): what each case checks
CASES = [
    # DP rings of two ranks (2 nodes x 8 GPUs): too few healthy collectives of its own precede a fault at 4 s,
    # so the ring's kernel times are compared with its 7 siblings'; and a pair's median is its midpoint, so
    # each rank is scored against its healthy level, not against the other
    ("dp-pair-nic-x1.5", "slow_nic:at=4,factor=1.83401", "tp8dp2", 1010),
    # a DP tree of 4 across nodes: the same sibling comparison
    ("dp-tree-flow-x1.5", "slow_flow:at=4,factor=1.68179", "tp4dp4tree", 1000),
    # TP x PP x DP: a slow proxy in a DP pair holds both of its ranks in the DP all-reduce, and each enters
    # its TP group's next collective late; that lateness is the proxy's consequence, not a late rank
    ("dp-proxy-x1.5", "slow_proxy:at=4,sleep_ms=1.91623,p=1", "tp4pp2dp2", 1040),
    ("dp-proxy-x3", "slow_proxy:at=4,sleep_ms=6.93491,p=1", "tp4pp2dp2", 1041),
    # TP x PP x DP: in a DP pair each rank hears from the other alone, so congestion into one reads exactly as
    # the other's NIC sending slowly; the PP transfers into the congested rank from its other stage slow too,
    # the sender's own PP transfers do not: that names the receiver's NIC, and leaves a slow sender named
    ("dp-pair-congestion-x2", "congestion:at=4,factor=2.44369", "tp4pp2dp2", 1001),
    ("dp-pair-congestion-x3", "congestion:at=4,factor=3.68793", "tp4pp2dp2", 2002),
    ("dp-pair-send-nic-x2", "slow_nic:at=4,factor=2.4703", "tp4pp2dp2", 2011),
]


@pytest.mark.parametrize("name,fault,shape,seed", CASES, ids=[c[0] for c in CASES])
def test_a_fault_in_one_communicator_is_named_right_and_alone(plugin, name, fault, shape, seed):
    sc = Scenario(name, fault, topology=corpus.TOPOLOGIES[shape].spec, seed=seed,
                  duration_s=corpus.SLOW_DURATION_S)
    row = corpus.run_case(corpus.Case(sc, fault.split(":")[0], shape, "nccl", None), 3000, plugin=plugin)
    assert row["named_right"], (row["top"], row["category"], row["culprit"])
    assert row["false_verdicts"] == 0, row["top"]


@pytest.mark.parametrize("shape,seed,factor,tie", [("tp8dp2", 1012, 3.74834, True),
                                                   ("tp4pp2dp2", 2011, 2.4703, False)], ids=["dp-pair", "with-pp"])
def test_a_slow_sending_nic_says_when_its_receiver_would_read_the_same(plugin, shape, seed, factor, tie):
    """In a DP pair whose ranks have no other network traffic (TP on NVLink), a sending NIC and its receiver's
    NIC taking data in slowly move the same flows: the verdict names the sender, and says that the receiver
    is as likely (runner-up, margin 0). With pipeline transfers beside the pair, those tell the ends apart."""
    fault = f"slow_nic:at=4,factor={factor}"
    sc = Scenario("nic-tie", fault, topology=corpus.TOPOLOGIES[shape].spec, seed=seed,
                  duration_s=corpus.SLOW_DURATION_S)
    row = corpus.run_case(corpus.Case(sc, "slow_nic", shape, "nccl", None), 3000, plugin=plugin)
    assert row["named_right"], (row["top"], row["culprit"])
    if tie:
        assert row["runner_up"].startswith("nic_recv rank ") and row["margin"] == 0.0, row
    else:
        assert row["margin"] > 0.0, row
