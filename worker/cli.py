"""`dit-worker` console script.

    dit-worker serve --config configs/tiny.toml [--set queue.url=...]   one rank (torchrun runs several)
    dit-worker check --config configs/tiny.toml [--set ...]   the start errors no restart can cure (exit 2)
    dit-worker detoxify-offline SRC.ckpt HF_DIR DST.ckpt   make a released detoxify checkpoint load offline

Other packages register more commands as entry points in the `dit_worker.commands` group, so the
worker never imports them (this repository's: launch's `make-tiny-model`; see `dit-worker --help`).
"""

from __future__ import annotations

import argparse
import gc
import sys
from importlib.metadata import entry_points

PLUGINS = "dit_worker.commands"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, "serve")  # `python -m worker --config X` is the serve command
    plugins = {ep.name: ep for ep in entry_points(group=PLUGINS)}
    if argv[0] in plugins:  # a plug-in command: it parses its own arguments and logs its own way
        return plugins[argv[0]].load()(argv[1:])
    p = argparse.ArgumentParser(prog="dit-worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"plug-in commands installed: {', '.join(sorted(plugins)) or 'none'}")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one rank of the worker")
    serve.add_argument("--config", required=True, help="TOML file, e.g. configs/flux-schnell.toml")
    serve.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override one config value (TOML syntax), e.g. --set queue.url=http://q:8700")
    serve.add_argument("--node-dir", metavar="DIR", help="the directory launch/node.sh shares with its ranks "
                       "(a stop during a group restart, a start error no restart cures; worker/nodedir.py)")
    check = sub.add_parser("check", help="config, device and ops port, before torchrun starts a group: "
                           "exit 2 with the field to fix")
    check.add_argument("--config", required=True)
    check.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    detox = sub.add_parser("detoxify-offline", help="rewrite a detoxify checkpoint to name a local "
                           "directory holding its Hugging Face config.json and tokenizer files")
    detox.add_argument("checkpoint")
    detox.add_argument("hf_dir")
    detox.add_argument("output")
    args = p.parse_args(argv)

    if args.command == "serve":
        # Start-up (torch, diffusers, the policy's lists, the model) makes millions of objects that
        # live as long as the process; the collector walking them again and again on the way cost
        # a sixth of a 2-rank demo's CPU. It stays off until the rank serves (worker/main.py).
        gc.disable()
        try:
            from worker.main import run

            return run(args.config, args.set, args.node_dir)
        finally:
            gc.enable()
    if args.command == "check":
        from worker.preflight import check

        return check(args.config, args.set)
    from safety.text import make_offline_checkpoint

    print(make_offline_checkpoint(args.checkpoint, args.hf_dir, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
