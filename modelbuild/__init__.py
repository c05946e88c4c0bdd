"""Build the models the registry ships with, offline: tiny random test models and a trained demo.

Nothing here downloads anything. Tokenizers are trained on text that ships with the installed
packages, model weights are random from fixed seeds (tests) or trained locally (the digits demo),
and everything is saved with `save_pretrained` so pipelines load it with `local_files_only=True`.
"""

from services.worker.quiet import quiet_libraries

quiet_libraries()  # before the builders import transformers and diffusers
