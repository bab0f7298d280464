"""The inference engine: the only package that imports llama_cpp (in worker/generate/speculative)."""
