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
    "rope_kernels.wheels": 0,
    "rope_kernels.encoder_config": 0, "rope_kernels.prefill": 0,
    # the encoder parallel modes (torch-free, like the prefill): the study and specs read them
    "rope_kernels.encoder_parallel": 0,
    "rope_kernels.kernels": 1,
    "rope_kernels.correctness": 2,
    "rope_kernels.peers": 3,
    "rope_kernels.variants": 4, "rope_kernels.qkv": 4,
    "rope_kernels.bench": 5, "rope_kernels.model": 5,
}
STUDY = "rope_kernels.study"
# The infrastructure (Slurm submit, carry bundles, wheelhouse) sits above everything, the
# study included: it may import any layer; only the command line imports it.
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


def test_a_folder_is_one_layer():
    """Every module in a folder has the folder's layer: no LAYERS entry inside a folder
    that has another (model/config and model/prefill were layer 0 inside model/, layer 5;
    infra/wheelhouse was layer 0 inside the infrastructure; issue 44)."""
    folders = {m for m in _imports() if (ROOT / Path(*m.split("."))).is_dir()}
    problems = [f"{entry} (layer {layer}) lies in {outer}"
                for entry, layer in LAYERS.items()
                for outer in folders | {INFRA, STUDY}
                if entry.startswith(outer + ".") and outer != "rope_kernels"
                and (outer in (INFRA, STUDY) or LAYERS.get(outer, layer) != layer)]
    assert not problems, problems


def test_layers_hold():
    """No import from a higher layer into a lower one, none from bench/kernels/peers
    into the study (beyond the listed exceptions), none of the infrastructure from
    outside it, and nothing imports the command
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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules in ``graph`` (Tarjan), each
    sorted: a group is a circle of imports (a module importing itself, as a script's
    ``__main__`` block does, is not one)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt == node or nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_cycle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}, "e": {"a", "x"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    """No circle of imports in rope_kernels, counting every import (at the top or inside a
    function, ``from package import module`` included): a function-level import hides a
    circle from Python, not from the design (kernels/qkv_cute.py and qkv_cute_kernel.py
    imported each other; issue 44). The QKV launcher imports its kernel module, never
    the reverse; both take the config from a third module."""
    graph = _imports()
    assert not _cycles(graph), _cycles(graph)
    cute = "rope_kernels.kernels.qkv_cute"
    assert f"{cute}_kernel" in graph[cute] and cute not in graph[f"{cute}_kernel"]
    assert f"{cute}_config" in graph[cute] and f"{cute}_config" in graph[f"{cute}_kernel"]


def test_a_slurm_task_runs_the_runner_as_a_command(tmp_path):
    """run_task starts ``python -m rope_kernels run ...`` and records its exit status
    and last error line (it used to import the command line in-process)."""
    from rope_kernels.infra.submit import run_task

    rc = run_task(tmp_path, 0, ["run", "--device", "cpu", "-p", "sampels=3"])
    record = json.loads((tmp_path / "tasks" / "0.json").read_text())
    assert rc == 2 and record["rc"] == 2 and "sampels" in record["error"]


PACKAGE_MANAGERS = {"apt-get", "apt", "aptitude", "yum", "dnf", "zypper", "apk", "brew", "conda",
                    "mamba", "snap", "port", "pacman"}
_RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "system", "popen",
            "getoutput", "getstatusoutput", "spawnlp", "execvp"}


def _installs(source: str) -> list[str]:
    """Commands in ``source`` that a subprocess/os call would run to change the machine: a
    package manager's install (list or shell-string form), sudo, or a pip install that is
    not a --dry-run. Strings elsewhere (a skip message telling what to install) do not
    count."""
    import ast
    import shlex

    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in _RUNNERS):
            continue
        words = []
        for arg in node.args[:1]:
            parts = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
            for part in parts:
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    try:
                        words += shlex.split(part.value)
                    except ValueError:
                        words += part.value.split()
        names = [w.rsplit("/", 1)[-1] for w in words]
        if "sudo" in names or (set(names) & PACKAGE_MANAGERS and "install" in names) or (
                "pip" in names and "install" in names and "--dry-run" not in names):
            found.append(" ".join(words))
    return found


def test_install_finder_finds_installs():
    assert _installs('subprocess.run(["apt-get", "install", "-y", "munge"])')
    assert _installs('subprocess.run("sudo apt-get install -y slurm-wlm", shell=True)')
    assert _installs('os.system("/usr/bin/dnf install chromium")')
    assert _installs('subprocess.check_call([sys.executable, "-m", "pip", "install", "x"])')
    assert not _installs('subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "x"])')
    assert not _installs('pytest.skip("install slurm-wlm and munge (apt-get install slurm-wlm munge)")')
    assert not _installs('subprocess.run(["/usr/sbin/slurmd", "-C"])')


def test_no_test_installs_system_packages():
    """A test changes nothing on the machine it runs on: tests skip (saying what to install)
    where a tool is absent, and .ci/run installs what CI needs (and sets ROPE_REQUIRE_* so
    that an absence there is a failure). Checked on every call that runs a command in the
    tests (list or shell-string form), not only a list's first two words."""
    offenders = {p.name: found for p in sorted((ROOT / "tests").glob("*.py"))
                 if (found := _installs(p.read_text()))}
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
            # a planned launch: KernelLaunch(kernel, ...) (kernels/launch_plan.py) launches it
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "KernelLaunch" and node.args and isinstance(node.args[0], ast.Name):
                launched.add(node.args[0].id)
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


