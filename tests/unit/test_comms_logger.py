"""The comms logger (dsrecipes.distributed.comms_logger, comms_logger group): byte counts against the model's
parameter bytes at world 2 on gloo (DDP, FSDP2, the recipe Trainer), DeepSpeed's bandwidth formulas by hand,
nothing wrapped when off or after stop (an error included), the DeepSpeed import, bad prof_ops refused."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dsrecipes.config import validate_recipe
from dsrecipes.config.ds_import import translate
from dsrecipes.config.store import compose
from dsrecipes.distributed.comms_config import CommsLoggerConfig
from dsrecipes.distributed.comms_logger import OP_TABLE, CommsLogger
from dsrecipes.distributed.comms_stats import (
    bandwidth_gbps,
    bytes_by_link,
    convert_size,
    group_table,
    link_of,
    summarize,
    trim_mean,
)
from dsrecipes.training.extensions.recipe import build_extensions

ORIGINALS = {name: getattr(dist, name) for name in OP_TABLE if hasattr(dist, name)}


def _unwrapped() -> bool:
    return all(getattr(dist, name) is fn for name, fn in ORIGINALS.items())


# ------------------------------------------------------------------------------------ formulas, by hand


def test_bandwidth_formulas_match_hand_computation():
    size, t, n = 1_000_000, 0.002, 4  # 1 MB in 2 ms over 4 ranks: 4 Gbit/s moved at the op's own rate
    rate = size * 8 / 1e9 / t
    assert bandwidth_gbps("all_reduce", size, t, n) == pytest.approx((2 * rate, rate * 2 * 3 / 4))
    assert bandwidth_gbps("all_gather_into_tensor", size, t, n) == pytest.approx((4 * rate, 4 * rate * 3 / 4))
    assert bandwidth_gbps("reduce_scatter_tensor", size, t, n) == pytest.approx((rate, rate * 3 / 4))
    assert bandwidth_gbps("all_to_all_single", size, t, n) == pytest.approx((rate, rate * 3 / 4))
    assert bandwidth_gbps("broadcast", size, t, n) == pytest.approx((rate, rate))
    assert bandwidth_gbps("barrier", 0, t, n) == (0.0, 0.0)
    with pytest.raises(ValueError, match="no bandwidth formula"):
        bandwidth_gbps("send", size, t, n)


@pytest.mark.parametrize("size, text", [(0, "0 B"), (4, "4.0 B"), (1536, "1.5 KiB"), (5_104_612, "4.87 MiB"),
                                        (3 * 2 ** 30, "3.0 GiB")])
def test_sizes_are_printed_in_binary_units_labelled_as_such(size, text):
    """The logger divides by powers of 1024, so its labels are KiB / MiB / GiB (DeepSpeed's say KB / MB / GB for the
    same numbers): 5,104,612 bytes print as 4.87 MiB, not "4.87 MB" (which would be 4,870,000 bytes)."""
    assert convert_size(size) == text


def test_traffic_is_counted_per_process_group_and_told_intra_from_inter_node():
    """Two nodes of two ranks (ranks_per_node 2): an hpZ-style all-gather inside ranks 0,1 is intra-node, the
    world's all-gather and reduce-scatter cross nodes; comms.json's bytes_by_link adds them up per link."""
    assert (link_of((0, 1), 2), link_of((2, 3), 2), link_of((0, 1, 2, 3), 2), link_of((0, 2), 2)) == (
        "intra-node", "intra-node", "inter-node", "inter-node")
    assert link_of((0, 1, 2, 3), 4) == "intra-node"  # one node of four: nothing crosses nodes
    recorder = CommsLogger(CommsLoggerConfig(enabled=True))
    recorder.ranks_per_node = 2
    recorder._record("all_gather_into_tensor", 1000, 1e-3, 4, None, (0, 1, 2, 3))
    recorder._record("reduce_scatter_tensor", 4000, 1e-3, 4, None, (0, 1, 2, 3))
    for _ in range(3):
        recorder._record("all_gather_into_tensor", 500, 1e-3, 2, None, (0, 1))
    groups = recorder.groups()
    assert [(g.ranks, g.link, g.ops, g.bytes) for g in groups] == [((0, 1, 2, 3), "inter-node", 2, 5000),
                                                                   ((0, 1), "intra-node", 3, 1500)]
    assert bytes_by_link(groups) == {"intra-node": 1500, "inter-node": 5000}
    assert groups[0].as_dict() == {"ranks": [0, 1, 2, 3], "link": "inter-node", "ops": 2, "bytes": 5000}
    table = group_table(groups, "per group")
    assert [cell for cell in table.columns[0].cells] == ["0-3", "0,1"]
    assert list(table.columns[3].cells) == ["4.88 KiB", "1.46 KiB"]


def test_summary_rows_per_op_and_size():
    lat = [0.001 * k for k in range(1, 11)]  # 10 calls: the 10% trimmed mean drops 1 ms and 10 ms
    rows = summarize({("all_reduce", "all_reduce", 4096, 2): lat, ("all_gather", "all_gather", 64, 2): [0.5]})
    gather, reduce = rows  # sorted by name
    assert (reduce.count, reduce.total_bytes, reduce.total_latency_s) == (10, 40960, pytest.approx(sum(lat)))
    assert reduce.mean_latency_s == pytest.approx(sum(lat[1:-1]) / 8) == pytest.approx(trim_mean(lat))
    alg = sorted(2 * 4096 * 8 / 1e9 / t for t in lat)[1:-1]
    assert reduce.algbw_gbps == pytest.approx(sum(alg) / 8) and reduce.busbw_gbps == pytest.approx(sum(alg) / 16)
    assert gather.algbw_gbps == pytest.approx(2 * 64 * 8 / 1e9 / 0.5)


# ------------------------------------------------------------------------------------ wrapping on / off


def test_off_by_default_nothing_wrapped_and_stop_restores_after_an_error():
    def callbacks(overrides):
        return [type(c).__name__ for c in build_extensions(validate_recipe(compose(overrides), 1)[0]).callbacks]

    assert callbacks([]) == []  # comms_logger=none: no callback, so nothing wrapped and no hook registered
    assert callbacks(["comms_logger=enabled"]) == ["CommsLoggerCallback"]
    with pytest.raises(ZeroDivisionError), CommsLogger() as comms:
        assert dist.all_reduce is not ORIGINALS["all_reduce"] and comms.active
        raise ZeroDivisionError
    assert _unwrapped() and not comms.active
    only = CommsLogger(CommsLoggerConfig(enabled=True, prof_all=False, prof_ops=["all_reduce",
                                                                               "reduce_scatter_single"])).start()
    try:
        wrapped = {name for name, fn in ORIGINALS.items() if getattr(dist, name) is not fn}
        assert wrapped == {"all_reduce", "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"}
        with pytest.raises(RuntimeError, match="already wrapped"):
            CommsLogger().start()
    finally:
        only.stop()
    assert _unwrapped()


def test_bad_prof_ops_are_refused_before_any_work():
    cfg = compose(["comms_logger=enabled", "comms_logger.prof_all=false", "comms_logger.prof_ops=[all_reduce,allgather]"])
    with pytest.raises(ValueError, match=r"comms_logger.prof_ops=\['all_reduce', 'allgather'\].*\['allgather'\].*"
                                         r"valid: all_reduce, .*all_gather_into_tensor"):
        validate_recipe(cfg, dp_world_size=1)
    with pytest.warns(UserWarning, match="logs no op"):
        validate_recipe(compose(["comms_logger=enabled", "comms_logger.prof_all=false"]), dp_world_size=1)


def test_deepspeed_comms_logger_block_maps_onto_the_group():
    t = translate({"comms_logger": {"enabled": True, "verbose": True, "prof_all": False,
                                    "prof_ops": ["all_reduce", "all_gather_into_tensor"], "debug": True}})
    assert t.values["comms_logger"] == {"enabled": True, "verbose": True, "prof_all": False, "debug": True,
                                        "prof_ops": ["all_reduce", "all_gather_into_tensor"]}
    defaults = translate({"comms_logger": {"enabled": True}})  # the block means what it means in DeepSpeed
    assert defaults.values["comms_logger"] == {"enabled": True, "verbose": False, "prof_all": True, "debug": False,
                                               "prof_ops": []}
    refused = translate({"comms_logger": {"enabled": True, "prof_ops": ["allreduce"]}})
    with pytest.raises(ValueError, match="comms_logger.prof_ops.*allreduce"):
        refused.raise_if_refused()
