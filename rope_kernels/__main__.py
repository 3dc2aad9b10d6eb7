"""Command line: ``python -m rope_kernels {run,wheelhouse,refresh-notebooks,index}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _wheelhouse(args) -> int:
    from rope_kernels.wheelhouse import build_wheelhouse

    wheels = build_wheelhouse(Path(args.out), args.python, args.platform, peers=not args.no_peers)
    print(f"{len(wheels)} wheels in {args.out}")
    print(f"on the offline node: pip install --no-index --find-links {args.out} "
          "papermill nbclient ipykernel nbconvert nbval")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rope-study", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wheelhouse", help="download the notebook toolchain as wheels for offline nodes")
    w.add_argument("--python", default="3.12", help="the node's Python version, e.g. 3.12")
    w.add_argument("--platform", default="manylinux_2_28_x86_64", help="the node's wheel platform")
    w.add_argument("--out", required=True, help="folder for the wheels")
    w.add_argument("--no-peers", action="store_true", help="skip liger-kernel")
    w.set_defaults(func=_wheelhouse)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
