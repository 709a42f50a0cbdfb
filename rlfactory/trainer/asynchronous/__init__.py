"""The asynchronous engine: a generator process decodes while the trainer updates.

Imports nothing on its own; callers name the module they need (loop, staleness, launch, ...).
"""
