"""Wiring of stage functions into doit tasks, the run cache and build-dir locking.

Only this package knows about doit and the cache; stage functions elsewhere take
artifacts and config and write into the folder they are given.
"""
