"""Launch helpers: one node under torchrun (node.sh), and local runs for the demo and tests."""
