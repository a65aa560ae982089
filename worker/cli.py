"""`dit-worker` console script.

    dit-worker serve --config configs/tiny.toml [--set queue.url=...]   one rank (torchrun runs several)
    dit-worker make-tiny-model models/tiny-flux     build the offline random-weight test model
    dit-worker detoxify-offline SRC.ckpt HF_DIR DST.ckpt   make a released detoxify checkpoint load offline
    dit-worker bench --config configs/tiny.toml --out var/bench   baseline vs optimised vs worker
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
    detox = sub.add_parser("detoxify-offline", help="rewrite a detoxify checkpoint to name a local "
                           "directory holding its Hugging Face config.json and tokenizer files")
    detox.add_argument("checkpoint")
    detox.add_argument("hf_dir")
    detox.add_argument("output")
    bench = sub.add_parser("bench", help="images/min of a plain diffusers loop, the optimised engine and the "
                           "full worker, side by side (writes bench.json and bench.png)")
    from worker.bench import add_arguments

    add_arguments(bench)
    args = p.parse_args(argv)

    if args.command == "serve":
        from worker.main import run

        return run(args.config, args.set)
    if args.command == "bench":
        import logging

        from worker.bench import run

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return run(args)
    if args.command == "detoxify-offline":
        from safety.text import make_offline_checkpoint

        print(make_offline_checkpoint(args.checkpoint, args.hf_dir, args.output))
        return 0
    from worker.tiny_model import make_tiny_model

    print(make_tiny_model(args.directory, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
