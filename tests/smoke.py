"""Smoke test of an installed wheel, run outside the checkout (make wheel-check).

Not collected by pytest: it needs a fresh environment holding only the wheel.
"""

import json
import subprocess
import sys
from pathlib import Path

import harmonykit
import harmonykit.openai


def main() -> None:
    here = Path.cwd().resolve()
    assert here not in Path(harmonykit.__file__).resolve().parents or "site-packages" in harmonykit.__file__, \
        f"imported from the checkout: {harmonykit.__file__}"
    enc = harmonykit.load_harmony_encoding(harmonykit.HarmonyEncodingName.HARMONY_GPT_OSS)
    tokens = enc.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    choice = harmonykit.openai.completion_to_chat_choice(enc, tokens)
    assert choice["message"]["content"] == "Hi", choice
    cli = Path(sys.executable).parent / "harmonykit"
    out = subprocess.run([str(cli), "parse", "-"], input="<|channel|>final<|message|>Hi<|return|>\n",
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert json.loads(out)["messages"][0]["content"][0]["text"] == "Hi", out
    version = subprocess.run([sys.executable, "-m", "harmonykit", "--version"], capture_output=True, text=True,
                             check=True, timeout=120).stdout
    assert version.strip() == f"harmonykit {harmonykit.__version__}", version
    print(f"wheel smoke test passed: harmonykit {harmonykit.__version__} from {Path(harmonykit.__file__).parent}")


if __name__ == "__main__":
    main()
