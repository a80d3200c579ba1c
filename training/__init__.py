"""The application layer: decision streams, the Lightning loop and its metrics.

``training`` imports ``gae``; ``gae`` never imports ``training`` or lightning.
"""
