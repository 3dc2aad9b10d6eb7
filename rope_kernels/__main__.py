"""Command line: ``python -m rope_kernels {run,wheelhouse,peers,refresh-notebooks,index}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _wheelhouse(args) -> int:
    from rope_kernels.study.wheelhouse import build_wheelhouse

    wheels = build_wheelhouse(Path(args.out), args.python, args.platform, peers=not args.no_peers)
    print(f"{len(wheels)} wheels in {args.out}")
    print(f"on the offline node: pip install --no-index --find-links {args.out} "
          "papermill nbclient ipykernel nbconvert nbval")
    if not args.no_peers:
        from rope_kernels.peers.cache import fetch_all, peers_dir

        for line in fetch_all():
            print(line)
        print(f"peer files in {peers_dir()} (a few KB, git-ignored): copy them to the node too")
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
    import logging

    from rope_kernels.study.runner import ParameterError, run_study

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # Stream what the notebooks print (their sweep progress bars included) as they run.
    logging.getLogger("papermill").setLevel(logging.INFO)
    try:
        run_study(device=args.device, params_file=args.params, overrides=args.param or (),
                  only=args.only, keep_inputs=args.keep_inputs)
    except (ParameterError, RuntimeError) as exc:
        print(f"rope-study: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _index(args) -> int:
    from rope_kernels.study.devices import REPO_ROOT
    from rope_kernels.study.reports import build_index

    print(build_index(REPO_ROOT))
    return 0


def _refresh(args) -> int:
    from rope_kernels.study.notebooks import refresh_notebooks

    for path in refresh_notebooks(args.only):
        print(f"refreshed {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rope-study", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wheelhouse", help="download the notebook toolchain as wheels for offline nodes")
    w.add_argument("--python", default="3.12", help="the node's Python version, e.g. 3.12")
    w.add_argument("--platform", default="manylinux_2_28_x86_64", help="the node's wheel platform")
    w.add_argument("--out", required=True, help="folder for the wheels")
    w.add_argument("--no-peers", action="store_true",
                   help="skip liger-kernel and the engines' peer files")
    w.set_defaults(func=_wheelhouse)

    pe = sub.add_parser("peers", help="cache the engines' pinned peer files, or list which peers run")
    pe.add_argument("action", choices=["fetch", "status"],
                    help="fetch: download the pinned vLLM/SGLang wheels once and keep only the "
                         "files the peers run (.peers/ or $ROPE_PEERS_DIR); status: which peers "
                         "run here and why the others do not")
    pe.add_argument("--wheels", type=Path, help="a folder holding the pinned wheels (no download)")
    pe.add_argument("--force", action="store_true", help="re-fetch even when the cache is valid")
    pe.set_defaults(func=_peers)

    r = sub.add_parser("run", help="execute every notebook for this device; reports/ and data/")
    r.add_argument("--device", default="auto", help="auto (default), cpu, cuda or rocm")
    r.add_argument("--params", type=Path, help="a YAML file of parameters (over the device profile)")
    r.add_argument("-p", "--param", action="append", metavar="NAME=VALUE",
                   help="one parameter, for every notebook that has it (NOTEBOOK.NAME=VALUE for one)")
    r.add_argument("--only", action="append", metavar="NOTEBOOK", help="run just this notebook (repeatable)")
    r.add_argument("--keep-inputs", action="store_true", help="show code cells in the HTML reports")
    r.set_defaults(func=_run)

    i = sub.add_parser("index", help="rebuild reports/index.html from reports/ and data/")
    i.set_defaults(func=_index)

    n = sub.add_parser("refresh-notebooks",
                       help="re-execute notebooks with their default (CPU) parameters, in place")
    n.add_argument("--only", action="append", metavar="NOTEBOOK")
    n.set_defaults(func=_refresh)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
