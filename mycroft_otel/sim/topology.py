"""Topology of a simulated job: nodes x GPUs, and the communicators a parallelism spec builds.

Global rank g = node * gpus + local GPU. The parallelism layout is Megatron's default
order (tensor fastest, then data, then pipeline): g = tp_i + tp * (dp_i + dp * pp_i).
TP groups stay inside a node (NCCL reaches them over NVLink/P2P: no network ProxyOps);
DP groups span nodes (rings over the network, one NIC per GPU); PP groups link the
stages of one (tp_i, dp_i) position with point-to-point send/recv.

Ring orders: NCCL orders a ring by node, then by the GPUs of each node, and gives
channels different orders; here even channels run the natural order and odd channels
the reverse, so every rank's (prev, next) differs between the two but is consistent
across ranks (``next[prev[r]] == r`` on every channel).
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field

import numpy as np


class TopologyError(ValueError):
    """A --topology spec that does not describe a valid job."""


@dataclass(frozen=True)
class Topology:
    nodes: int = 8
    gpus: int = 8
    tp: int = 8
    pp: int = 1
    dp: int = 8

    def __post_init__(self) -> None:
        for k in ("nodes", "gpus", "tp", "pp", "dp"):
            if getattr(self, k) < 1:
                raise TopologyError(f"{k} must be >= 1")
        if self.tp * self.pp * self.dp != self.world:
            raise TopologyError(f"tp*pp*dp = {self.tp * self.pp * self.dp} must equal nodes*gpus = {self.world}")
        if self.gpus % self.tp:
            raise TopologyError(f"tp={self.tp} must divide gpus={self.gpus} (TP stays inside a node)")

    @property
    def world(self) -> int:
        return self.nodes * self.gpus

    def host_of(self, g: int | np.ndarray) -> int | np.ndarray:
        return g // self.gpus

    def host_name(self, node: int) -> str:
        return f"sim-node{node:03d}"

    def coords(self, g: int) -> tuple[int, int, int]:
        """(tp_i, dp_i, pp_i) of global rank g."""
        return g % self.tp, (g // self.tp) % self.dp, g // (self.tp * self.dp)

    def spec(self) -> str:
        return f"nodes={self.nodes},gpus={self.gpus},tp={self.tp},pp={self.pp},dp={self.dp}"


def parse_topology(spec: str) -> Topology:
    """``nodes=8,gpus=8,tp=8,pp=2,dp=4``; missing parallel degrees are inferred (dp fills the rest)."""
    values: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = re.fullmatch(r"(nodes|gpus|tp|pp|dp)=(\d+)", part)
        if not m:
            raise TopologyError(f"bad topology item {part!r} (expected nodes=,gpus=,tp=,pp=,dp= with integers)")
        values[m.group(1)] = int(m.group(2))
    nodes, gpus = values.get("nodes", 8), values.get("gpus", 8)
    tp = values.get("tp", min(gpus, 8))
    pp = values.get("pp", 1)
    if "dp" not in values:
        if (nodes * gpus) % (tp * pp):
            raise TopologyError("tp*pp must divide nodes*gpus")
        values["dp"] = nodes * gpus // (tp * pp)
    return Topology(nodes=nodes, gpus=gpus, tp=tp, pp=pp, dp=values["dp"])


def _comm_hash(seed: int, kind: str, index: int) -> int:
    h = hashlib.blake2b(struct.pack("<q", seed) + kind.encode() + struct.pack("<q", index), digest_size=8)
    return (int.from_bytes(h.digest(), "little") & (2**63 - 1)) or 1


@dataclass
class Comm:
    """One communicator: ``ranks[i]`` is the global rank of comm rank i."""

    kind: str            # "tp" | "dp" | "pp"
    index: int           # which communicator of that kind
    ranks: np.ndarray    # global ranks, comm-rank order
    comm_hash: int
    n_channels: int
    hosts: np.ndarray = field(init=False)
    n_nodes: int = field(init=False)

    def __post_init__(self) -> None:
        self.ranks = np.asarray(self.ranks, dtype=np.int64)
        self.hosts = np.zeros(0, dtype=np.int64)
        self.n_nodes = 0

    @property
    def name(self) -> str:
        return f"{self.kind}{self.index}"

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    def comm_rank(self, g: int) -> int:
        hit = np.nonzero(self.ranks == g)[0]
        return int(hit[0]) if len(hit) else -1

    def ring_orders(self) -> np.ndarray:
        """(n_channels, nranks): comm ranks in ring order per channel (even: by node then GPU; odd: reversed)."""
        natural = np.lexsort((self.ranks, self.hosts))
        orders = np.empty((self.n_channels, self.nranks), dtype=np.int64)
        for c in range(self.n_channels):
            orders[c] = natural if c % 2 == 0 else natural[::-1]
        return orders

    def ring_neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """(prev, next): (n_channels, nranks) arrays indexed by comm rank."""
        orders = self.ring_orders()
        nxt = np.empty_like(orders)
        prv = np.empty_like(orders)
        for c in range(self.n_channels):
            o = orders[c]
            nxt[c, o] = np.roll(o, -1)
            prv[c, o] = np.roll(o, 1)
        return prv, nxt

    def tree(self, channel: int) -> tuple[np.ndarray, list[list[int]]]:
        """NCCL's double binary tree over the comm's ranks for a channel: (parent per comm rank, children).

        Tree 0 (even channels) is a heap-numbered binary tree over the ring order (root first); tree 1 (odd
        channels) mirrors it (the rank at position i takes position n-1-i), so the leaves of one tree are
        interior nodes of the other, as in NCCL's double binary tree.
        """
        n = self.nranks
        order = np.lexsort((self.ranks, self.hosts))
        if channel % 2:
            order = order[::-1]
        parent = np.full(n, -1, dtype=np.int64)
        children: list[list[int]] = [[] for _ in range(n)]
        for pos in range(n):
            p = _btree_parent(pos, n)
            if p >= 0:
                parent[order[pos]] = order[p]
                children[order[p]].append(int(order[pos]))
        return parent, children


def _btree_parent(pos: int, n: int) -> int:
    """Parent position in a binary tree over positions 0..n-1 (root 0, heap numbering), -1 for the root."""
    return (pos - 1) // 2 if pos > 0 else -1


def build_comms(topo: Topology, seed: int = 0, dp_channels: int = 2, pp_channels: int = 1,
                tp_channels: int = 2) -> dict[str, list[Comm]]:
    """Every communicator of the job, by kind; kinds with degree 1 have none."""
    g = np.arange(topo.world)
    tp_i = g % topo.tp
    dp_i = (g // topo.tp) % topo.dp
    pp_i = g // (topo.tp * topo.dp)
    comms: dict[str, list[Comm]] = {"tp": [], "dp": [], "pp": []}
    if topo.tp > 1:
        for k in range(topo.dp * topo.pp):
            comms["tp"].append(Comm("tp", k, g[g // topo.tp == k], _comm_hash(seed, "tp", k), tp_channels))
    if topo.dp > 1:
        k = 0
        for p in range(topo.pp):
            for t in range(topo.tp):
                comms["dp"].append(Comm("dp", k, g[(pp_i == p) & (tp_i == t)], _comm_hash(seed, "dp", k),
                                        dp_channels))
                k += 1
    if topo.pp > 1:
        k = 0
        for d in range(topo.dp):
            for t in range(topo.tp):
                comms["pp"].append(Comm("pp", k, g[(dp_i == d) & (tp_i == t)], _comm_hash(seed, "pp", k),
                                        pp_channels))
                k += 1
    for lst in comms.values():
        for c in lst:
            c.hosts = topo.host_of(c.ranks)
            c.n_nodes = len(np.unique(c.hosts))
    return comms
