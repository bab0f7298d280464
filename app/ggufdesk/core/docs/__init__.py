"""Documents to chat with: files and folders read in a stream, chunked with their source, indexed per collection.

extract (file -> lines with page and line numbers), chunk (lines -> passages), walk (folders -> files,
with a note for what is skipped), store (one SQLite file per collection: FTS5 BM25 and sqlite-vec
vectors), indexer (incremental indexing with progress, ETA and cancel). Retrieval and the prompt
live in the session layer (session/docs.py).
"""
from __future__ import annotations
