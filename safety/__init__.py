"""Content safety checks (filled by the content-safety issue)."""
