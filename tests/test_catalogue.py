"""The variant catalogue (rope_kernels/catalogue.py) is the one list of variants: a new peer
is its module plus one catalogue entry, and the registry, the parameter checks, the plots,
the findings and the targets' like-for-like pairing take it up with no other edit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rope_kernels import catalogue
from rope_kernels.catalogue import Entry

ROOT = Path(__file__).resolve().parents[1]


def test_entries_refuse_what_the_readers_could_not_use():
    with pytest.raises(ValueError, match="group"):
        Entry("x", "x", "mine", "#123456")
    with pytest.raises(ValueError, match="colour"):
        Entry("x", "x", "engine", "red")
    with pytest.raises(ValueError, match="unknown kinds"):
        Entry("x", "x", "engine", "#123456", ("gemm",))
    with pytest.raises(ValueError, match="contender"):  # judged like for like: a peer RoPE kernel
        Entry("x", "x", "engine", "#123456", ("qkv",), peer=True, contender=True)
    with pytest.raises(ValueError, match="module"):
        Entry("x", "x", "engine", "#123456", ("encoder",), module="some.peer")
    with pytest.raises(ValueError, match="registered already"):
        catalogue.register(Entry("fused", "again", "ours", "#123456"))
    with pytest.raises(TypeError, match="Entry"):
        catalogue.register({"name": "x"})
    with pytest.raises(TypeError, match="unknown flags"):
        catalogue.names("rope", in_place=True)


def test_order_and_labels():
    assert catalogue.ordered(["native", "someone_elses", "vllm_packed_qk", "fused", "native"]) == \
        ["fused", "vllm_packed_qk", "native", "someone_elses"]  # ours, engines, baselines, unknown
    assert catalogue.label("fused_inplace") == "fused in place (ours)"
    assert catalogue.label("someone_elses") == "`someone_elses`"


def test_the_registry_agrees_with_the_catalogue():
    """Every variant that runs here is catalogued as what it is: in place or not (the
    registry refuses to build otherwise), and a peer exactly when its rows name a package."""
    from rope_kernels.variants import registry

    reg = registry()
    assert reg, "no variant runs here"
    assert {n for n, v in reg.items() if v.peer_package} == {n for n in reg if catalogue.CATALOGUE[n].peer}
    assert {n for n, v in reg.items() if v.inplace} == {n for n in reg if catalogue.CATALOGUE[n].inplace}


_PEER_MODULE = '''
"""A stand-in peer for tests/test_catalogue.py: Kimi's native path, written into q and k."""
from rope_kernels.kernels.reference import native_rope


def _rope(xq, xk, freqs_cis):
    q, k = native_rope(xq, xk, freqs_cis)
    xq.copy_(q)
    xk.copy_(k)
    return xq, xk


def rope_variant(name):
    return {"package": "dummy-rope", "available": lambda: (True, ""),
            "source": lambda: ("0.0.1", "ab" * 32, "installed"),
            "fn": _rope, "launches": 7, "launches_fp32": 3}
'''

_PROBE = '''
import json, sys
sys.path.insert(0, {tmp!r})
from rope_kernels import catalogue
if {register}:
    catalogue.register(catalogue.Entry(
        "dummy_rope", "Dummy RoPE", "engine", "#123456", ("rope",), inplace=True, peer=True,
        contender=True, module="dummy_rope_peer", description="a stand-in peer"))

import pandas as pd
import torch
from rope_kernels import vocabulary, variants
from rope_kernels.kernels.freqs import vision_freqs_cis
from rope_kernels.kernels.reference import native_rope
from rope_kernels.study import findings, plots, specs, targets

out = {{
    "known": "dummy_rope" in vocabulary.KNOWN_VARIANTS,
    "peer": "dummy_rope" in vocabulary.PEER_VARIANTS,
    "in_place": "dummy_rope" in vocabulary.IN_PLACE_VARIANTS,
    "param_problem": specs.SPECS["02_microbench"].parameters["variants"].rule(["dummy_rope"], "cpu"),
    "in_registry": "dummy_rope" in variants.registry(),
    "colour": plots.variant_color("dummy_rope"),
    "label": findings.label("dummy_rope"),
    "target": "kimi_1.05x_dummy_rope" in {{t.id for t in targets.TARGETS}},
}}
if out["in_registry"]:
    v = variants.get_variant("dummy_rope")
    torch.manual_seed(0)
    fc = vision_freqs_cis([(1, 2, 3)], 8)
    q, k = torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    want_q, want_k = native_rope(q, k, fc)
    got_q, got_k = v(q, k, fc)
    out.update(rotated=bool(torch.equal(got_q, want_q) and torch.equal(got_k, want_k)),
               wrote_inputs=got_q is q and got_k is k, launches=v.launch_count(torch.bfloat16),
               package=v.peer_package, version=v.peer_version)
# the targets and the findings' peer table on rows with no in_place column: the pairing
# comes from the catalogue (in place -> fused_inplace, 1.5x; fused would give 3x)
rows = pd.DataFrame([{{"variant": name, "tokens": t, "heads": h, "head_dim": d, "dtype": "bfloat16",
                       "mode": "cudagraph", "median_us": us, "p20_us": us, "p80_us": us,
                       "copy_gbps": 4000.0, "bytes": 1e6}}
                     for name, us in (("fused", 10.0), ("fused_inplace", 20.0), ("dummy_rope", 30.0))
                     for t, h, d in targets.KIMI_SHAPES])
