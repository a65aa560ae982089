"""What builds what ships, run from a checkout and never imported by the product: the offline
wheelhouse, the prompt policy's built data (forms, learned layer), docs/config.md, the Grafana
dashboard. Each is a make target (`make wheelhouse`, `make policy-forms`, `make policy-model`,
`make docs`) or `python -m release.NAME`."""
