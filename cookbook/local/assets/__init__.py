"""Assets for local runs: tiny models, tokenizers and datasets made on this machine."""
