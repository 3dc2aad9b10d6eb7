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


def test_triton_standard_library_is_interpreted_too():
    """Triton's own jitted helpers (tl.interleave, which vLLM's packed_qk_rope_ calls) are
    defined when triton.language is first imported: the interpreter decision must come
    before that, or an interpreted kernel calling them fails with "Cannot call
    @triton.jit'd outside of the scope of a kernel" (``make study`` on a CPU did)."""
    got = _fresh(_LOADED + """
import torch
if torch.cuda.is_available():
    report(skipped=True)
else:
    import rope_kernels.kernels.checks  # the package's first Triton import
    import triton
    import triton.language as tl

    @triton.jit
    def _pairs(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out_ptr + tl.arange(0, 2 * N), tl.interleave(tl.load(x_ptr + i), tl.load(y_ptr + i)))

    x, y, out = torch.arange(4.0), -torch.arange(4.0), torch.empty(8)
    _pairs[(1,)](x, y, out, N=4)
    report(skipped=False, same=out.tolist() == [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0])
""")
    if not got["skipped"]:
        assert got["same"]


# -- layers ------------------------------------------------------------------------------
# Who may import whom, lowest first. A module may import its own layer and the ones
# below it, never one above: kernels know nothing of peers, bench or the study; the
# study runs notebooks (which import bench) but does not import bench itself.
LAYERS = {
    "rope_kernels.vocabulary": 0, "rope_kernels.provenance": 0, "rope_kernels.atomic_io": 0,
    "rope_kernels.catalogue": 0, "rope_kernels.percentiles": 0, "rope_kernels.roofline": 0,
    "rope_kernels.towers": 0,
    # pip download lines only, importing nothing of the package: peers/cache.py uses it
    "rope_kernels.infra.wheelhouse": 0,
    "rope_kernels.model.config": 0, "rope_kernels.model.prefill": 0,
    "rope_kernels.kernels": 1,
    "rope_kernels.correctness": 2,
    "rope_kernels.peers": 3,
    "rope_kernels.variants": 4, "rope_kernels.qkv": 4,
    "rope_kernels.bench": 5, "rope_kernels.model": 5,
}
STUDY = "rope_kernels.study"
# The infrastructure (Slurm submit, carry bundles, wheelhouse) sits above everything, the
# study included: it may import any layer; only the command line imports it (and the
# bottom-layer wheelhouse, listed in LAYERS, may be imported by anyone).
INFRA = "rope_kernels.infra"
# Imports into the study from below that remain, each with why (new ones fail the test).
STUDY_EXCEPTIONS = {
    ("rope_kernels.study.execution", "rope_kernels.peers.cache"):
        "export_peers_dir: the runner hands the resolved peer cache to notebook kernels",
}


def _imports() -> dict[str, set[str]]:
    """module -> every rope_kernels module it imports (at the top or inside a function)."""
    import ast

    graph = {}
    for path in sorted((ROOT / "rope_kernels").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("rope_kernels")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rope_kernels"):
                targets.add(node.module)
                # "from rope_kernels.x import y": y may be a submodule
                targets |= {f"{node.module}.{a.name}" for a in node.names
                            if (ROOT / Path(*f"{node.module}.{a.name}".split("."))).with_suffix(".py").exists()}
        graph[name] = targets
    return graph


def _layer(module: str) -> int | None:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def test_layers_hold():
    """No import from a higher layer into a lower one, none from bench/kernels/peers
    into the study (beyond the listed exceptions), none of the infrastructure from
    outside it (but its bottom-layer wheelhouse), and nothing imports the command
    line (study/submit.py did: a circle through rope_kernels.__main__)."""
    problems = []
    graph = _imports()
    assert any(m.startswith(INFRA + ".") for m in graph), "no infrastructure package found"
    for module, targets in graph.items():
        for target in targets:
            if target == "rope_kernels.__main__":
                problems.append(f"{module} imports the command line")
            if (target.startswith(INFRA + ".") and _layer(target) is None
                    and not module.startswith(INFRA) and module != "rope_kernels.__main__"):
                problems.append(f"{module} imports the infrastructure ({target})")
            mine, theirs = _layer(module), _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
            if mine is not None and target.startswith(STUDY):
                problems.append(f"{module} imports the study ({target})")
            if module.startswith(STUDY) and theirs is not None and theirs in (1, 2, 3, 5):
                if (module, target) not in STUDY_EXCEPTIONS:
                    problems.append(f"{module} imports {target}")
    assert not problems, "\n".join(sorted(problems))


def test_no_import_cycle_at_module_level():
    import ast

    graph = {}
    for path in sorted((ROOT / "rope_kernels").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        tree = ast.parse(path.read_text())
        graph[name] = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)
                       and (n.module or "").startswith("rope_kernels")} | {
            a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names
            if a.name.startswith("rope_kernels")}
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join(stack[stack.index(nxt):] + [nxt])
                                     if nxt in stack else f"{node} -> {nxt}")
            if nxt in graph and not state.get(nxt):
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in graph:
        if not state.get(node):
            visit(node, [node])


