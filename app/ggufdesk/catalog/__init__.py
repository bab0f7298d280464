"""The model catalog's data (catalog.toml) and the script that refreshes it from the hub (refresh.py)."""
