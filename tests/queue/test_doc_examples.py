"""The examples a new user copies from README.md, docs/testing.md and docs/queue.md work as written.

Goal: an example that stops doing what its page says (a renamed option, a changed output
shape) fails here, not in a user's hands. Method: each example is cut out of its page by the
text that opens it, run as a user runs it (a fresh ``python`` in a temporary directory, real
storage; only the names a page leaves to the reader, such as a mailer, are supplied), and
checked against what the text around it says it does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deferq.backends import Disk

pytestmark = pytest.mark.slow  # each runs a fresh interpreter (about 0.3 s)

ROOT = Path(__file__).resolve().parents[2]


def block(page: str, opening: str, language: str = "python") -> str:
    """The one fenced block of ``language`` in ``page`` whose text contains ``opening``."""
    found: list[str] = []
    body: list[str] = []
    fence: str | None = None
    for line in (ROOT / page).read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence, body = stripped[3:], []
        elif fence is not None and stripped == "```":
            if fence == language and opening in "\n".join(body):
                found.append("\n".join(body) + "\n")
            fence = None
        elif fence is not None:
            body.append(line)
    assert len(found) == 1, f"{page}: expected one {language or 'plain'} block with {opening!r}"
    return found[0]


def run_python(code: str, cwd: Path) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEFERQ_")}
    environ["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.spec("Q-50", "Q-51")
def test_the_readme_queue_example_leaves_its_task_in_the_wal_due_in_ten_seconds(
        tmp_path: Path) -> None:
    code = block("README.md", "deferq.Queue(Disk(")
    before = int(time.time())
    run_python(code + "\nasyncio.run(main())\n", tmp_path)
    with Disk(path=tmp_path / "storage") as disk:  # stop() ran before the task was due
        [pending] = disk.pending_tasks()
    context = json.loads(pending.context)
    assert (context["task"], context["args"]) == ("send_email", ["a@example.com"])
    assert pending.publish_at is not None
    assert before + 10 <= pending.publish_at <= int(time.time()) + 10


def test_the_readme_storage_example_lists_the_task_it_dead_lettered(tmp_path: Path) -> None:
    printed = run_python(block("README.md", "with Disk(path="), tmp_path)
    assert printed.startswith("[DeadTask(") and printed.count("DeadTask(") == 1, printed
    for field in ("task_class='ChargeCard'", "attempts=21", "exception_class='RuntimeError'",
                  "exception_message='card declined'", "context=b'{\"order\": 42}'"):
        assert field in printed, printed
    with Disk(path=tmp_path / "storage") as disk:
        assert disk.pending_tasks() == []  # removed before it was dead-lettered


def test_the_testing_kit_example_passes_with_a_mailer_that_keeps_failing(
        tmp_path: Path) -> None:
    mailer = ("class Mailer:\n"
              "    async def send(self, user: str, text: str) -> None:\n"
              "        raise ConnectionError('mail server down')\n"
              "mailer = Mailer()\n")
    example = block("docs/testing.md", "def test_a_reminder_is_sent")
    name = re.search(r"^def (test_\w+)", example, flags=re.M)
    assert name is not None
    run_python(mailer + example + f"\n{name.group(1)}()\n", tmp_path)


@pytest.mark.spec("Q-26", "Q-27")
def test_dead_show_json_prints_the_shape_docs_queue_md_shows(tmp_path: Path) -> None:
    shown = block("docs/queue.md", "$ deferq dead show 1796403263-27145-1 --json", "")
    sample = json.loads(shown[shown.index("{"):])
    code = ("import asyncio, deferq\n"
            "from deferq.backends import Disk\n"
            "class SendEmail(deferq.Task, name='app.SendEmail'):\n"
            "    max_retries = 0\n"
            "    async def perform(self, to: str) -> None:\n"
            "        raise ConnectionError(f'SMTP server refused {to}')\n"
            "async def main() -> None:\n"
            "    async with deferq.Queue(Disk(path='storage')) as queue:\n"
            "        queue.defer(SendEmail, 'a@example.com')\n"
            "        await queue.wait_idle()\n"
            "    print(queue.backend.list_dead_tasks()[0].id)\n"
            "asyncio.run(main())\n")
    task_id = run_python(code, tmp_path).strip()
    real = json.loads(_deferq(tmp_path, "dead", "show", task_id, "--json"))
    assert list(real) == list(sample)
    assert list(real["context"]) == list(sample["context"])
    assert list(real["context"]["json"]) == list(sample["context"]["json"])
    for doc in (sample, real):  # the bytes are those of the compact JSON the queue stores
        stored = json.dumps(doc["context"]["json"], separators=(",", ":"))
        assert doc["context"]["bytes"] == len(stored.encode())
        assert doc["context"]["json"]["enqueued_at"] == doc["enqueued_at"]
    assert real["backtrace"][-1].endswith("in perform")
    assert sample["backtrace"][0].split("/")[-1].split(":")[0] == "executor.py"
    assert real["backtrace"][0].split("/")[-1].split(":")[0] == "executor.py"
    assert re.sub(r":\d+:", ":", real["backtrace"][0].split("/")[-1]) == re.sub(
        r":\d+:", ":", sample["backtrace"][0].split("/")[-1])


def _deferq(cwd: Path, *args: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEFERQ_")}
    environ["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run([sys.executable, "-m", "deferq", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout

