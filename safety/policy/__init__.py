"""The prompt policy: versioned word lists in four languages, matched after normalisation, run
before any model classifier on every backend. `PromptPolicy.load(cfg.text.policy)`."""
