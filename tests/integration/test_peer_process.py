"""The Hugging Face peers in a child process (``BenchConfig.peer_process``): same outputs as in
the bench's own process, clean shutdown, clear errors, and resume refusing to mix the two."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal

import pytest

from specgraft.bench import BenchConfig, run_benchmark
from specgraft.bench.peer_process import PeerProcess, PeerProcessError, PeerSpec
from specgraft.bench.records import RESULTS_FILE, read_rows

from tests.helpers.bench import MAX_NEW, check_rows_consistent, config


def spec(model: str, peers=("hf",), **kw) -> PeerSpec:
    base = dict(model=model, dtype="float32", device="cpu", threads=1, draft_model=None, draft_quant="none", peers=peers,
                max_new_tokens=MAX_NEW, temperature=0.0, seed=0)
    return PeerSpec(**(base | kw))


def test_separate_peers_equal_shared_peers(target_dir, draft_dir, tmp_path):
    kw = dict(suite="humaneval:2", methods="ar,draft-tree,hf-pld,hf-assisted", draft_model=draft_dir, draft_quant="none")
    run_benchmark(config(target_dir, tmp_path / "separate", **kw))
    assert multiprocessing.active_children() == [], "the peers' process is closed when the run ends"
    run_benchmark(config(target_dir, tmp_path / "shared", peer_process="shared", **kw))
    separate, shared = read_rows(tmp_path / "separate" / RESULTS_FILE), read_rows(tmp_path / "shared" / RESULTS_FILE)
    check_rows_consistent(separate)
    assert [(r.key, r.tokens) for r in separate] == [(r.key, r.tokens) for r in shared]
    assert {r.method for r in separate if r.peer} == {"hf", "hf-pld", "hf-assisted"}
    for r in separate:
        if r.peer:
            assert r.config["method_config"]["peer_process"] == "separate" and r.config["peer_process"] == "separate"
            assert r.agreement["exact"], "greedy HF generate equals our ar on the tiny model"
    assisted = [r for r in separate if r.method == "hf-assisted"]
    assert assisted and all(r.config["method_config"]["assistant_model"] == draft_dir for r in assisted)
    info = json.loads((tmp_path / "separate" / "run.json").read_text())
    assert info["config"]["resolved_peer_process"] == "separate" and "--peer-process" not in info["command"]
    shared_info = json.loads((tmp_path / "shared" / "run.json").read_text())
    assert shared_info["config"]["resolved_peer_process"] == "shared" and "--peer-process shared" in shared_info["command"]

    # resume refuses to add rows measured beside in-process peers to a run whose peers ran apart
    with pytest.raises(ValueError, match="resolved_peer_process: 'separate' before, 'shared' now"):
        run_benchmark(config(target_dir, tmp_path / "separate", resume=True, peer_process="shared", **kw))
    # a run.json from before the option: its peers ran in the bench's process
    run_file = tmp_path / "shared" / "run.json"
    del shared_info["config"]["resolved_peer_process"]
    run_file.write_text(json.dumps(shared_info))
    with pytest.raises(ValueError, match="resolved_peer_process: 'shared' before, 'separate' now"):
        run_benchmark(config(target_dir, tmp_path / "shared", resume=True, **kw))
    # a session without peers may resume either
    run_benchmark(config(target_dir, tmp_path / "shared", resume=True, **(kw | dict(suite="humaneval:3", methods="ar,draft-tree"))))
    assert json.loads(run_file.read_text())["config"]["resolved_peer_process"] is None, "nothing recorded before, none now"


def test_peer_process_runs_and_closes(target_dir):
    with PeerProcess(spec(target_dir, peers=("hf", "hf-pld"))) as process:
        peers = process.peers()
        assert set(peers) == {"hf", "hf-pld"}
        eos, configs = process.wait_ready()
        assert eos == [2] and configs["hf"]["generate_kwargs"]["max_new_tokens"] == MAX_NEW
        run = peers["hf"].run([1, 40, 41, 42], max_new_tokens=3)
        assert len(run.tokens) <= 3 and run.time_s > 0 and run.stats is None
        assert run.config["peer_process"] == "separate"
        pid = process.pid
    assert process.pid is None and multiprocessing.active_children() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_peer_process_errors(target_dir, tmp_path):
    with PeerProcess(spec(str(tmp_path / "no-such-model"))) as process:
        with pytest.raises(PeerProcessError, match="(?s)peers' process failed:.*no-such-model"):
            process.peers()
    # a child that dies (here: killed, as the kernel does when memory runs out) is an error, not a hang
    with PeerProcess(spec(target_dir)) as process:
        process.wait_ready()
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(PeerProcessError, match=r"exited with code -9 .*--peer-process shared"):
            process.run("hf", [1, 40, 41], max_new_tokens=2)


def test_config():
    with pytest.raises(ValueError, match="peer_process must be one of separate, shared"):
        BenchConfig(model="m", out="o", peer_process="elsewhere")
    assert BenchConfig(model="m", out="o", methods="pld").resolved_peer_process is None, "no peer, nothing to place"
    cfg = BenchConfig(model="m", out="o", methods="pld,hf-pld", peer_process="shared")
    assert cfg.hf_peers == ("hf", "hf-pld") and cfg.resolved_peer_process == "shared"
    assert "--peer-process shared" in cfg.to_command()
