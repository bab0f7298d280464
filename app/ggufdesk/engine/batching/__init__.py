"""The step loop: many sequences on one context, scheduling, the prefix cache, chunked prefill, token text."""
