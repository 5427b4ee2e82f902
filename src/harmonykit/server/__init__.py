"""``harmonykit serve``: an OpenAI-compatible gateway in front of vLLM, SGLang or llama.cpp server.

Needs the ``server`` extra (``pip install 'harmonykit[server]'``); the core never imports it.
"""

from .app import Gateway, create_app
from .settings import Settings
from .upstream import Upstream

__all__ = ["Gateway", "Settings", "Upstream", "create_app"]
