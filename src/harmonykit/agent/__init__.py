"""The agent loop: a Responses turn that runs gpt-oss's built-in tools between generations.

``Agent`` decides which built-in calls the gateway runs, runs them (``harmonykit.tools``),
streams their items' events through the response's ``ResponsesStream``, and gives the next
prompt: the step's messages as harmony renders them, the tool's result message on the
channel the call used, and ``<|start|>assistant``. ``drive`` is the loop itself, over an
injected engine (``Generate``): no HTTP here.
"""

from .loop import Agent, Generate, Step, drive

__all__ = ["Agent", "Generate", "Step", "drive"]
