"""The API service: REST routes, dispatch to worker queues, the joiner and the janitor.

Nothing under this package may import torch, diffusers or transformers.
"""
