"""The API must never import torch, diffusers or transformers."""

import subprocess
import sys


def test_api_app_imports_no_ml_library():
    code = (
        "import sys, services.api.app\n"
        "bad = [m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
