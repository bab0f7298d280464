"""ggufdesk: run GGUF language models locally, fast."""
__version__ = "0.1.0"