mine = [t for t in targets.TARGETS if t.id == "kimi_1.05x_dummy_rope"]
verdicts = targets.evaluate({{"microbench": rows}}, mine) if mine else pd.DataFrame()
out["paired_with"] = sorted(set(verdicts["ours"])) if len(verdicts) else []
out["values"] = sorted(set(round(x, 6) for x in verdicts["value"])) if len(verdicts) else []
out["verdicts"] = sorted(set(verdicts["verdict"])) if len(verdicts) else []
table, peers = findings.peer_ratio_table(rows, "cudagraph")
out["findings_peers"] = peers
out["findings_table"] = table
print(json.dumps(out))
'''


def _probe(tmp_path: Path, register: bool) -> dict:
    (tmp_path / "dummy_rope_peer.py").write_text(textwrap.dedent(_PEER_MODULE))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", _PROBE.format(tmp=str(tmp_path), register=register)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_peer_is_built_by_the_module_its_entry_names():
    """No peer is hand-built in variants.py: each peer RoPE entry names its module, whose
    ``rope_variant`` builds that name and refuses any other."""
    import importlib

    rope_peers = catalogue.names("rope", peer=True)
    assert {"vllm_packed_qk", "flashinfer", "liger", "compiled", "transformer_engine"} <= set(rope_peers)
    unbuilt = [n for n in rope_peers if not catalogue.CATALOGUE[n].module]
    assert not unbuilt, f"peers without a module: {unbuilt}"
    for module in {catalogue.CATALOGUE[n].module for n in rope_peers}:
        with pytest.raises(ValueError, match="not 'fused'"):
            importlib.import_module(module).rope_variant("fused")


def test_a_peer_that_cannot_load_or_run_is_absent_with_why(monkeypatch):
    """What the registry makes of a module's answer: an exception, a peer that is not
    available (with the version an absent row names), and one that runs but gives no
    source (a clear error, not a half-built row)."""
    import types

    from rope_kernels import variants

    def spec(name):
        if name == "peer_raises":
            raise FileNotFoundError("pinned file missing")
        if name == "peer_absent":
            return {"package": "absent-pkg", "available": lambda: (False, "no device"),
                    "absent_version": "1.2.3"}
        return {"package": "sourceless", "available": lambda: (True, "")}

    monkeypatch.setitem(sys.modules, "fake_peers", types.SimpleNamespace(rope_variant=spec))
    entries = {n: Entry(n, n, "engine", "#123456", peer=True, module="fake_peers")
               for n in ("peer_raises", "peer_absent")}
    monkeypatch.setattr(catalogue, "CATALOGUE", entries)
    status = []
    assert variants._catalogued_peers(status) == []
    assert [(s.name, s.available, s.reason, s.package, s.version) for s in status] == [
        ("peer_raises", False, "FileNotFoundError: pinned file missing", "", ""),
        ("peer_absent", False, "no device", "absent-pkg", "1.2.3")]
    monkeypatch.setattr(catalogue, "CATALOGUE", {"peer_sourceless": Entry(
        "peer_sourceless", "x", "engine", "#123456", peer=True, module="fake_peers")})
    with pytest.raises(TypeError, match="no 'source'"):
        variants._catalogued_peers([])


def test_a_new_peer_is_its_module_and_one_catalogue_entry(tmp_path):
    """Registered in a fresh interpreter before the package reads the catalogue (as an
    entry in catalogue.py is): the peer is known, accepted as a parameter, built by the
    registry from its module, coloured, labelled, and judged like for like (in place:
    against fused_inplace) by a target of its own and the findings' peer table."""
    got = _probe(tmp_path, register=True)
    assert got["known"] and got["peer"] and got["in_place"]
    assert got["param_problem"] is None
    assert got["in_registry"] and got["rotated"] and got["wrote_inputs"]
    assert (got["launches"], got["package"], got["version"]) == (7, "dummy-rope", "0.0.1")
    assert got["colour"] == "#123456" and got["label"] == "Dummy RoPE"
    assert got["target"] and got["paired_with"] == ["fused_inplace"]
    assert got["values"] == [1.5] and got["verdicts"] == ["met"]
    assert "dummy_rope" in got["findings_peers"]
    assert "Dummy RoPE / `fused_inplace`" in got["findings_table"] and "1.50x" in got["findings_table"]


def test_without_the_entry_nothing_knows_the_peer(tmp_path):
    """The same probe with the module present but no catalogue entry: nothing picks it up
    (the entry above is what does it)."""
    got = _probe(tmp_path, register=False)
    assert not (got["known"] or got["peer"] or got["in_place"] or got["in_registry"] or got["target"])
    assert got["param_problem"] and "dummy_rope" in got["param_problem"]
    assert got["label"] == "`dummy_rope`" and got["colour"] != "#123456"
    assert got["paired_with"] == []
    # the findings still show what the rows hold, by name, but cannot pair it
    assert "`dummy_rope` / `?`" in got["findings_table"] and "1.50x" not in got["findings_table"]
