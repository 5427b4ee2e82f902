"""Shared fixtures: harmonykit's encoding and the reference's (the test oracle).

The reference reads its vocabulary only from $TIKTOKEN_ENCODINGS_BASE, so the
gzip copy that bpe-openai ships is decompressed into a temporary folder before
openai_harmony is first imported.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harmonykit.vocab import export_vocabulary

_VOCAB_DIR = tempfile.mkdtemp(prefix="harmonykit-vocab-")
# The gateway's default store is a file under the user's data directory: the tests' own, here.
_DATA_DIR = tempfile.mkdtemp(prefix="harmonykit-data-")
atexit.register(shutil.rmtree, _DATA_DIR, True)
os.environ["XDG_DATA_HOME"] = _DATA_DIR
atexit.register(shutil.rmtree, _VOCAB_DIR, True)
export_vocabulary(_VOCAB_DIR)
os.environ["TIKTOKEN_ENCODINGS_BASE"] = _VOCAB_DIR

import openai_harmony  # noqa: E402
import pytest  # noqa: E402

import budget  # noqa: E402, F401  (hypothesis's profile, chosen before any test module is imported)
import harmonykit  # noqa: E402

# Golden files and wild cases: shared/ beside the checkout when it is there (it
# may hold newer cases), else the copies under tests/data (Apache-2.0 data).
DATA = Path(__file__).resolve().parent / "data"
SHARED = Path(os.environ.get("HARMONYKIT_SHARED", Path(__file__).resolve().parents[2] / "shared"))
_golden = SHARED / "reference" / "openai-harmony" / "test-data"
GOLDEN = _golden if _golden.is_dir() else DATA / "golden"
_cases = SHARED / "cases" / "wild-outputs.jsonl"
CASES = _cases if _cases.is_file() else DATA / "wild-outputs.jsonl"


@pytest.fixture(scope="session")
def enc() -> harmonykit.HarmonyEncoding:
    return harmonykit.load_harmony_encoding(harmonykit.HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="session")
def ref() -> openai_harmony.HarmonyEncoding:
    return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="session")
def vllm() -> Iterator[str]:
    """A real vLLM (tests/real) with this checkout's plugin on (``make engines`` installed the
    checkout in its venv), for the gateway and plugin tests."""
    from real.servers import vllm_server

    with vllm_server() as url:
        yield url


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """A real PostgreSQL server (tests/real/postgres.py), one for the session."""
    from real.postgres import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store test runs on both backends: a fresh SQLite file, and a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    import uuid

    import psycopg

    server = request.getfixturevalue("postgres")
    name = "t" + uuid.uuid4().hex[:12]
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + "/" + name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of real engines run last: their servers (and their CPU use) never share the machine
    with the timing-sensitive tests, and each server starts once."""
    items.sort(key=lambda item: item.get_closest_marker("real_engines") is not None)