def test_a_slurm_task_runs_the_runner_as_a_command(tmp_path):
    """run_task starts ``python -m rope_kernels run ...`` and records its exit status
    and last error line (it used to import the command line in-process)."""
    from rope_kernels.infra.submit import run_task

    rc = run_task(tmp_path, 0, ["run", "--device", "cpu", "-p", "sampels=3"])
    record = json.loads((tmp_path / "tasks" / "0.json").read_text())
    assert rc == 2 and record["rc"] == 2 and "sampels" in record["error"]


def test_no_test_installs_system_packages():
    """Tests skip (with the package to install) instead of running a package manager;
    .ci/run installs what CI needs."""
    import re

    pattern = re.compile(r"""["'](apt-get|apt|yum|dnf|brew|conda)["']\s*,\s*["']install""")
    offenders = [p.name for p in (ROOT / "tests").glob("*.py") if pattern.search(p.read_text())]
    assert not offenders, offenders


# -- the compile matrix covers every kernel the package launches ------------------------
# Launched kernels not in compile_matrix.KERNELS yet, each with who adds it. A kernel
# that is neither in the matrix nor here fails the test below; remove an entry once
# its KernelEntry lands.
COMPILE_MATRIX_PENDING = {
    ("rope_kernels.bench.same_bytes_copy", "_copy_row_kernel"):
        "the SM same-bytes copy, row tiling (a benchmark reference, not a study kernel)",
    ("rope_kernels.bench.same_bytes_copy", "_copy_tokens_kernel"):
        "the SM same-bytes copy, whole tokens per program (a benchmark reference)",
    ("rope_kernels.bench.same_bytes_copy", "_copy_flat_kernel"):
        "the SM same-bytes copy, flat blocks (a benchmark reference)",
    ("rope_kernels.bench.same_bytes_copy", "_copy_heads_kernel"):
        "the SM same-bytes copy in vLLM's cut, tokens x one head (a benchmark reference)",
    ("rope_kernels.bench.same_bytes_copy", "_copy_pairs_kernel"):
        "the SM same-bytes copy in SGLang's cut, pairs per program (a benchmark reference)",
    ("rope_kernels.bench.same_bytes_copy", "_copy_pair_scalars_kernel"):
        "the SM same-bytes copy in SGLang's cut with its scalar loads (a benchmark reference)",
    ("rope_kernels.bench.fused_candidates", "_fused_qk_rope_persistent_kernel"):
        "a launch candidate the sweep measures (issue 17); joins the matrix if it becomes the default",
    ("rope_kernels.bench.fused_candidates", "_fused_qk_rope_angles_kernel"):
        "a launch candidate the sweep measures (issue 17); joins the matrix if it becomes the default",
}


def _launched_triton_kernels() -> set[tuple[str, str]]:
    """(module, name) of every ``@triton.jit`` function in rope_kernels that the package
    launches as ``name[grid](...)`` (helpers called from kernels compile inside them)."""
    import ast

    jitted, launched = {}, set()
    for path in sorted((ROOT / "rope_kernels").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                    "triton.jit" in ast.unparse(d) or ast.unparse(d) == "jit"
                    for d in node.decorator_list):
                jitted[node.name] = module
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and \
                    isinstance(node.func.value, ast.Name):
                launched.add(node.func.value.id)
    return {(module, name) for name, module in jitted.items() if name in launched}


def test_compile_matrix_covers_every_launched_kernel():
    """Discovered from the source, not from the list the matrix is given: a new
    kernel the package launches must get a KernelEntry (or a pending line here)."""
    from rope_kernels.bench.compile_matrix import KERNELS

    owned = _launched_triton_kernels()
    assert ("rope_kernels.kernels.fused", "_fused_qk_rope_rows_kernel") in owned  # discovery works
    in_matrix = {(k.module, k.kernel) for k in KERNELS}
    assert in_matrix <= owned, in_matrix - owned  # the matrix names real kernels
    missing = sorted(owned - in_matrix - set(COMPILE_MATRIX_PENDING))
    assert not missing, "not in compile_matrix.KERNELS: " + ", ".join(
        f"{m}.{k}" for m, k in missing)
    stale = sorted(set(COMPILE_MATRIX_PENDING) & in_matrix | set(COMPILE_MATRIX_PENDING) - owned)
    assert not stale, "in the matrix now (or gone): remove from COMPILE_MATRIX_PENDING: " + \
        ", ".join(f"{m}.{k}" for m, k in stale)
