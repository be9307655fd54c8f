"""NCCL/RCCL INFO log parser against real logs from public bug reports (tests/fixtures/nccl/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.comm.nccl_log import NcclLogParser, merge_snapshots, parse_text, transport_kind, worst_state

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_every_fixture_names_its_public_source():
    files = sorted(FIXTURES.glob("*.log"))
    assert len(files) >= 10
    for path in files:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# source: https://github.com/"), path.name


def test_rccl_one_line_version_plugin_and_socket_network():
    snap = parse_text(fixture("rccl_lumi_single_rank.log"))
    assert snap["version"] == {"library": "rccl", "version": "2.20.5", "hip": "6.2", "git": "HEAD:45b618a+"}
    net = snap["network"]
    assert net["name"] == "Socket"
    assert net["socket_ifs"] == ["hsn0:10.253.1.200", "hsn1:10.253.1.199", "hsn2:10.253.1.183", "hsn3:10.253.1.184"]
    assert net["plugin"]["requested"] == "librccl-net-ofi.so"
    assert net["plugin"]["loaded"] is False and net["plugin"]["missing"] == "librccl-net-ofi.so"
    assert net["env"] == {"NCCL_SOCKET_IFNAME": "hsn", "RCCL_MSCCL_ENABLE": "1"}
    assert net["bootstrap_if"] == "hsn0:10.253.1.200"
    # the log stops after "Init START": still initializing
    assert snap["ranks"][0]["state"] == "initializing" and snap["ranks"][0]["nranks"] == 1
    assert snap["state"] == "initializing"


def test_rccl_multi_line_version_banner():
    snap = parse_text(fixture("rccl_tests_issue163_mi50.log"))
    assert snap["version"] == {
        "library": "rccl",
        "version": "2.21.5",
        "git": "HEAD:9a0e6a1",
        "hip": "6.3.42134-a9a80e791",
        "rocm": "6.3.3.0-74-cbc70b5",
        "hostname": "z292",
        "librccl_path": "/opt/rocm-6.3.3/lib/librccl.so.1",
    }
    assert sorted(snap["ranks"]) == [0, 1, 2, 3]  # one process, 4 GPUs: "comm 0x... rank N nRanks 4"
    assert all(r["nranks"] == 4 for r in snap["ranks"].values())
    assert snap["network"]["plugin"]["missing"] == "librccl-net.so"
    other = parse_text(fixture("rccl_issue1454_mi100.log"))["version"]
    assert (other["version"], other["git"], other["rocm"]) == ("2.21.5", "main:a29a210+", "6.2.4.0-139")


def test_rccl_one_line_form_from_the_rccl_changelog_pr():
    # ROCm/rccl PR #212: "Now it says something like this: RCCL version 2.6.4+hip3.5"
    snap = parse_text("RCCL version 2.6.4+hip3.5\n")
    assert snap["version"] == {"library": "rccl", "version": "2.6.4", "hip": "3.5"}


@pytest.mark.parametrize(
    ("name", "version", "cuda"),
    [("nccl_issue857_socket.log", "2.10.3", "11.3"), ("nccl_issue1936_no_ib.log", "2.27.5", "12.9")],
)
def test_nccl_version_bare_and_prefixed(name, version, cuda):
    snap = parse_text(fixture(name))
    assert snap["version"] == {"library": "nccl", "version": version, "cuda": cuda}


def test_ib_devices_oob_and_no_device():
    net = parse_text(fixture("nccl_issue983_ib.log"))["network"]
    assert net["name"] == "IB"
    assert net["ib_devices"] == ["mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/IB", "mlx5_3:1/IB"]
    assert net["oob_if"] == "eth0:10.0.1.9"
    net = parse_text(fixture("nccl_issue1936_no_ib.log"))["network"]
    assert net["ib_devices"] == [] and net["socket_ifs"] == ["eth0:192.168.69.159"]
    assert net["plugin"]["missing"] == "libnccl-net.so"


def test_warn_lines_are_warnings_not_errors():
    snap = parse_text(fixture("nccl_issue857_socket.log"))
    assert len(snap["warnings"]) == 3 and "libibverbs" in snap["warnings"][0]
    assert snap["errors"] == [] and snap["state"] != "error"


def test_rccl_p2p_ipc_and_socket_transports_between_rank_pairs():
    snap = parse_text(fixture("rccl_issue1026_mi250x_p2p.log"))
    links = {(l["src"], l["dst"]): l for l in snap["links"]}
    assert links[(7, 5)]["transport"] == "P2P/IPC" and links[(7, 5)]["channels"] == [0, 2]
    assert links[(7, 5)]["comm"] == "0xfb16e30"
    assert links[(1, 4)]["kind"] == "net" and links[(1, 4)]["net"] == "Socket"
    assert snap["ranks"][2]["peers"] == {0: ["P2P/IPC"], 3: ["P2P/IPC"]}
    assert snap["ranks"][4]["peers"] == {1: ["NET/Socket/1"]}  # [receive] side logged by rank 4
    assert snap["channels"]["rings_connected"] is True


def test_gdrdma_ring_lines_of_older_nccl():
    snap = parse_text(fixture("nccl_issue385_ring_gdrdma.log"))
    link = next(l for l in snap["links"] if (l["src"], l["dst"]) == (1, 8))
    assert link["gdrdma"] is True and link["net"] == "IB" and link["direction"] == "send"
    assert snap["ranks"][12]["peers"] == {11: ["P2P/IPC"], 13: ["P2P/IPC"]}
    gdr = parse_text(fixture("nccl_issue707_gdrdma.log"))
    assert {l["transport"] for l in gdr["links"]} == {f"NET/IB/{i}/GDRDMA" for i in (0, 2, 4, 5)}


def test_direct_pointer_cumem_shm_and_ibext_transports():
    snap = parse_text(fixture("nccl_issue1412_ib_init_complete.log"))
    assert snap["ranks"][6]["peers"][7] == ["P2P/direct pointer/read"]
    assert {l["kind"] for l in snap["links"]} == {"p2p", "net"}
    shm = parse_text(fixture("nccl_tests_issue166_shm_error.log"))
    assert {l["transport"] for l in shm["links"]} == {"SHM/direct/direct"}
    assert next(l for l in shm["links"] if l["src"] == 7)["channels"] == [18, 19, 20, 21]
    ibext = parse_text(fixture("nccl_issue1814_ibext_complete.log"))
    assert ibext["ranks"][35]["peers"][51] == ["NET/IBext_v8/5"]
    assert ibext["ranks"][34]["peers"][35] == ["P2P/CUMEM"]
    assert ibext["channels"] == {"rings_connected": True, "trees_connected": True, "coll": 16, "p2p": 16}


def test_init_complete_per_rank():
    snap = parse_text(fixture("nccl_issue1412_ib_init_complete.log"))
    states = {r: v["state"] for r, v in snap["ranks"].items()}
    assert states[0] == states[1] == states[4] == states[5] == states[6] == "complete"
    assert states[7] == "initializing"  # its Init COMPLETE is not in the excerpt
    assert snap["ranks"][0]["nranks"] == 16
    assert snap["state"] == "initializing"  # the worst rank decides


def test_channel_count_from_ring_order_line():
    assert parse_text(fixture("easydistill_issue4_rings.log"))["channels"] == {"count": 24}


def test_error_trace_sets_error_state():
    snap = parse_text(fixture("nccl_tests_issue166_shm_error.log"))
    assert snap["state"] == "error"
    assert any("shm.cc:114 -> 2" in e for e in snap["errors"])
    assert any("Test NCCL failure" in e for e in snap["errors"])
    per_rank = parse_text(fixture("nccl_tests_issue166_shm_error.log"), rank=5)
    assert per_rank["ranks"][5]["state"] == "error"


def test_pytorch_watchdog_timeouts_new_and_old_format():
    snap = parse_text(fixture("pytorch_watchdog_llamafactory7396.log"))
    assert snap["timeouts"][0] == {
        "rank": 0, "seq": 1580, "op": "ALLREDUCE", "timeout_ms": 600000, "ran_ms": 600060,
        "numel_in": 466119168, "numel_out": 466119168,
    }
    assert snap["ranks"][0]["state"] == "timeout" and snap["ranks"][4]["state"] == "timeout"
    assert snap["ranks"][0]["last_completed_work"] == 1579
    assert snap["ranks"][3]["state"] == "error"  # only the watchdog exception line survived for rank 3
    old = parse_text(fixture("pytorch_watchdog_ofa271_old_format.log"))
    assert [t["rank"] for t in old["timeouts"]] == [1, 3, 2]
    assert old["timeouts"][0]["timeout_ms"] == 1800000 and old["timeouts"][0]["numel_in"] is None
    assert old["state"] == "timeout"


def test_per_rank_parser_attributes_every_line_to_its_rank():
    text = fixture("rccl_issue1026_mi250x_p2p.log")
    snap = parse_text(text, rank=3)
    assert list(snap["ranks"]) == [3]
    assert snap["ranks"][3]["peers"][6] == ["NET/Socket/2"]


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_incremental_feeding_in_any_chunks_equals_whole_text(chunk):
    text = "".join(fixture(n) for n in ("rccl_tests_issue163_mi50.log", "rccl_issue1026_mi250x_p2p.log",
                                        "pytorch_watchdog_llamafactory7396.log"))
    whole = parse_text(text)
    data = text.encode("utf-8")
    parser = NcclLogParser()
    for i in range(0, len(data), chunk):  # also splits multi-byte characters
        parser.feed(data[i : i + chunk])
    assert parser.snapshot() == whole


def test_partial_line_waits_for_its_newline_or_flush():
    parser = NcclLogParser(rank=0)
    assert parser.feed("host:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMP") == 0
    assert parser.snapshot()["state"] == "unknown"
    parser.feed("LETE\n")
    assert parser.snapshot()["ranks"][0]["state"] == "complete"
    parser.feed("[E ProcessGroupNCCL.cpp:737] [Rank 0] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=1000) ran for 1001 milliseconds before timing out.")
    assert parser.snapshot()["ranks"][0]["state"] == "complete"
    parser.flush()
    assert parser.snapshot()["ranks"][0]["state"] == "timeout"


def test_progress_bar_carriage_returns_do_not_hide_lines():
    text = " 1%|          | 24/1752 [01:08<1:22:56,  2.88s/it]\r" + fixture("pytorch_watchdog_ofa271_old_format.log")
    assert parse_text(text)["state"] == "timeout"


def test_nothing_nccl_is_unknown():
    assert parse_text("Epoch 1 loss 2.3\nTraceback? no\n")["state"] == "unknown"


def test_merge_snapshots_gives_comm_event_fields():
    per_rank = [parse_text(fixture("rccl_tests_issue163_mi50.log"))]
    per_rank.append(parse_text(fixture("pytorch_watchdog_ofa271_old_format.log")))
    merged = merge_snapshots(per_rank)
    assert merged["backend"] == "rccl" and merged["version"] == "2.21.5" and merged["world_size"] == 4
    assert merged["status"] == "timeout"
    assert merged["details"]["network"]["name"] == "Socket"
    assert merged["details"]["ranks"][1]["state"] == "timeout"


def test_helpers():
    assert transport_kind("P2P/IPC/read") == "p2p" and transport_kind("NET/IB/0/GDRDMA") == "net"
    assert transport_kind("SHM/direct/direct") == "shm"
    assert worst_state(["complete", "initializing"]) == "initializing"
    assert worst_state(["timeout", "error", "complete"]) == "error"
    assert worst_state([]) == "unknown"
