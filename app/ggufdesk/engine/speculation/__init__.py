"""Speculative decoding: drafters (prompt lookup, a draft model), acceptance evidence, adaptive draft length."""
