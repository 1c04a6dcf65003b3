"""The prefix-aware router's scoring without Ray: chained block digests per namespace, the
shadow index and its corrections, and the ranking with its load margin."""

from __future__ import annotations

import random

from hermes_async.cache.digest import block_hashes
from hermes_async.scale.prefix_index import ReplicaReport, ShadowIndex, rank_replicas

BS = 4


def test_block_hashes_chain_and_separate_namespaces() -> None:
    a = block_hashes("t1", list(range(10)), BS)
    assert len(a) == 2  # full blocks only
    assert block_hashes("t1", list(range(8)) + [99], BS) == a
    assert block_hashes("t1", [0, 1, 2, 3, 9, 9, 9, 9], BS)[0] == a[0]
    assert block_hashes("t1", [0, 1, 2, 3, 9, 9, 9, 9], BS)[1] != a[1]
    assert block_hashes("t2", list(range(10)), BS)[0] != a[0]  # tenants never match
    assert block_hashes("t1", [7, 0, 1, 2, 3, 4, 5, 6], BS)[1] != a[1]  # chained


def test_longest_shadowed_prefix_wins_within_the_margin() -> None:
    index = ShadowIndex()
    sys_a = block_hashes("t", list(range(32)), BS)
    index.record("r1", "t", sys_a[:6])
    index.record("r2", "t", sys_a[:2])
    choice = rank_replicas(index, "t", sys_a, {"r1": 3, "r2": 1}, margin=4)
    assert (choice.ranking, choice.reason, choice.matched_blocks) == (["r1", "r2"], "prefix", 6)
    spill = rank_replicas(index, "t", sys_a, {"r1": 9, "r2": 1}, margin=4)
    assert (spill.ranking[0], spill.reason) == ("r2", "spill")
    fresh = rank_replicas(index, "t", block_hashes("t", [5] * 32, BS), {"r1": 2, "r2": 1}, 4)
    assert (fresh.ranking, fresh.reason) == (["r2", "r1"], "load")
    other_tenant = rank_replicas(index, "u", block_hashes("u", list(range(32)), BS),
                                 {"r1": 2, "r2": 1}, 4)
    assert other_tenant.reason == "load" and other_tenant.matched_blocks == 0


def test_reports_correct_the_shadow() -> None:
    index = ShadowIndex()
    hashes = block_hashes("t", list(range(40)), BS)
    index.record("r1", "t", hashes)
    index.correct("r1", ReplicaReport(1.0, {"t": 10}, {"t": 0}))
    assert index.matched_blocks("r1", "t", hashes) == 10
    index.correct("r1", ReplicaReport(1.0, {"t": 4}, {"t": 0}))  # evicted: oldest go first
    assert index.matched_blocks("r1", "t", hashes) == 0  # the prefix's first blocks were oldest
    index.record("r1", "t", hashes)
    index.correct("r1", ReplicaReport(1.0, {"t": 10}, {"t": 1}))  # reset of the namespace
    assert index.matched_blocks("r1", "t", hashes) == 0
    index.record("r1", "t", hashes)
    index.correct("r1", ReplicaReport(2.0, {"t": 10}, {"t": 1}))  # restarted
    assert index.matched_blocks("r1", "t", hashes) == 0
    index.record("r1", "t", hashes)
    index.forget("r1")
    assert index.replicas() == []
    assert ReplicaReport.from_dict({"nope": 1}) is None


def test_sixteen_tenants_spread_and_keep_their_prefixes() -> None:
    """A simulated run: each tenant's requests stick to one replica, the tenants spread."""
    index = ShadowIndex()
    rng = random.Random(0)
    systems = {f"t{i}": [1000 * i + j for j in range(64)] for i in range(16)}
    loads = {"r1": 0, "r2": 0}
    homes: dict[str, set[str]] = {t: set() for t in systems}
    served = {"r1": 0, "r2": 0}
    for _ in range(400):
        tenant = rng.choice(sorted(systems))
        ids = systems[tenant] + [rng.randrange(50_000) for _ in range(8)]
        hashes = block_hashes(tenant, ids, BS)
        choice = rank_replicas(index, tenant, hashes, loads, margin=8)
        target = choice.ranking[0]
        index.record(target, tenant, hashes)
        homes[tenant].add(target)
        served[target] += 1
        loads[target] += 1
        if rng.random() < 0.9:  # requests finish
            done = rng.choice([r for r in loads if loads[r]])
            loads[done] -= 1
    assert all(len(h) <= 2 for h in homes.values())
    assert sum(len(h) == 1 for h in homes.values()) >= 12
    assert 0.35 <= served["r1"] / 400 <= 0.65


def test_a_report_older_than_the_routing_does_not_trim_it() -> None:
    now = [100.0]
    index = ShadowIndex(clock=lambda: now[0], skew_s=1.0)
    hashes = block_hashes("t", list(range(32)), BS)
    index.record("r1", "t", hashes)
    # taken before the replica prefilled the routed prompt: it holds nothing there yet
    index.correct("r1", ReplicaReport(1.0, {}, {}, taken_at=99.5))
    assert index.matched_blocks("r1", "t", hashes) == 8
    now[0] = 105.0
    index.correct("r1", ReplicaReport(1.0, {"t": 3}, {}, taken_at=104.0))  # newer: trims
    assert index.matched_blocks("r1", "t", hashes) == 0  # the oldest (leading) blocks went


def test_a_short_shared_head_does_not_attract_a_prompt() -> None:
    index = ShadowIndex()
    head = list(range(8))  # two blocks every prompt shares (a template's first tokens)
    index.record("r1", "t", block_hashes("t", head + [50] * 24, BS))
    other = block_hashes("t", head + [60] * 24, BS)  # 2 of its 8 blocks are cached on r1
    assert rank_replicas(index, "t", other, {"r1": 1, "r2": 1}, 4).reason == "prefix"
    choice = rank_replicas(index, "t", other, {"r1": 1, "r2": 1}, 4, min_matched_fraction=0.5)
    assert (choice.ranking[0], choice.reason) == ("r2", "load")  # the emptier one, load tied
    choice = rank_replicas(index, "t", other, {"r1": 1, "r2": 2}, 4, min_matched_fraction=0.5)
    assert (choice.ranking[0], choice.reason) == ("r1", "load")  # by load alone