def test_checks_validate_and_switches_switch():
    """kernels/checks.py is input validation only; the runtime switches (Triton's
    interpreter, launch recording) are kernels/switches.py's (issue 44)."""
    import ast

    def defined(path):
        tree = ast.parse((ROOT / path).read_text())
        return ({n.name for n in tree.body if isinstance(n, ast.FunctionDef)},
                "ContextVar" in ast.unparse(tree), "triton.jit" in ast.unparse(tree))

    names, contextvar, jit = defined("rope_kernels/kernels/checks.py")
    assert not contextvar and not jit
    assert all(n.startswith(("check_", "_")) or n in ("may_overlap", "packed_qkv_of", "mark_written")
               for n in names), names
    names, contextvar, jit = defined("rope_kernels/kernels/switches.py")
    assert contextvar and jit
    assert {"recording_launches", "launches_recorded", "triton_interpreter_enabled"} <= names


# Files allowed a measured figure in their comments for now, each with who removes it.
MEASURED_IN_COMMENTS_PENDING: dict[str, str] = {}
_MEASURED = (r"\b\d+\.\d+ ?(us|ms)\b|\d+\.\d+ / \d+\.\d+|\d+(\.\d+)?% (over|slower|faster)\b(?! than with)"
             r"|\b\d+(\.\d+)?x (slower|faster)\b|\b\d+(\.\d+)?-\d+(\.\d+)?% of\b")


def test_no_measured_number_in_code_comments():
    """Measured figures live in docs/DECISIONS.md or in generated blocks, with a pointer from
    the code (issue 44: CuteQKVConfig's docstring, the NVIDIA_*_CONFIG comment, QuACK's
    defaults, TILE_BYTES held times). Targets' thresholds (targets.py) are not measurements."""
    import re

    assert re.search(_MEASURED, "# 308.3 / 605.5 / 1194.4") and re.search(_MEASURED, "ran 2.20 us")
    assert re.search(_MEASURED, "up to 1.8x slower") and re.search(_MEASURED, "ran at 40-65% of the")
    assert not re.search(_MEASURED, "2 and 4 heads x 72") and not re.search(_MEASURED, "3 x 16 x 72")
    offenders = []
    for path in sorted((ROOT / "rope_kernels").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in MEASURED_IN_COMMENTS_PENDING or rel == "rope_kernels/study/targets.py":
            continue
        offenders += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                      if re.search(_MEASURED, line)]
    assert not offenders, "\n".join(offenders)
