"""A deterministic simulation of bookies, the metadata store and clients running the real protocol core."""
