"""Snapshot pickles: the safety scan, the object-path builder and the pickle-to-columns VM."""
