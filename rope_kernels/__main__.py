"""Command line: ``python -m rope_kernels {run,wheelhouse,carry,peers,refresh-notebooks,index,
render-reports,submit,compile-matrix,targets,findings}``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def _wheelhouse(args) -> int:
    import subprocess

    from rope_kernels.infra.wheelhouse import build_wheelhouse

    try:
        wheels = build_wheelhouse(Path(args.out), args.python, args.platform,
                                  peers=not args.no_peers)
    except subprocess.CalledProcessError as exc:
        print(f"rope-study: error: pip download failed (exit {exc.returncode}; its output is "
              "above)", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(wheels)} wheels in {args.out}")
    print(f"on the offline node: pip install --no-index --find-links {args.out} "
          "papermill nbclient ipykernel nbconvert nbval")
    if not args.no_peers:
        from rope_kernels.peers.cache import PeerCacheError, fetch_all, peers_dir

        try:
            for line in fetch_all():
                print(line)
        except (PeerCacheError, OSError, subprocess.CalledProcessError) as exc:
            print(f"rope-study: error: peer files: {exc}", file=sys.stderr)
            return 2
        print(f"peer files in {peers_dir()} (a few KB, git-ignored): copy them to the node too")
    return 0


def _carry(args) -> int:
    from rope_kernels.peers.cache import PeerCacheError, fetch_all
    from rope_kernels.infra.carry import CARRY_DIR, CarryError, build_aic_bundle, build_bundles, main_sizes

    try:
        for line in fetch_all():  # .peers travels with bundle b
            print(line)
        out = args.out or CARRY_DIR
        build_bundles(out)
        build_aic_bundle(out)
    except (CarryError, PeerCacheError, OSError, subprocess.CalledProcessError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    print(main_sizes(out))
    print("call 1 (carry .carry/a): bash tools/device_setup.sh stage\n"
          "call 2 (carry .carry/b and .peers, started right after): "
          "bash tools/device_setup.sh install\n"
          "call C (carry .carry/c and .peers): bash tools/device_setup.sh aic "
          "(aiconfigurator-core with the H200's tables, for notebook 04)\n"
          "every later call: eval \"$(bash tools/device_setup.sh env)\" "
          "(PYTHONPATH for /tmp/site while the machine stays warm)")
    return 0


def _peers(args) -> int:
    from rope_kernels.peers.cache import PeerCacheError, fetch_all, peers_dir

    if args.action == "fetch":
        try:
            for line in fetch_all(wheels=args.wheels, force=args.force):
                print(line)
        except (PeerCacheError, OSError, RuntimeError) as exc:
            print(f"rope-study: error: {exc}", file=sys.stderr)
            return 2
        print(f"cache: {peers_dir()}")
        return 0
    from rope_kernels.variants import peer_status

    for row in peer_status():
        where = f"{row['package']} {row['version']} ({row['origin']})" if row["available"] else ""
        print(f"{row['name']:<20} {'ran' if row['available'] else 'absent':<7} "
              f"{where or row['reason']}")
    return 0


def _run(args) -> int:
    from rope_kernels.study.results import ResultFileError
    from rope_kernels.study.runner import NotebookError, ParameterError, run_study

    try:
        run_study(device=args.device, params_file=args.params, overrides=args.param or (),
                  only=args.only, keep_inputs=args.keep_inputs, verbose=args.verbose)
    except (ParameterError, NotebookError, ResultFileError, TimeoutError, RuntimeError,
            OSError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _render_reports(args) -> int:
    from rope_kernels.study.devices import REPO_ROOT
    from rope_kernels.study.reports import build_index, notebook_to_html
    from rope_kernels.study.results import ResultFileError

    folders = [REPO_ROOT / "reports" / args.device] if args.device else \
        sorted(p for p in (REPO_ROOT / "reports").iterdir() if p.is_dir() and not p.name.startswith("."))
    try:
        for folder in folders:
            if not folder.is_dir():
                raise OSError(f"{folder}: no such report folder")
            for nb in sorted(folder.glob("[0-9]*.ipynb")):
                if nb.name.endswith(".failed.ipynb") or nb.name.startswith("."):
                    continue
                print(notebook_to_html(nb, nb.with_suffix(".html")).relative_to(REPO_ROOT))
        print(build_index(REPO_ROOT).relative_to(REPO_ROOT))
    except (ResultFileError, OSError, ValueError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _index(args) -> int:
    from rope_kernels.study.devices import REPO_ROOT
    from rope_kernels.study.reports import build_index
    from rope_kernels.study.results import ResultFileError

    try:
        print(build_index(REPO_ROOT))
    except (ResultFileError, OSError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _refresh(args) -> int:
    from rope_kernels.study.notebooks import refresh_notebooks
    from rope_kernels.study.runner import ParameterError, select_notebooks

    try:
        select_notebooks(args.only)  # a name that matches no notebook is an error
    except ParameterError as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    for path in refresh_notebooks(args.only):
        print(f"refreshed {path}")
    return 0


def _submit(args) -> int:
    from rope_kernels.atomic_io import ResultFileError
    from rope_kernels.infra import submit as sb
    from rope_kernels.study.runner import ParameterError

    try:
        if args.task is not None:
            return sb.run_task(Path(args.state), args.task, args.runner_args)
        state = Path(args.state) if args.state else None
        if args.finish or args.status or args.missing:
            state = state or sb.latest_state()
            if args.finish:
                sb.finish(state)
            elif args.status:
                print(sb.shard_status(state).to_string(index=False))
            else:
                sb.resubmit_missing(state, dry_run=args.dry_run)
            return 0
        opts = sb.SlurmOptions(
            partitions=tuple(sb.Partition.parse(p, args.device) for p in args.partition or ()),
            account=args.account, time_limit=args.time, gpus_per_task=args.gpus_per_task,
            constraint=args.constraint, cpus_per_task=args.cpus_per_task, mem=args.mem,
            max_running=args.max_running, summary_partition=args.summary_partition,
            job_name=args.job_name, sbatch_lines=tuple(args.sbatch or ()), venv=args.venv,
            conda_env=args.conda_env, modules=tuple(args.module or ()),
            setup_lines=tuple(args.setup or ()), python=args.python)
        sb.submit(opts, only=args.only, params_file=args.params, overrides=args.param or (),
                  name=args.name, dry_run=args.dry_run)
    except (ParameterError, sb.SubmitError, ResultFileError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _compile_matrix(args) -> int:
    import pandas as pd

    from rope_kernels.bench.compile_matrix import (COMPILE_MATRIX_CSV, EXTRA_KERNELS,
                                                   EXTRA_ROWS, merge_rows, write_compile_matrix,
                                                   write_extra_rows)
    from rope_kernels.kernels import qkv_cute, qkv_flydsl

    path = args.out or COMPILE_MATRIX_CSV
    which = args.only.split(",") if args.only else ["triton", *EXTRA_ROWS]
    if not which or set(which) - {"triton", *EXTRA_ROWS}:
        print(f"rope-study: error: --only takes some of triton,{','.join(EXTRA_ROWS)}, "
              f"got {args.only!r}", file=sys.stderr)
        return 2
    missing = [why for w, (ok, why) in (
        ("cute-sm100", (qkv_cute.available(), "nvidia-cutlass-dsl is not installed")),
        ("flydsl-gfx942", qkv_flydsl.availability())) if w in which and not ok]
    if missing:  # before anything is rewritten
        print(f"rope-study: error: {'; '.join(missing)} (--only triton recompiles the Triton "
              f"rows alone, keeping the others)", file=sys.stderr)
        return 1
    try:
        if "triton" in which:
            # the Triton matrix replaces the file: the other compilers' rows are kept
            old = pd.read_csv(path) if Path(path).is_file() else pd.DataFrame()
            kept = old[old["kernel"].isin(EXTRA_KERNELS)] if len(old) else old
            write_compile_matrix(path)
            if len(kept):
                merge_rows(path, kept)
        extras = [w for w in which if w != "triton"]
        if extras:
            write_extra_rows(path, extras)
    except RuntimeError as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _targets(args) -> int:
    from rope_kernels.study.devices import REPO_ROOT
    from rope_kernels.study.targets import report, result_folders

    root = Path(args.data_root) if args.data_root else REPO_ROOT / "data"
    folders = [root / args.device] if args.device else result_folders(root)
    if not folders or not folders[0].is_dir():
        print(f"rope-study: error: no result folder {folders[0] if folders else root / '<device>'}",
              file=sys.stderr)
        return 2
    try:
        print("\n\n".join(report(f, detail=not args.summary) for f in folders))
    except (ValueError, OSError) as exc:  # a damaged result file: one line naming it
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _findings(args) -> int:
    from rope_kernels.bench import compile_matrix
    from rope_kernels.bench.compile_matrix import COMPILE_MATRIX_CSV
    from rope_kernels.study import summaries
    from rope_kernels.study.devices import REPO_ROOT
    from rope_kernels.study.results import read_table
    from rope_kernels.study.findings import (DEVICE, read_readme, readme_section,
                                             render_findings, write_readme)
    from rope_kernels.atomic_io import write_atomic

    folder = (Path(args.data_root) if args.data_root else REPO_ROOT / "data") / (args.device or DEVICE)
    readme = Path(args.readme) if args.readme else REPO_ROOT / "README.md"
    try:
        section = render_findings(folder)
        # README's first screen (what was found, what to ship, the two commands), where it has the markers
        text = read_readme(readme) if readme.exists() else ""
        top = summaries.readme_block(summaries.load(folder), folder.name) \
            if summaries.README_BEGIN in text else None
        # the ROCm section's register budgets, from the compile matrix beside the device folders
        blocks = [(top, summaries.README_BEGIN, summaries.README_END)] if top is not None else []
        matrix = folder.parent / "compile" / COMPILE_MATRIX_CSV.name
        if compile_matrix.README_BEGIN in text and matrix.is_file():
            blocks.append((compile_matrix.readme_block(read_table(matrix)),
                           compile_matrix.README_BEGIN, compile_matrix.README_END))
        if args.write:
            changed = write_readme(readme, section)
            text = read_readme(readme)
            new = text
            for block, begin, end in blocks:
                new = summaries.replace_readme_summary(new, block, begin, end)
            if new != text:
                write_atomic(readme, new, through_link=True, keep_mode=True)
                changed = True
            print(f"{readme}: findings {'rewritten' if changed else 'already up to date'} from {folder}")
        elif args.check:
            if readme_section(read_readme(readme), str(readme)) != section or any(
                    summaries.readme_summary(text, begin, end) != block for block, begin, end in blocks):
                print(f"rope-study: error: {readme}'s findings differ from {folder}'s rows (or its compile "
                      f"block from {matrix}); run: python -m rope_kernels findings --write", file=sys.stderr)
                return 1
            print(f"{readme}: findings match {folder}")
        else:
            print(section, end="")
    except (ValueError, OSError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _ttft(args) -> int:
    from rope_kernels.prefill import PrefillModel, tower_ttft, towers_without_ttft
    from rope_kernels.study.devices import REPO_ROOT, data_line
    from rope_kernels.study.results import read_table, upsert_csv
    from rope_kernels.study.specs import ENCODER_LATENCY_CSV, TIME_TO_FIRST_TOKEN_CSV

    root = Path(args.data_root) if args.data_root else REPO_ROOT / "data"
    folder = root / args.device
    # one folder under the data root (a device's name), never a path that leaves it
    if args.device in ("", ".", "..") or Path(args.device).name != args.device or \
            "\\" in args.device or not folder.resolve().is_relative_to(root.resolve()):
        print(f"rope-study: error: --device must name a folder under {root} (a device, e.g. "
              f"nvidia-h200), got {args.device!r}", file=sys.stderr)
        return 2
    source = folder / ENCODER_LATENCY_CSV
    if not source.exists():
        print(f"rope-study: error: no {source}", file=sys.stderr)
        return 2
    try:
        latency = read_table(source)
        if args.images:
            latency = latency[latency["images"].isin(args.images)]
        # per encoder (Kimi-K2.5's and each tower's rows), each with its own language model
        rows = tower_ttft(latency, text_tokens=args.text_tokens, hand=PrefillModel(), source=args.prefill,
                           graph_tokens=args.encoder_graph_tokens, backend=args.backend, tp=args.tp,
                           moe_tp=args.tp // args.moe_ep if args.tp % args.moe_ep == 0 else 0,
                           moe_ep=args.moe_ep)
    except (ValueError, RuntimeError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    for name, why in towers_without_ttft(latency["encoder"] if "encoder" in latency else []).items():
        print(f"{name}: no time to first token ({why})")
    shown = rows.pivot_table(index=["encoder", "resolution", "images", "llm_prefill_tokens", "prefill_ms"],
                             columns=["encoder_parallel", "encoder_policy", "variant"], values="ttft_ms")
    print(shown.round(1).to_string())
    for _, first in rows.drop_duplicates("encoder").iterrows():
        print(f"prefill ({first.encoder}: {first.prefill_llm}): {first.prefill_source} {first.prefill_package} "
              f"{first.prefill_system} {first.prefill_backend} {first.prefill_parallelism} "
              f"{first.prefill_note}".rstrip())
    if args.write:
        upsert_csv(folder / TIME_TO_FIRST_TOKEN_CSV, rows)
        print(data_line(folder / TIME_TO_FIRST_TOKEN_CSV))
    return 0


DESCRIPTION = ("Vision RoPE kernel study (vLLM PR #50400, Kimi-K2.5): run the notebooks for "
               "this machine's device, rebuild the index, refresh the notebooks' stored outputs, "
               "or prepare offline GPU nodes. `rope-study run --help` lists the notebooks and "
               "their parameters.")


def _run_epilog() -> str:
    """The notebooks, their parameters with defaults, and where results go (from the
    notebook specs: no notebook is read, nothing heavy imported)."""
    from rope_kernels.study.specs import RUNNER_PARAMS, SPECS

    lines = ["notebooks (in this order; --only takes a name or prefix, e.g. 02) and their "
             "parameters with defaults (the small CPU configuration):"]
    for nb, spec in SPECS.items():
        lines.append(f"  {nb}" + (f"  -> data/<device>/{', '.join(spec.writes)}"
                                  if spec.writes else ""))
        for name, param in spec.user_parameters.items():
            lines.append(f"      {name} = {param.default!r}")
    lines += [
        "",
        "values: params/<cpu|cuda|rocm>.yaml for the detected device, then --params FILE, then",
        "-p NAME=VALUE (every notebook that has NAME) or -p NOTEBOOK.NAME=VALUE; values are YAML.",
        f"set by the runner: {', '.join(RUNNER_PARAMS)}.",
        "",
        "writes: data/<device>/*.csv (rows upserted by key), reports/<device>/<notebook>.ipynb",
        "and .html, reports/<device>/traces/; a failed notebook leaves",
        "reports/<device>/<notebook>.failed.ipynb. reports/index.html lists committed devices.",
        "",
        "example: rope-study run --only 02 -p samples=50 -p 02_microbench.modes='[eager]'",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rope-study", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wheelhouse", help="download the notebook toolchain as wheels for offline nodes")
    w.add_argument("--python", default="3.12", help="the node's Python version, e.g. 3.12")
    w.add_argument("--platform", default="manylinux_2_28_x86_64", help="the node's wheel platform")
    w.add_argument("--out", required=True, help="folder for the wheels")
    w.add_argument("--no-peers", action="store_true",
                   help="skip liger-kernel and the engines' peer files")
    w.set_defaults(func=_wheelhouse)

    ca = sub.add_parser("carry", help="pack the CUDA peers' wheels, the toolchain and aiconfigurator "
                        "into three bundles for an air-gapped GPU node (.carry/a, .carry/b, .carry/c; "
                        "tools/device_setup.sh installs them there)")
    ca.add_argument("--out", type=Path, default=None,
                    help="folder for the bundles (default: .carry/ in the repository)")
    ca.set_defaults(func=_carry)

    pe = sub.add_parser("peers", help="cache the engines' pinned peer files, or list which peers run")
    pe.add_argument("action", choices=["fetch", "status"],
                    help="fetch: download the pinned vLLM/SGLang/FlashInfer wheels once and keep "
                         "only the files the peers run (.peers/ or $ROPE_PEERS_DIR); status: which "
                         "peers run here and why the others do not")
    pe.add_argument("--wheels", type=Path, help="a folder holding the pinned wheels (no download)")
    pe.add_argument("--force", action="store_true", help="re-fetch even when the cache is valid")
    pe.set_defaults(func=_peers)

    r = sub.add_parser("run", help="execute every notebook for this device; reports/ and data/",
                       description="Execute the study's notebooks for this machine's device.",
                       epilog=_run_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--device", default="auto", help="auto (default), cpu, cuda or rocm")
    r.add_argument("--params", type=Path, help="a YAML file of parameters (over the device profile)")
    r.add_argument("-p", "--param", action="append", metavar="NAME=VALUE",
                   help="one parameter, for every notebook that has it (NOTEBOOK.NAME=VALUE for one)")
    r.add_argument("--only", action="append", metavar="NOTEBOOK", help="run just this notebook (repeatable)")
    r.add_argument("--keep-inputs", action="store_true", help="show code cells in the HTML reports")
    r.add_argument("-v", "--verbose", action="store_true",
                   help="stream every cell's output and the kernel's messages")
    r.set_defaults(func=_run)

    i = sub.add_parser("index", help="rebuild reports/index.html from the devices whose results "
                       "git tracks (data/<device>/, reports/<device>/)")
    i.set_defaults(func=_index)

    r = sub.add_parser("render-reports", help="re-render reports/<device>/*.html from the executed notebooks "
                       "stored beside them (what we found from data/<device>/, raw rows last), then the index")
    r.add_argument("--device", default="", help="one folder under reports/ (default: every one)")
    r.set_defaults(func=_render_reports)

    s = sub.add_parser("submit", help="run the study as a Slurm job array (one task per "
                       "notebook shard) plus a summary job; or --status / --missing")
    s.add_argument("--partition", action="append", metavar="NAME[=KIND[:GPU_TYPE]]",
                   help="a partition to run every shard on (repeatable), e.g. h200 or "
                        "mi300x=rocm or gpu=cuda:h100; KIND picks params/<kind>.yaml")
    s.add_argument("--device", default="cuda", choices=("cuda", "rocm", "cpu"),
                   help="device kind of partitions named without one (default cuda)")
    s.add_argument("--account", default="")
    s.add_argument("--time", default="01:00:00", help="time limit per task (default 01:00:00)")
    s.add_argument("--gpus-per-task", type=int, default=1, help="GPUs per task (--gres), 0: none")
    s.add_argument("--constraint", default="", help="sbatch --constraint, e.g. a GPU feature")
    s.add_argument("--cpus-per-task", type=int, default=4)
    s.add_argument("--mem", default="", help="sbatch --mem, e.g. 64G")
    s.add_argument("--max-running", type=int, default=0, help="at most N tasks at once (%%N)")
    s.add_argument("--summary-partition", default="", help="default: the first --partition")
    s.add_argument("--job-name", default="rope-study")
    s.add_argument("--sbatch", action="append", metavar="OPTION",
                   help="another #SBATCH option, e.g. --qos=short (repeatable)")
    s.add_argument("--venv", default="", help="virtual environment to activate in every job")
    s.add_argument("--conda-env", default="", help="conda environment to activate")
    s.add_argument("--module", action="append", help="module to load (repeatable)")
    s.add_argument("--setup", action="append", metavar="LINE",
                   help="a shell line run before the study (repeatable)")
    s.add_argument("--python", default="", help="interpreter in the jobs (default: python "
                   "after an activation, else this one)")
    s.add_argument("--params", type=Path, help="a YAML file of parameters (as for run)")
    s.add_argument("-p", "--param", action="append", metavar="NAME=VALUE", help="as for run")
    s.add_argument("--only", action="append", metavar="NOTEBOOK", help="as for run")
    s.add_argument("--name", help="submission name (default: the time), state in slurm/<name>/")
    s.add_argument("--dry-run", action="store_true", help="print the scripts, submit nothing")
    s.add_argument("--state", help="a submission's folder (default: the latest under slurm/)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--status", action="store_true", help="print every shard's status")
    mode.add_argument("--missing", action="store_true",
                      help="re-submit only the shards that are missing (failed, killed, no rows)")
    mode.add_argument("--finish", action="store_true", help=argparse.SUPPRESS)  # summary job
    mode.add_argument("--task", type=int, help=argparse.SUPPRESS)  # inside an array task
    s.add_argument("runner_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    s.set_defaults(func=_submit)

    c = sub.add_parser("compile-matrix", help="compile every Triton kernel for gfx942, gfx90a, "
                       "sm_90 and sm_100, the CuTe DSL QKV kernel for sm_100a and the FlyDSL "
                       "one for gfx942 (no GPU needed); data/compile/compile_matrix.csv")
    c.add_argument("--out", type=Path, default=None, help="CSV path (default: data/compile/...)")
    c.add_argument("--only", default=None, metavar="triton,cute-sm100,flydsl-gfx942",
                   help="only (re)compile these rows (Triton's, the CuTe DSL sm_100a ones, the "
                   "FlyDSL gfx942 one), keeping the others")
    c.set_defaults(func=_compile_matrix)

    t = sub.add_parser("targets", help="judge every target of the study on a device's result rows "
                       "(rope_kernels/study/targets.py) and print the table as markdown")
    t.add_argument("--device", default="", help="a folder under data/, e.g. nvidia-h200 "
                   "(default: every device folder)")
    t.add_argument("--data-root", default="", help="default: this checkout's data/")
    t.add_argument("--summary", action="store_true", help="one line per target, no per-shape rows")
    t.set_defaults(func=_targets)

    f = sub.add_parser("findings", help="generate README.md's findings section from a device's "
                       "committed rows (print it, --write it into README.md, or --check it)")
    f.add_argument("--device", default="", help="a folder under data/ (default nvidia-h200)")
    f.add_argument("--data-root", default="", help="default: this checkout's data/")
    f.add_argument("--readme", default="", help="default: this checkout's README.md")
    what = f.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="replace the section between the markers")
    what.add_argument("--check", action="store_true", help="exit 1 when the README's section differs")
    f.set_defaults(func=_findings)

    tt = sub.add_parser("ttft", help="time to first token per RoPE choice from a device's "
                        "encoder_latency.csv: the prefill from aiconfigurator-core's tables for that "
                        "device (the `ttft` extra; no GPU needed), else the hand model")
    tt.add_argument("--device", default="nvidia-h200", help="a folder under data/ (default nvidia-h200)")
    tt.add_argument("--data-root", default="", help="default: this checkout's data/")
    tt.add_argument("--prefill", default="auto", choices=("auto", "aiconfigurator", "hand"))
    tt.add_argument("--text-tokens", type=int, default=200, help="text tokens besides the images")
    tt.add_argument("--backend", default="vllm", choices=("vllm",))
    tt.add_argument("--tp", type=int, default=8)
    tt.add_argument("--moe-ep", type=int, default=8)
    tt.add_argument("--encoder-graph-tokens", type=int, default=5120,
                    help="vLLM's largest encoder CUDA graph, in merged tokens")
    tt.add_argument("--images", type=int, action="append", help="only these image counts (repeatable)")
    tt.add_argument("--write", action="store_true", help="upsert data/<device>/time_to_first_token.csv")
    tt.set_defaults(func=_ttft)

    n = sub.add_parser("refresh-notebooks",
                       help="re-execute notebooks with their default (CPU) parameters, in place")
    n.add_argument("--only", action="append", metavar="NOTEBOOK",
                   help="just this notebook (name or prefix, e.g. 05; repeatable)")
    n.set_defaults(func=_refresh)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rope_kernels.peers.cache import export_peers_dir

    export_peers_dir()  # one absolute cache folder for this process and every child it starts
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
