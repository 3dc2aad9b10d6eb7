"""The package's shape: what importing it does (nothing), and when the registry
and Triton's interpreter are decided. Each check runs in a fresh interpreter, so
what this test process already imported cannot hide an import-time side effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules whose presence after a plain import means something ran that should not have.
HEAVY = ("torch", "triton", "liger_kernel", "nbformat", "papermill", "pandas", "matplotlib")


def _fresh(code: str, *, env_drop: tuple[str, ...] = ("TRITON_INTERPRET",)) -> dict:
    """Run ``code`` in a new interpreter (repository on the path, ``env_drop``
    unset); it prints one JSON object, returned here."""
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_LOADED = """
import json, os, sys
def report(**extra):
    mods = sorted({m.split('.')[0] for m in sys.modules})
    peers = sorted(m for m in sys.modules if m.startswith('rope_kernels._peer'))
    print(json.dumps({"top": mods, "peers": peers,
                      "interpret": os.environ.get("TRITON_INTERPRET"), **extra}))
"""


def test_import_has_no_side_effects():
    """``import rope_kernels`` loads no torch, Triton, Liger or peer file and sets
    no TRITON_INTERPRET (it used to do all of these: about 5 s per CLI command)."""
    got = _fresh(_LOADED + "import rope_kernels\nrope_kernels.__version__\nreport()")
    assert not set(HEAVY) & set(got["top"]), got["top"]
    assert got["peers"] == [] and got["interpret"] is None


def test_cli_help_and_parser_import_no_torch():
    """``--help`` (with run's epilog: every notebook's parameters) needs neither torch
    nor nbformat."""
    got = _fresh(_LOADED + "from rope_kernels.__main__ import build_parser\n"
                 "build_parser().format_help()\nreport()")
    assert not set(HEAVY) & set(got["top"]), got["top"]


def test_registry_is_built_on_first_use():
    """Importing the registry module loads no peer; the first lookup builds it once."""
    got = _fresh(_LOADED + "import rope_kernels.variants as v\n"
                 "before = v._REGISTRY is None and not any(m.startswith('rope_kernels._peer') "
                 "for m in sys.modules) and 'liger_kernel' not in sys.modules\n"
                 "v.VARIANTS['native']\nfirst = v.registry()\n"
                 "report(before=before, cached=v.registry() is first)")
    assert got["before"] and got["cached"]


def test_kernels_pick_the_interpreter_without_a_gpu():
    """With no GPU and TRITON_INTERPRET unset, defining our kernels turns the
    interpreter on (Triton decides at @triton.jit definition) and patches its bf16
    cast; a CPU launch then works without the user setting anything."""
    got = _fresh(_LOADED + """
import torch
if torch.cuda.is_available():
    report(skipped=True)
else:
    from rope_kernels import fused_qk_rope, triton_interpreter_enabled
    from rope_kernels.kernels import interpreter
    q = torch.randn(3, 2, 8)
    cos, sin = torch.ones(3, 4), torch.zeros(3, 4)
    oq, ok = fused_qk_rope(q, q.clone(), cos, sin)
    report(skipped=False, enabled=triton_interpreter_enabled(), patched=interpreter._PATCHED,
           same=bool(torch.equal(oq, q)))
""")
    if not got["skipped"]:
        assert got["interpret"] == "1" and got["enabled"] and got["patched"] and got["same"]
