"""`dit-worker` console script.

    dit-worker serve --config configs/tiny.toml [--set queue.url=...]   one rank (torchrun runs several)
    dit-worker make-tiny-model models/tiny-flux     build the offline random-weight test model
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, "serve")  # `python -m worker --config X` is the serve command
    p = argparse.ArgumentParser(prog="dit-worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one rank of the worker")
    serve.add_argument("--config", required=True, help="TOML file, e.g. configs/flux-schnell.toml")
    serve.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override one config value (TOML syntax), e.g. --set queue.url=http://q:8700")
    tiny = sub.add_parser("make-tiny-model", help="save a tiny random-weight FLUX pipeline")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    if args.command == "serve":
        from worker.main import run

        return run(args.config, args.set)
    from worker.tiny_model import make_tiny_model

    print(make_tiny_model(args.directory, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
