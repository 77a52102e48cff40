"""An example delegating agent that trusts the remote agent: one streamed send, no timeout, no retry;
whatever the stream ended with is the answer.

    CHAOSPROXY_URL=http://127.0.0.1:8800 python examples/a2a_delegate_naive.py
"""

from __future__ import annotations

import asyncio

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a_task import QUESTION, agent_url, done, streamed


async def main() -> int:
    async with httpx.AsyncClient(timeout=None) as http:  # (waits as long as the remote agent takes)
        client = await ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create_from_url(agent_url())
        task = await streamed(client, QUESTION)
        await client.close()
        return done(task)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
