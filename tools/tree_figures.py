"""Figures of the code's shape: modules per folder, the longest classes, the longest import chain.

    python -m tools.tree_figures [ROOT] [--packages protocol,worker,safety,scheduler,tools,launch]

Reads the source with `ast` (imports nothing of it), so it also measures an old checkout
(`git archive REV | tar -x -C DIR`). Package `__init__` modules count as modules; an import chain
follows absolute imports between the measured modules.
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import os


def modules(root: str, packages: list[str]) -> dict[str, str]:
    found = {}
    for pkg in packages:
        for folder, dirs, files in os.walk(os.path.join(root, pkg)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    name = os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    found[name] = path
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", nargs="?", default=".")
    p.add_argument("--packages", default="protocol,worker,safety,scheduler,tools,launch")
    args = p.parse_args(argv)
    mods = modules(args.root, [x for x in args.packages.split(",") if os.path.isdir(os.path.join(args.root, x))])
    per_folder = collections.Counter(os.path.dirname(os.path.relpath(p, args.root)) for p in mods.values())
    classes, imports = [], collections.defaultdict(set)
    for name, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                classes.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}", methods))
            elif isinstance(node, ast.Import):
                imports[name].update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imports[name].add(node.module)
                imports[name].update(f"{node.module}.{a.name}" for a in node.names)
    edges = {m: {i for i in imports[m] if i in mods and i != m} for m in mods}

    @functools.lru_cache(None)
    def depth(m: str, seen: frozenset = frozenset()) -> int:
        return 1 + max((depth(d, seen | {m}) for d in edges[m] if d not in seen), default=0)

    chain = [max(mods, key=depth)]
    while nxt := [d for d in edges[chain[-1]] if d not in chain]:
        chain.append(max(nxt, key=depth))
    print("modules per folder:", ", ".join(f"{k} {v}" for k, v in sorted(per_folder.items())))
    for lines, name, methods in sorted(classes, reverse=True)[:3]:
        print(f"class {name}: {lines} lines, {methods} methods")
    print(f"longest import chain: {len(chain)} modules: {' -> '.join(chain)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
