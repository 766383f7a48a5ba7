"""The README's examples run as written: every ```python block, in a fresh directory, in a
fresh interpreter (what a user pasting it into a file and running it gets).

An HTML comment on the line before a block says how it runs:

- ``<!-- fixture: ... -->``: runs first, before every other block (it makes ``reviews/``);
- ``<!-- continues: ... -->``: runs after the block before it, in the same script;
- ``<!-- llm-server: ... -->``: runs with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` pointing
  at the local OpenAI-compatible server of ``hypernodes_bench.llm_server``;
- ``<!-- batch-server: ... -->``: likewise at the fake Batch API provider of
  ``hypernodes_bench.batch_server`` (Anthropic's variables too; polls every 0.05 s);
- ``<!-- no-run: reason -->``: does not run (a cluster, a bucket); a reason is required.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_MARK = re.compile(
    r"^<!--\s*(fixture|continues|llm-server|batch-server|no-run)\s*(?::\s*(.*?))?\s*-->$")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    code: str
    mark: str = ""  # fixture, continues, llm-server, no-run or ""
    why: str = ""


def blocks(text: str) -> list[Block]:
    """Every ```python block of ``text`` with the mark of the comment right before it."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = lines.index("```", i + 1)
            m = _MARK.match(lines[i - 1].strip()) if i else None
            found.append(Block(i + 1, "\n".join(lines[i + 1:end]) + "\n",
                               m.group(1) if m else "", (m.group(2) or "") if m else ""))
            i = end
        i += 1
    return found


def script_of(all_blocks: list[Block], index: int) -> str:
    """The fixtures, then the chain of blocks ``index`` continues, then the block."""
    chain = [all_blocks[index]]
    while chain[0].mark == "continues":
        chain.insert(0, all_blocks[all_blocks.index(chain[0]) - 1])
    fixtures = [b for b in all_blocks if b.mark == "fixture" and b not in chain]
    return "\n".join(b.code for b in [*fixtures, *chain])


ALL = blocks(README.read_text())
# The README's rate limits are a real key's, per minute; against the local server the
# examples run them per second: the same calls and output, without ~36 s of pacing per
# example (rate_limit's pacing is tested in tests/conformance/test_policies.py).
PER_MINUTE, PER_SECOND = '/minute"', '/second"'
RUNNABLE = [i for i, b in enumerate(ALL) if b.mark not in ("no-run", "fixture")]


def test_the_readme_has_examples_and_says_why_one_does_not_run():
    assert len(RUNNABLE) >= 8
    skipped = [b for b in ALL if b.mark == "no-run"]
    assert all(b.why for b in skipped), [b.line for b in skipped if not b.why]
    assert len(skipped) <= 2, [b.line for b in skipped]  # keep the examples runnable


@pytest.mark.parametrize("index", RUNNABLE, ids=[f"line{ALL[i].line}" for i in RUNNABLE])
def test_readme_example_runs(index, tmp_path, llm_servers):
    block = ALL[index]
    path = tmp_path / "example.py"
    script = script_of(ALL, index)
    if block.mark == "llm-server":
        script = script.replace(PER_MINUTE, PER_SECOND)
    path.write_text(script)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("OPENAI_API_KEY", None)  # the examples run without a key (local servers)
    if block.mark == "llm-server":  # the test process's shared server (no example reads its counts)
        server = llm_servers()
        env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="local-server")
        done = _run(path, env)
    elif block.mark == "batch-server":
        from hypernodes_bench.batch_server import BatchServer

        with BatchServer(delay=0.2) as fake:
            env.update(OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="local-server",
                       ANTHROPIC_BASE_URL=fake.anthropic_base_url,
                       ANTHROPIC_API_KEY="local-server", HYPERNODES_BATCH_POLL="0.05")
            done = _run(path, env)
    else:
        done = _run(path, env)
    assert done.returncode == 0, (
        f"README.md line {block.line}: the example failed\n{done.stdout[-2000:]}\n"
        f"{done.stderr[-4000:]}")


def _run(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(path)], cwd=path.parent, env=env,
                          capture_output=True, text=True, timeout=240)
