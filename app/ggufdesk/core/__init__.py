"""Pure-Python core: no Qt, no llama_cpp."""
