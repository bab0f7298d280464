"""Structured output: JSON schema and tool grammars, and the per-request constraint built from them."""
