"""Nodes of the Ctrl-C tests: a terminal's Ctrl-C (SIGINT to the driver process) sent from
inside the map at a chosen point, so the tests depend on no timing: from the node once a
chosen row is paid, or from the resource when it is built (before the map's first row).
Each presses once per flag file (created with ``O_EXCL``), whichever process runs it
(Dask worker processes too), so a rerun of the same map never presses again."""

from __future__ import annotations

import os
import signal

import openai

from hypernodes_dist import meter, node, resource


def press_once(flag: str, driver_pid: int) -> None:
    """SIGINT to ``driver_pid``, the first time any process asks with this ``flag``."""
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(driver_pid, signal.SIGINT)


async def _paid(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=1)
    meter(cost=1.0)
    return r.choices[0].message.content


@node(output_name="label", concurrency=4)
async def paid_then_ctrl_c(text: str, llm, ctrl_c_at: str, flag: str, driver_pid: int) -> str:
    """One paid request per row; Ctrl-C once the row ``ctrl_c_at`` is paid."""
    label = await _paid(text, llm)
    if text == ctrl_c_at:
        press_once(flag, driver_pid)
    return label


@resource
def llm_pressing(base_url: str, flag: str, driver_pid: int):
    """The loopback client; building it presses Ctrl-C (before the first row is paid)."""
    press_once(flag, driver_pid)
    return openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0,
                              timeout=10.0)


@node(output_name="label", concurrency=4)
async def paid_untyped(text: str, llm_pressing):  # no annotation: the first rows fix its type
    """One paid request per row, no return annotation: the driver runs the first rows to
    fix the output type (``datasets.schema``), with ``llm_pressing``."""
    return await _paid(text, llm_pressing)
